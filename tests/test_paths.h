// Paths every test shares: the reference data in ../shared (LATTICE_SHARED_DIR) and the built-in
// default model that scripts/setup.sh fetches into models/. Both are always present where the
// suite runs (CI runs setup first), so a missing file fails the test that needs it: it never skips.
// The folders are compiled in; the environment variables LATTICE_SHARED_DIR and LATTICE_SOURCE_DIR
// override them at run time, for test binaries built in one place and run in another (the binaries
// that benchmarks/gpu/check.sh carries to the GPU machine).
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lattice::test {

inline std::string env_or(const char* name, const char* compiled) {
    const char* e = std::getenv(name);
    return e && *e ? std::string(e) : std::string(compiled);
}
inline std::string shared_dir() {
    return env_or("LATTICE_SHARED_DIR", LATTICE_SHARED_DIR);
}
inline std::string source_dir() {
    return env_or("LATTICE_SOURCE_DIR", LATTICE_SOURCE_DIR);
}

inline std::string default_model_file() {
    return source_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline std::string shared_file(const std::string& rel) {
    return shared_dir() + "/" + rel;
}

}  // namespace lattice::test

// Fails (not skips) when a file the test needs is missing, saying how to get it.
#define REQUIRE_FILE(path)                                                                                        \
    REQUIRE_MESSAGE(std::filesystem::exists(path), (path) << " is missing: scripts/setup.sh fetches the default " \
                                                             "model")
