// map_huge / map_pages / AlignedAllocator64: 2 MiB aligned, zeroed, writable to the last byte, and
// (where the kernel's THP mode is "always" or "madvise") eligible for huge pages in /proc/self/smaps
// unless map_pages was told not to be; small allocations stay on the heap allocator's alignment.
// The eligibility cases ("[thp]" in their names) have a ctest entry of their own
// (test_kernels_cpu_thp): where THP is off, or smaps has no THPeligible field, they cannot check
// anything and report SKIP with that reason, never a pass.
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/int8_gemm.h"
#include "tests/test_skip.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

using namespace lattice;

namespace {

// "always", "madvise" or "never" (the bracketed word), or "" where the kernel has no THP.
std::string thp_mode() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t a = all.find('['), b = all.find(']');
    return a == std::string::npos || b == std::string::npos ? "" : all.substr(a + 1, b - a - 1);
}

// The THPeligible field of the smaps entry whose range starts at p: 1, 0, or -1 when not found.
int thp_eligible(const void* p) {
    std::ifstream f("/proc/self/smaps");
    std::string line;
    bool in_range = false;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
    while (std::getline(f, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < 17) {
            in_range = addr >= lo && addr < hi;
            continue;
        }
        if (in_range && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
    }
    return -1;
}

}  // namespace

TEST_CASE("map_huge: aligned, zeroed, writable, released") {
    for (size_t bytes : {size_t(1), size_t(4095), kHugePageBytes - 1, kHugePageBytes, 3 * kHugePageBytes + 12345}) {
        CAPTURE(bytes);
        auto* p = static_cast<unsigned char*>(map_huge(bytes));
        REQUIRE(p != nullptr);
        CHECK(reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0);
        CHECK(p[0] == 0);
        CHECK(p[bytes - 1] == 0);
        CHECK(p[bytes / 2] == 0);
        p[0] = 1;
        p[bytes - 1] = 2;
        CHECK(p[bytes - 1] == 2);
        unmap_huge(p, bytes);
    }
}

TEST_CASE("[thp] map_huge asks for huge pages where the kernel offers them") {
    const std::string mode = thp_mode();
    if (mode != "always" && mode != "madvise")
        LATTICE_SKIP("THP mode '" << mode << "' (/sys/kernel/mm/transparent_hugepage/enabled): huge pages not offered");
    const size_t bytes = 4 * kHugePageBytes;
    auto* p = static_cast<unsigned char*>(map_huge(bytes));
    REQUIRE(p != nullptr);
    const int eligible = thp_eligible(p);
    unmap_huge(p, bytes);
    if (eligible < 0) LATTICE_SKIP("this kernel's /proc/self/smaps has no THPeligible field");
    CHECK(eligible == 1);  // in "madvise" mode only MADV_HUGEPAGE makes it 1
}

TEST_CASE("map_pages(huge = false): zeroed and writable (the KV cache)") {
    const size_t bytes = 4 * kHugePageBytes + 100;
    auto* p = static_cast<unsigned char*>(map_pages(bytes, false));
    REQUIRE(p != nullptr);
    CHECK(p[0] == 0);
    CHECK(p[bytes - 1] == 0);
    p[kHugePageBytes + 5] = 7;  // one write: a 4 KiB page materializes, not a 2 MiB one
    CHECK(p[kHugePageBytes + 5] == 7);
    CHECK(p[kHugePageBytes + 4096] == 0);
    p[bytes - 1] = 9;
    CHECK(p[bytes - 1] == 9);
    unmap_huge(p, bytes);
}

TEST_CASE("[thp] map_pages(huge = false) is kept out of huge pages even where THP is on") {
    const std::string mode = thp_mode();
    if (mode != "always" && mode != "madvise")
        LATTICE_SKIP("THP mode '" << mode << "' (/sys/kernel/mm/transparent_hugepage/enabled): nothing to keep out of");
    const size_t bytes = 4 * kHugePageBytes + 100;
    auto* p = static_cast<unsigned char*>(map_pages(bytes, false));
    REQUIRE(p != nullptr);
    p[kHugePageBytes + 5] = 7;
    const int eligible = thp_eligible(p);
    unmap_huge(p, bytes);
    if (eligible < 0) LATTICE_SKIP("this kernel's /proc/self/smaps has no THPeligible field");
    CHECK(eligible == 0);  // MADV_NOHUGEPAGE, even in "always" mode
}

TEST_CASE("AlignedAllocator64: large vectors on huge-page mappings, small ones on the heap") {
    std::vector<int8_t, AlignedAllocator64<int8_t>> big(kHugePageBytes + 7, int8_t(3));
    CHECK(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes == 0);
    CHECK(big.back() == 3);
    big.resize(3 * kHugePageBytes, int8_t(5));  // reallocation moves across mappings and frees the old one
    CHECK(big[kHugePageBytes] == 3);
    CHECK(big.back() == 5);
    std::vector<float, AlignedAllocator64<float>> small(100, 1.0f);
    CHECK(reinterpret_cast<uintptr_t>(small.data()) % 64 == 0);
    CHECK(small[99] == 1.0f);
}
