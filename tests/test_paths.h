// Paths every test shares: the reference data in ../shared (LATTICE_SHARED_DIR) and the built-in
// default model that scripts/setup.sh fetches into models/. Both are always present where the
// suite runs (CI runs setup first), so a missing file fails the test that needs it: it never skips.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

namespace lattice::test {

inline std::string default_model_file() {
    return std::string(LATTICE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline std::string shared_file(const std::string& rel) { return std::string(LATTICE_SHARED_DIR) + "/" + rel; }

}  // namespace lattice::test

// Fails (not skips) when a file the test needs is missing, saying how to get it.
#define REQUIRE_FILE(path) \
    REQUIRE_MESSAGE(std::filesystem::exists(path), (path) << " is missing: scripts/setup.sh fetches the default model")
