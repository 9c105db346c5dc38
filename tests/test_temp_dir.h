// Test helper: a fresh folder under the system's temp directory (mkdtemp: unique across concurrent test
// processes), removed with everything in it when the object goes.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace lattice::testing {

struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& stem = "lattice_test") {
        std::string t = (std::filesystem::temp_directory_path() / (stem + "_XXXXXX")).string();
        REQUIRE(::mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace lattice::testing
