// Test helper: error_of(fn), the message of the lattice::Error that fn throws. A test failure when fn
// throws none (FAIL_CHECK, so the case goes on), and then "(no error)", which no check of a message matches.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "base/error.h"

namespace lattice::testing {

inline std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    FAIL_CHECK("expected a lattice::Error");
    return "(no error)";
}

}  // namespace lattice::testing
