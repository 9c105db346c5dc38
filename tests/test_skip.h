// A doctest case whose check cannot be made here (transparent huge pages off, RSS under
// AddressSanitizer, ...) ends with LATTICE_SKIP(reason): the case stops, "SKIP: <case>: <reason>" is
// printed, and the test main exits 77 so that CTest reports the run Skipped, never Passed.
// A skip must not hide passes: the main fails a run in which a case skipped and another case ran to
// the end, so a case that may skip gets a ctest entry of its own (lattice_test_run with
// ARGS --test-case=..., and --test-case-exclude=... on the binary's main entry; tests/CMakeLists.txt).
// Failed checks before the skip still fail the run.
#pragma once

#include <sstream>
#include <string>

namespace lattice::test {
// Records the skip of the running test case (defined in tests/doctest_main.cpp).
void record_skip(const std::string& reason);
}  // namespace lattice::test

#define LATTICE_SKIP(reason)                       \
    do {                                           \
        std::ostringstream lattice_skip_os_;       \
        lattice_skip_os_ << reason;                \
        ::lattice::test::record_skip(lattice_skip_os_.str()); \
        return;                                    \
    } while (0)
