// ThreadPool: every index visited exactly once, ranges contiguous, repeated dispatch is stable, pinning leaves the
// caller's CPUs alone. SpinPolicy: the window rule, and a thread pinned to one core beside a busy thread reads as
// contended.
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/spin_policy.h"
#include "tests/test_skip.h"

#include <sched.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <stdexcept>
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

TEST_CASE("parallel_chunks visits every index once, in chunks of the size asked, each thread's in order") {
    CHECK(chunk_for(192, 2) == 48);
    CHECK(chunk_for(192, 2, 4) == 24);
    CHECK(chunk_for(3, 2) == 1);
    CHECK(chunk_for(100, 3, 4, 16) == 16);
    for (int threads : {1, 2, 4}) {
        ThreadPool pool(threads, false);
        for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(64), int64_t(20000)}) {
            std::vector<std::atomic<int>> hits(10007);
            std::vector<std::vector<std::pair<int64_t, int64_t>>> calls{size_t(threads)};
            for (int rep = 0; rep < 20; ++rep) {
                for (auto& c : calls) c.clear();
                pool.parallel_chunks(int64_t(hits.size()), chunk, [&](int64_t lo, int64_t hi, int t) {
                    calls[size_t(t)].push_back({lo, hi});
                    for (int64_t i = lo; i < hi; ++i) hits[size_t(i)].fetch_add(1);
                });
                if (threads == 1 || chunk >= int64_t(hits.size())) {  // one call over everything, on the caller
                    CHECK(calls[0] == std::vector<std::pair<int64_t, int64_t>>{{0, int64_t(hits.size())}});
                    continue;
                }
                for (auto& c : calls)
                    for (size_t i = 0; i < c.size(); ++i) {
                        CHECK(c[i].first % chunk == 0);  // chunks start on their grid
                        CHECK(c[i].second - c[i].first == std::min<int64_t>(chunk, int64_t(hits.size()) - c[i].first));
                        if (i > 0) CHECK(c[i].first > c[i - 1].first);
                    }
            }
            for (auto& h : hits) CHECK(h.load() == 20);
        }
        int calls0 = 0;
        pool.parallel_chunks(0, 4, [&](int64_t, int64_t, int) { ++calls0; });
        CHECK(calls0 == 0);
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

TEST_CASE("ops back to back on more threads than cores: late workers join a later op or none, each piece runs once") {
    // Workers here often wake after the caller has claimed every piece and closed the op (it does not wait for
    // them), and enter whichever op is open when they do: mixed op kinds, each visiting every index once and
    // run_on_all every thread once.
    ThreadPool pool(3, false);
    std::vector<int> hits(97, 0);
    std::vector<std::atomic<int>> ran(3);
    for (int rep = 0; rep < 300; ++rep) {
        std::fill(hits.begin(), hits.end(), 0);
        if (rep % 3 == 0)
            pool.parallel_for(int64_t(hits.size()), [&](int64_t lo, int64_t hi, int) {
                for (int64_t i = lo; i < hi; ++i) ++hits[size_t(i)];
            });
        else if (rep % 3 == 1)
            pool.parallel_chunks(int64_t(hits.size()), 5, [&](int64_t lo, int64_t hi, int) {
                for (int64_t i = lo; i < hi; ++i) ++hits[size_t(i)];
            });
        else
            pool.run_on_all([&](int t) {
                ran[size_t(t)].fetch_add(1);
                for (int64_t i = t; i < int64_t(hits.size()); i += 3) ++hits[size_t(i)];
            });
        CHECK(std::count(hits.begin(), hits.end(), 1) == int64_t(hits.size()));
    }
    for (auto& r : ran) CHECK(r.load() == 100);
}

TEST_CASE("a piece that throws on the caller: the op ends (no worker left in it) and the pool keeps working") {
    ThreadPool pool(2, false);
    for (int rep = 0; rep < 50; ++rep) {
        // A worker's piece waits (bounded) until the caller has one: a worker that wakes first could otherwise
        // claim all 16 pieces while the caller is descheduled (CI, a busy machine: the caller then ran none and
        // nothing threw).
        std::atomic<bool> caller_in{false};
        CHECK_THROWS_AS(pool.parallel_chunks(64, 4,
                                             [&](int64_t, int64_t, int t) {
                                                 if (t == 0) {
                                                     caller_in = true;
                                                     throw std::runtime_error("piece failed");
                                                 }
                                                 for (int i = 0; i < 1000000 && !caller_in.load(); ++i)
                                                     std::this_thread::yield();
                                             }),
                        std::runtime_error);
        std::vector<int> hits(64, 0);
        pool.parallel_for(64, [&](int64_t lo, int64_t hi, int) {
            for (int64_t i = lo; i < hi; ++i) ++hits[size_t(i)];
        });
        CHECK(std::count(hits.begin(), hits.end(), 1) == 64);
    }
}

TEST_CASE("pinned pools leave the caller's CPUs alone: a second pool's worker gets the next core, not the caller's") {
    cpu_set_t before;
    REQUIRE(sched_getaffinity(0, sizeof(before), &before) == 0);
    if (CPU_COUNT(&before) < 2) LATTICE_SKIP("this process may run on one CPU only: nothing to pin apart");
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &before)) cpus.push_back(c);
    auto caller_unchanged = [&] {
        cpu_set_t now;
        REQUIRE(sched_getaffinity(0, sizeof(now), &now) == 0);
        return CPU_EQUAL(&now, &before);
    };
    ThreadPool first(2, true);
    CHECK(caller_unchanged());
    ThreadPool second(2, true);  // the draft model's pool beside the target's, or a benchmark's before the model's
    CHECK(caller_unchanged());
    cpu_set_t worker{};
    int worker_cpus = 0;
    second.run_on_all([&](int t) {
        if (t != 1) return;
        sched_getaffinity(0, sizeof(worker), &worker);
        worker_cpus = CPU_COUNT(&worker);
    });
    CHECK(worker_cpus == 1);
    CHECK(CPU_ISSET(cpus[1], &worker));
}

TEST_CASE("SpinPolicy: long spins until a window shows involuntary switches, short ones while they go on") {
    SpinPolicy p(20000, 1000);
    CHECK(p.current() == 20000);
    p.observe(7);  // the first reading only sets the base
    CHECK(p.current() == 20000);
    p.observe(7);  // a window without preemption
    CHECK(p.current() == 20000);
    p.observe(9);  // preempted twice: contended
    CHECK(p.contended());
    CHECK(p.current() == 1000);
    p.observe(10);
    CHECK(p.current() == 1000);
    p.observe(10);  // a quiet window: long spins again
    CHECK(p.current() == 20000);
}

TEST_CASE("SpinPolicy: a thread sharing its core with a busy thread reads as contended") {
    cpu_set_t saved;
    REQUIRE(sched_getaffinity(0, sizeof(saved), &saved) == 0);
    int cpu = 0;
    while (!CPU_ISSET(cpu, &saved)) ++cpu;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    std::atomic<bool> stop{false};
    std::thread hog([&] {
        sched_setaffinity(0, sizeof(one), &one);
        while (!stop.load(std::memory_order_relaxed)) {
        }
    });
    REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
    SpinPolicy p(5, 3);
    p.observe(SpinPolicy::involuntary_switches());
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100)) {
    }
    p.observe(SpinPolicy::involuntary_switches());
    stop = true;
    hog.join();
    sched_setaffinity(0, sizeof(saved), &saved);
    CHECK(p.contended());
    CHECK(p.current() == 3);
}
