// MpiComm under mpirun -np 2/3/4: every collective for f32 / i32 (and f16 / bf16 sums) at odd sizes
// against exact expected values, poisoned outputs, in-place forms, send/recv, sub-communicators,
// argument errors, and bitwise agreement of float all-reduce results across ranks.
// Data are small multiples of 1/4 so every f32 sum is exact and compared with ==.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <chrono>

#include "parallel/mpi_comm.h"

using namespace lattice;

namespace {

const int64_t kSizes[] = {1, 3, 1000, (1 << 18) + 7};

MpiComm& world() {
    static std::unique_ptr<MpiComm> w = [] {
        WaitPolicy p;
        p.timeout_s = 20.0;
        return MpiComm::world(p, "test_world");
    }();
    return *w;
}

// Value of element i on rank r: non-zero, sign-varying, exact in f32 and in bf16/f16 sums below.
float fval(int r, int64_t i) {
    return float((r + 1) * (int(i % 29) - 14 + (i % 29 >= 14 ? 1 : 0))) * 0.25f;
}
int32_t ival(int r, int64_t i) {
    return int32_t(r * 1000003 + i * 7 - 5);
}

View vf(std::vector<float>& v) {
    return View::contiguous(v.data(), DType::kF32, {int64_t(v.size())});
}
View vi(std::vector<int32_t>& v) {
    return View::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
}

}  // namespace

TEST_CASE("all_reduce_sum f32 / i32 at odd sizes") {
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    REQUIRE(n >= 2);
    for (int64_t len : kSizes) {
        std::vector<float> f(static_cast<size_t>(len));
        std::vector<int32_t> x(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) {
            f[size_t(i)] = fval(me, i);
            x[size_t(i)] = ival(me, i);
        }
        c.all_reduce_sum(vf(f));
        c.all_reduce_sum(vi(x));
        int64_t bad_f = 0, bad_i = 0;
        for (int64_t i = 0; i < len; ++i) {
            float ef = 0;
            int64_t ei = 0;
            for (int r = 0; r < n; ++r) {
                ef += fval(r, i);
                ei += ival(r, i);
            }
            bad_f += f[size_t(i)] != ef;
            bad_i += x[size_t(i)] != int32_t(ei);
        }
        CHECK_MESSAGE(bad_f == 0, "len ", len);
        CHECK_MESSAGE(bad_i == 0, "len ", len);
        CHECK(f[0] != 0.0f);
    }
}

TEST_CASE("all_reduce_sum of random f32 agrees bitwise on every rank and matches a double sum") {
    MpiComm& c = world();
    const int64_t len = 4099;
    std::vector<std::vector<float>> all(size_t(c.size()));
    for (int r = 0; r < c.size(); ++r) {
        std::mt19937 g(1234u + unsigned(r));
        std::uniform_real_distribution<float> d(-1.0f, 1.0f);
        for (int64_t i = 0; i < len; ++i) all[size_t(r)].push_back(d(g));
    }
    std::vector<float> mine = all[size_t(c.rank())];
    c.all_reduce_sum(vf(mine));
    double max_err = 0;
    for (int64_t i = 0; i < len; ++i) {
        double e = 0;
        for (int r = 0; r < c.size(); ++r) e += all[size_t(r)][size_t(i)];
        max_err = std::max(max_err, std::fabs(double(mine[size_t(i)]) - e));
    }
    CHECK(max_err < 1e-5);
    std::vector<float> root = mine;
    c.broadcast(vf(root), 0);
    CHECK(std::memcmp(root.data(), mine.data(), mine.size() * 4) == 0);
}

TEST_CASE("all_reduce_sum f16 / bf16 sums in f32 and rounds once") {
    MpiComm& c = world();
    for (DType t : {DType::kF16, DType::kBF16}) {
        const int64_t len = 1001;
        std::vector<uint16_t> h(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) {
            float v = fval(c.rank(), i);
            h[size_t(i)] = t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
        }
        c.all_reduce_sum(View::contiguous(h.data(), t, {len}));
        int64_t bad = 0;
        for (int64_t i = 0; i < len; ++i) {
            float e = 0;
            for (int r = 0; r < c.size(); ++r) e += fval(r, i);
            float got = t == DType::kF16 ? f16_to_f32(h[size_t(i)]) : bf16_to_f32(h[size_t(i)]);
            bad += got != e;
        }
        CHECK_MESSAGE(bad == 0, dtype_name(t));
    }
}

TEST_CASE("all_gather f32 / i32, poisoned output, and the in-place form") {
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    for (int64_t len : kSizes) {
        std::vector<float> in(static_cast<size_t>(len)), out(size_t(len * n), std::numeric_limits<float>::quiet_NaN());
        std::vector<int32_t> ii(static_cast<size_t>(len)), io(size_t(len * n), int32_t(0xdeadbeef));
        for (int64_t i = 0; i < len; ++i) {
            in[size_t(i)] = fval(me, i);
            ii[size_t(i)] = ival(me, i);
        }
        c.all_gather(vf(out), vf(in));
        c.all_gather(vi(io), vi(ii));
        int64_t bad = 0;
        for (int r = 0; r < n; ++r)
            for (int64_t i = 0; i < len; ++i) {
                bad += out[size_t(r * len + i)] != fval(r, i);
                bad += io[size_t(r * len + i)] != ival(r, i);
            }
        CHECK_MESSAGE(bad == 0, "len ", len);
        // In place: this rank's input already sits in its slice of the output.
        std::vector<int32_t> inplace(size_t(len * n), int32_t(0xdeadbeef));
        for (int64_t i = 0; i < len; ++i) inplace[size_t(me * len + i)] = ival(me, i);
        c.all_gather(vi(inplace), View::contiguous(inplace.data() + me * len, DType::kI32, {len}));
        bad = 0;
        for (int r = 0; r < n; ++r)
            for (int64_t i = 0; i < len; ++i) bad += inplace[size_t(r * len + i)] != ival(r, i);
        CHECK_MESSAGE(bad == 0, "in place, len ", len);
    }
}

TEST_CASE("reduce_scatter_sum f32 / i32 / bf16 at odd sizes") {
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    for (int64_t len : kSizes) {
        std::vector<float> in(size_t(len * n)), out(size_t(len), std::numeric_limits<float>::quiet_NaN());
        std::vector<int32_t> ii(size_t(len * n)), io(size_t(len), int32_t(0xdeadbeef));
        for (int64_t i = 0; i < len * n; ++i) {
            in[size_t(i)] = fval(me, i);
            ii[size_t(i)] = ival(me, i);
        }
        c.reduce_scatter_sum(vf(out), vf(in));
        c.reduce_scatter_sum(vi(io), vi(ii));
        int64_t bad = 0;
        for (int64_t i = 0; i < len; ++i) {
            const int64_t g = me * len + i;
            float ef = 0;
            int64_t ei = 0;
            for (int r = 0; r < n; ++r) {
                ef += fval(r, g);
                ei += ival(r, g);
            }
            bad += out[size_t(i)] != ef;
            bad += io[size_t(i)] != int32_t(ei);
        }
        CHECK_MESSAGE(bad == 0, "len ", len);
    }
    const int64_t len = 37;
    std::vector<uint16_t> in(size_t(len * n)), out(size_t(len), 0xffff);
    for (int64_t i = 0; i < len * n; ++i) in[size_t(i)] = f32_to_bf16(fval(me, i));
    c.reduce_scatter_sum(View::contiguous(out.data(), DType::kBF16, {len}),
                         View::contiguous(in.data(), DType::kBF16, {len * n}));
    int64_t bad = 0;
    for (int64_t i = 0; i < len; ++i) {
        float e = 0;
        for (int r = 0; r < n; ++r) e += fval(r, me * len + i);
        bad += bf16_to_f32(out[size_t(i)]) != e;
    }
    CHECK(bad == 0);
}

TEST_CASE("reduce_scatter_sum with out aliasing the start of in (staged copy)") {
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    const int64_t len = 1001;
    std::vector<int32_t> buf(size_t(len * n));
    for (int64_t i = 0; i < len * n; ++i) buf[size_t(i)] = ival(me, i);
    c.reduce_scatter_sum(View::contiguous(buf.data(), DType::kI32, {len}), vi(buf));
    int64_t bad = 0;
    for (int64_t i = 0; i < len; ++i) {
        int64_t e = 0;
        for (int r = 0; r < n; ++r) e += ival(r, me * len + i);
        bad += buf[size_t(i)] != int32_t(e);
    }
    CHECK(bad == 0);
}

TEST_CASE("broadcast from every root") {
    MpiComm& c = world();
    for (int root = 0; root < c.size(); ++root) {
        for (int64_t len : kSizes) {
            std::vector<int32_t> x(size_t(len), int32_t(0xdeadbeef));
            if (c.rank() == root)
                for (int64_t i = 0; i < len; ++i) x[size_t(i)] = ival(root, i);
            c.broadcast(vi(x), root);
            int64_t bad = 0;
            for (int64_t i = 0; i < len; ++i) bad += x[size_t(i)] != ival(root, i);
            CHECK_MESSAGE(bad == 0, "root ", root, " len ", len);
        }
    }
}

TEST_CASE("send / recv around a ring (even ranks send first, so large messages cannot deadlock)") {
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (int64_t len : kSizes) {
        std::vector<float> out(static_cast<size_t>(len)), in(size_t(len), std::numeric_limits<float>::quiet_NaN());
        for (int64_t i = 0; i < len; ++i) out[size_t(i)] = fval(me, i);
        if (me % 2 == 0) {
            c.send(vf(out), next);
            c.recv(vf(in), prev);
        } else {
            c.recv(vf(in), prev);
            c.send(vf(out), next);
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < len; ++i) bad += in[size_t(i)] != fval(prev, i);
        CHECK_MESSAGE(bad == 0, "len ", len);
    }
}

TEST_CASE("recv of a shorter message than expected is an Error naming the sender") {
    auto c = world().split(0, world().rank(), "short_recv");
    REQUIRE(c);
    std::vector<float> buf(12, 1.0f);
    if (c->rank() == 0) c->send(View::contiguous(buf.data(), DType::kF32, {10}), 1);
    if (c->rank() == 1) {
        try {
            c->recv(View::contiguous(buf.data(), DType::kF32, {12}), 0);
            FAIL("short message accepted");
        } catch (const Error& e) {
            std::string m = e.what();
            CHECK(m.find("got a message of 40 bytes, expected 48") != std::string::npos);
            CHECK(m.find("rank 0") != std::string::npos);
        }
    }
    world().barrier();
}

TEST_CASE("split: parity groups reduce over their own members only") {
    MpiComm& w = world();
    auto g = w.split(w.rank() % 2, w.rank(), fmt::format("parity{}", w.rank() % 2));
    REQUIRE(g);
    CHECK(g->size() == (w.size() + 1 - w.rank() % 2) / 2);
    CHECK(g->rank() == w.rank() / 2);
    CHECK(g->world_rank_of(g->rank()) == w.rank());
    std::vector<int32_t> x(5, w.rank() + 1);
    g->all_reduce_sum(vi(x));
    int32_t e = 0;
    for (int r = w.rank() % 2; r < w.size(); r += 2) e += r + 1;
    CHECK(x[4] == e);
    // color < 0: no group.
    auto none = w.split(w.rank() == 0 ? -1 : 0, w.rank(), "all_but_0");
    CHECK((w.rank() == 0) == (none == nullptr));
    if (none) CHECK(none->size() == w.size() - 1);
}

TEST_CASE("argument errors throw before any communication and leave the communicator usable") {
    MpiComm& c = world();
    std::vector<float> f(8);
    std::vector<int8_t> b(8);
    View dev = vf(f);
    dev.device = Device::kCuda;
    CHECK_THROWS_WITH_AS(c.all_reduce_sum(dev), doctest::Contains("device memory"), Error);
    CHECK_THROWS_WITH_AS(c.all_reduce_sum(View::contiguous(b.data(), DType::kI8, {8})),
                         doctest::Contains("dtype i8 not supported"), Error);
    View strided = View::contiguous(f.data(), DType::kF32, {4, 2});
    strided.strides[0] = 1;
    strided.strides[1] = 4;
    CHECK_THROWS_WITH_AS(c.broadcast(strided, 0), doctest::Contains("not contiguous"), Error);
    CHECK_THROWS_WITH_AS(c.broadcast(vf(f), c.size()), doctest::Contains("root"), Error);
    CHECK_THROWS_WITH_AS(c.send(vf(f), c.rank()), doctest::Contains("invalid peer"), Error);
    CHECK_THROWS_WITH_AS(c.recv(vf(f), -1), doctest::Contains("invalid peer"), Error);
    std::vector<float> small(8 * size_t(c.size()) - 1);
    CHECK_THROWS_WITH_AS(c.all_gather(vf(small), vf(f)), doctest::Contains("must hold"), Error);
    CHECK_THROWS_WITH_AS(c.reduce_scatter_sum(vf(f), vf(small)), doctest::Contains("must hold"), Error);
    CHECK_FALSE(c.broken());
    c.barrier();
    std::vector<int32_t> one(1, 1);
    c.all_reduce_sum(vi(one));
    CHECK(one[0] == c.size());
}

TEST_CASE("buffered sends return at once, copy the data, and keep at most send_buffers in flight") {
    WaitPolicy p;
    p.timeout_s = 20.0;
    p.send_buffers = 2;
    MPI_Comm d = MPI_COMM_NULL;
    MPI_Comm_dup(world().handle(), &d);
    auto b = std::make_unique<MpiComm>(d, "buffered", p);  // takes ownership of d
    const int64_t len = 1 << 18;                           // 1 MB: far above the eager limit
    using Clock = std::chrono::steady_clock;
    if (b->rank() == 0) {
        std::vector<float> x(static_cast<size_t>(len));
        auto t0 = Clock::now();
        for (int m = 0; m < 2; ++m) {
            std::fill(x.begin(), x.end(), float(m + 1));
            b->send(vf(x), 1);
        }
        std::fill(x.begin(), x.end(), -7.0f);  // must not reach the receiver
        const double two = std::chrono::duration<double>(Clock::now() - t0).count();
        CHECK(b->sends_in_flight() == 2);
        CHECK(two < 0.3);  // the receiver sleeps 0.6 s: these did not wait for it
        std::fill(x.begin(), x.end(), 3.0f);
        b->send(vf(x), 1);  // third: waits until the receiver drains the first
        const double three = std::chrono::duration<double>(Clock::now() - t0).count();
        CHECK(three > 0.4);
        b->barrier();  // everything delivered
        CHECK(b->sends_in_flight() == 0);
    } else if (b->rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        for (int m = 0; m < 3; ++m) {
            std::vector<float> y(static_cast<size_t>(len), std::numeric_limits<float>::quiet_NaN());
            b->recv(vf(y), 0);
            int64_t bad = 0;
            for (float v : y) bad += v != float(m + 1);
            CHECK_MESSAGE(bad == 0, "message ", m);
        }
        b->barrier();
    } else {
        b->barrier();
    }
}

TEST_CASE("buffered sends: every rank sends around the ring first, then receives (no deadlock)") {
    MpiComm& c = world();  // default policy: 4 send buffers
    const int n = c.size(), me = c.rank();
    const int64_t len = (1 << 18) + 3;
    std::vector<float> out(static_cast<size_t>(len)),
        in(static_cast<size_t>(len), std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < len; ++i) out[size_t(i)] = fval(me, i);
    c.send(vf(out), (me + 1) % n);
    c.recv(vf(in), (me + n - 1) % n);
    int64_t bad = 0;
    for (int64_t i = 0; i < len; ++i) bad += in[size_t(i)] != fval((me + n - 1) % n, i);
    CHECK(bad == 0);
    c.barrier();
    CHECK(c.sends_in_flight() == 0);
}

TEST_CASE("chunked broadcast / send / recv (max_chunk_bytes 1000) at sizes around the chunk") {
    WaitPolicy p;
    p.timeout_s = 20.0;
    p.max_chunk_bytes = 1000;
    MPI_Comm d = MPI_COMM_NULL;
    MPI_Comm_dup(world().handle(), &d);
    MpiComm c(d, "chunked", p);
    const int n = c.size(), me = c.rank();
    for (int64_t len :
         {int64_t(0), int64_t(1), int64_t(249), int64_t(250), int64_t(251), int64_t(1000), int64_t(65543)}) {
        std::vector<int32_t> x(static_cast<size_t>(len), int32_t(0xdeadbeef));
        if (me == n - 1)
            for (int64_t i = 0; i < len; ++i) x[size_t(i)] = ival(7, i);
        c.broadcast(vi(x), n - 1);
        int64_t bad = 0;
        for (int64_t i = 0; i < len; ++i) bad += x[size_t(i)] != ival(7, i);
        CHECK_MESSAGE(bad == 0, "broadcast len ", len);
        // 0 -> 1 point to point.
        if (me <= 1) {
            std::vector<int32_t> y(static_cast<size_t>(len), int32_t(0xdeadbeef));
            if (me == 0) {
                for (int64_t i = 0; i < len; ++i) y[size_t(i)] = ival(3, i);
                c.send(vi(y), 1);
            } else {
                c.recv(vi(y), 0);
                bad = 0;
                for (int64_t i = 0; i < len; ++i) bad += y[size_t(i)] != ival(3, i);
                CHECK_MESSAGE(bad == 0, "send/recv len ", len);
            }
        }
    }
    c.barrier();
}

TEST_CASE("chunked recv of a message of another size fails with both sizes named") {
    WaitPolicy p;
    p.timeout_s = 20.0;
    p.max_chunk_bytes = 1000;
    MPI_Comm d = MPI_COMM_NULL;
    MPI_Comm_dup(world().handle(), &d);
    auto c = std::make_unique<MpiComm>(d, "chunk_mismatch", p);
    std::vector<int32_t> x(625, 5);  // 2500 bytes: header + 3 chunks (each below the eager limit)
    if (c->rank() == 0) c->send(vi(x), 1);
    if (c->rank() == 1) {
        std::vector<int32_t> y(500);  // expects 2000 bytes
        CHECK_THROWS_WITH_AS(c->recv(vi(y), 0),
                             doctest::Contains("the sender sends 2500 bytes, this rank expects 2000"), Error);
        CHECK(c->broken());
    }
    world().barrier();
}

TEST_CASE("ranks of one machine all-reduce and all-gather through shared memory; MPI gives the same sums") {
    MpiComm& c = world();
    CHECK(c.shared_memory());  // every rank of this test runs here
    WaitPolicy p;
    p.timeout_s = 20.0;
    p.shared_memory = false;
    auto plain = MpiComm::world(p, "test_noshm");
    CHECK_FALSE(plain->shared_memory());
    // Sizes around the 1 MiB chunk of the exchange (262144 f32), random data.
    const int64_t per = ShmExchange::kSlotBytes / 4;
    for (int64_t len : {int64_t(5), per - 1, per, per + 1, 2 * per + per / 2}) {
        std::mt19937 g(99u + unsigned(c.rank()));
        std::uniform_real_distribution<float> d(-1.0f, 1.0f);
        std::vector<float> a(static_cast<size_t>(len));
        for (float& x : a) x = d(g);
        std::vector<float> b = a;
        c.all_reduce_sum(vf(a));
        plain->all_reduce_sum(vf(b));
        double max_diff = 0;
        for (int64_t i = 0; i < len; ++i) max_diff = std::max(max_diff, std::fabs(double(a[size_t(i)] - b[size_t(i)])));
        if (c.size() == 2)
            CHECK_MESSAGE(max_diff == 0.0, "len ", len);  // x + y == y + x: bit for bit
        else
            CHECK_MESSAGE(max_diff < 1e-5, "len ", len);
        std::vector<float> root = a;  // every rank holds the same bits
        c.broadcast(vf(root), 0);
        CHECK_MESSAGE(std::memcmp(root.data(), a.data(), a.size() * 4) == 0, "len ", len);
    }
}

TEST_CASE("back-to-back shared-memory calls with skewed ranks never read a slot being rewritten") {
    // Each call's data depend on the call number, sizes alternate (both slots of every rank in use),
    // and every rank spins a random 0..40 us before each call so that ranks overtake one another:
    // a rank that rewrote a slot a peer still reads would show up as a wrong sum.
    MpiComm& c = world();
    const int n = c.size(), me = c.rank();
    std::mt19937 g(7u + unsigned(me));
    int64_t bad = 0;
    for (int call = 0; call < 3000; ++call) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(g() % 41);
        while (std::chrono::steady_clock::now() < until) {
        }
        const int64_t len = call % 3 == 0 ? 1 : call % 3 == 1 ? 37 : 2048;
        if (call % 5 == 4) {  // an all-gather in between uses the same slots
            std::vector<int32_t> in(static_cast<size_t>(len), int32_t(call * 16 + me)), out(size_t(len * n), -1);
            c.all_gather(vi(out), vi(in));
            for (int r = 0; r < n; ++r) bad += out[size_t(r * len + len - 1)] != call * 16 + r;
            continue;
        }
        std::vector<float> v(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) v[size_t(i)] = float((call % 1000) * (me + 1) + i % 7);
        c.all_reduce_sum(vf(v));
        for (int64_t i = 0; i < len; ++i)
            bad += v[size_t(i)] != float((call % 1000) * n * (n + 1) / 2 + n * (i % 7));
    }
    CHECK(bad == 0);
}

TEST_CASE("a rank that passes another count to a shared-memory all-reduce is named, not summed") {
    WaitPolicy p;
    p.timeout_s = 20.0;
    auto c = MpiComm::world(p, "test_counts");
    REQUIRE(c->shared_memory());
    const int64_t len = c->rank() == 1 ? 20 : 10;  // rank 1 disagrees with everyone else
    std::vector<float> v(static_cast<size_t>(len), 1.0f);
    std::string msg;
    try {
        c->all_reduce_sum(vf(v));
    } catch (const Error& e) {
        msg = e.what();
    }
    MESSAGE(msg);
    CHECK(msg.find("all_reduce_sum on communicator 'test_counts'") != std::string::npos);
    CHECK(msg.find("every rank must pass the same count") != std::string::npos);
    if (c->rank() == 1)
        CHECK(msg.find("passed 40 bytes, this rank 80") != std::string::npos);
    else
        CHECK(msg.find("rank 1 [pid") != std::string::npos);
    CHECK(c->broken());
    world().barrier();  // the others' communicators are untouched
}
