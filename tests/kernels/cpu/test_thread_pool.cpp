// ThreadPool: every index visited exactly once, ranges contiguous, repeated dispatch is stable.
#include "kernels/cpu/thread_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <vector>

using namespace lattice;

TEST_CASE("split_range covers [0, n) contiguously with grain alignment") {
    for (int64_t n : {0, 1, 7, 64, 1000, 1001}) {
        for (int nt : {1, 2, 3, 8}) {
            int64_t expect = 0;
            for (int t = 0; t < nt; ++t) {
                auto [lo, hi] = split_range(n, t, nt, 16);
                CHECK(lo == expect);
                CHECK(hi >= lo);
                if (hi < n) CHECK(hi % 16 == 0);
                expect = hi;
            }
            CHECK(expect == n);
        }
    }
}

TEST_CASE("parallel_for visits every index once, many times over") {
    for (int threads : {1, 2, 4}) {
        ThreadPool pool(threads, false);
        std::vector<std::atomic<int>> hits(10007);
        for (int rep = 0; rep < 200; ++rep)
            pool.parallel_for(int64_t(hits.size()), [&](int64_t lo, int64_t hi, int) {
                for (int64_t i = lo; i < hi; ++i) hits[size_t(i)].fetch_add(1);
            });
        for (auto& h : hits) CHECK(h.load() == 200);
    }
}
