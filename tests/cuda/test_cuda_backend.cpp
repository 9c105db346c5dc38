// CudaBackend against CpuBackend and exact references, through the Backend interface the model uses:
// - linear for none / w8a16 / w8a8 at m = 1, 5 (GEMV paths) and 17 (cuBLASLt paths); W8A8 is
//   bit-exact against quantize_row + int32 dot + the same dequant order;
// - a mini transformer layer (embed, rmsnorm, qkv, rope, attention, o, add_rmsnorm, gate_up,
//   silu_mul, down, add) against CpuBackend, prefill then decode;
// - metadata staging: a new batch with the same count but other positions is really re-uploaded;
// - CudaGraph: capture a decode step, replay it with other positions == the eager result.
// Without a device only the factory's error path runs (and the skip message is printed).
#include "cuda_test_util.h"
#include "kernels/cpu/quantize.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda_backend_factory.h"

using namespace lattice;
using namespace lattice::test;

namespace {

const DType kActs[] = {DType::kF16, DType::kBF16};

// Device activation [rows, cols] from host floats (rounded to act); returns the rounded floats too.
Buffer dev_act(CudaBackend& be, std::vector<float>& v, int64_t rows, int64_t cols) {
    Buffer b = be.alloc(be.activation_dtype(), {rows, cols});
    for (auto& x : v) x = round_act(x, be.activation_dtype());
    std::vector<uint16_t> bits = to_act(v, be.activation_dtype());
    be.upload(b.view(), bits.data());
    return b;
}

std::vector<float> host_act(CudaBackend& be, const View& v) {
    std::vector<uint16_t> bits(static_cast<size_t>(v.numel()));
    be.download(bits.data(), v);
    return from_act(bits, be.activation_dtype());
}

std::vector<float> cpu_host(CpuBackend& be, const View& v) {
    std::vector<float> h(static_cast<size_t>(v.numel()));
    be.download(h.data(), v);
    return h;
}

}  // namespace

TEST_CASE("make_cuda_backend: clear errors for a missing device" * doctest::test_suite("cuda")) {
    CHECK(cuda_device_count() >= 0);
    CHECK_THROWS_AS(make_cuda_backend(cuda_device_count() + 7, DType::kF16), Error);
    LATTICE_REQUIRE_CUDA();
    CHECK_THROWS_AS(make_cuda_backend(0, DType::kF32), Error);  // fp32 activations are a CPU thing
}

TEST_CASE("CudaBackend linear: none, w8a16, w8a8 at GEMV and GEMM sizes" * doctest::test_suite("cuda")) {
    LATTICE_REQUIRE_CUDA();
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t n = 45, k = 77;
    std::vector<float> w = random_vec(rng, size_t(n * k));
    const View hw = View::contiguous(w.data(), DType::kF32, {n, k});
    for (DType act : kActs) {
        CudaBackend be(0, act);
        for (QuantMode mode : {QuantMode::kNone, QuantMode::kW8A16, QuantMode::kW8A8}) {
            Linear lin = be.make_linear(hw, mode);
            // Quantized weights exactly as make_linear made them (shared quantize_row).
            std::vector<int8_t> wq(static_cast<size_t>(n * k));
            std::vector<float> sw(static_cast<size_t>(n));
            for (int64_t j = 0; j < n; ++j) sw[size_t(j)] = quantize_row_int8(&w[size_t(j * k)], k, &wq[size_t(j * k)]);
            for (int64_t m : {1, 5, 17}) {
                INFO(dtype_name(act) << " " << quant_mode_name(mode) << " m=" << m);
                std::vector<float> x = random_vec(rng, size_t(m * k), -2, 2);
                Buffer dx = dev_act(be, x, m, k);
                Buffer dy = be.alloc(act, {m, n});
                be.linear(dy.view(), dx.view(), lin);
                std::vector<float> got = host_act(be, dy.view()), ref(size_t(m * n));
                for (int64_t i = 0; i < m; ++i) {
                    std::vector<int8_t> xq(static_cast<size_t>(k));
                    const float sx = quantize_row_int8(&x[size_t(i * k)], k, xq.data());
                    for (int64_t j = 0; j < n; ++j) {
                        double s = 0;
                        int32_t acc = 0;
                        for (int64_t t = 0; t < k; ++t) {
                            const size_t wi = size_t(j * k + t), xi = size_t(i * k + t);
                            if (mode == QuantMode::kNone) s += double(x[xi]) * round_act(w[wi], act);
                            if (mode == QuantMode::kW8A16) s += double(x[xi]) * wq[wi] * sw[size_t(j)];
                            if (mode == QuantMode::kW8A8) acc += int32_t(xq[size_t(t)]) * wq[wi];
                        }
                        ref[size_t(i * n + j)] =
                            mode == QuantMode::kW8A8 ? round_act(float(acc) * (sx * sw[size_t(j)]), act) : float(s);
                    }
                }
                REQUIRE(any_nonzero(ref));
                if (mode == QuantMode::kW8A8)
                    CHECK(got == ref);
                else
                    CHECK(rel_err(got, ref) < tol_for(act));
            }
        }
    }
}

namespace {

struct MiniLayer {
    int64_t vocab = 50, h = 96, nh = 6, nkv = 2, hd = 16, f = 80, slots = 2, max_seq = 40;
    std::vector<float> table, norm1, norm2, wqkv, wo, wgu, wdown, inv_freq;
    explicit MiniLayer(std::mt19937_64& rng) {
        table = random_vec(rng, size_t(vocab * h));
        norm1 = random_vec(rng, size_t(h), 0.5f, 1.5f);
        norm2 = random_vec(rng, size_t(h), 0.5f, 1.5f);
        wqkv = random_vec(rng, size_t((nh + 2 * nkv) * hd * h), -0.2f, 0.2f);
        wo = random_vec(rng, size_t(h * nh * hd), -0.2f, 0.2f);
        wgu = random_vec(rng, size_t(2 * f * h), -0.2f, 0.2f);
        wdown = random_vec(rng, size_t(h * f), -0.2f, 0.2f);
        for (int64_t i = 0; i < hd / 2; ++i) inv_freq.push_back(std::pow(10000.0f, -2.0f * float(i) / float(hd)));
    }
    AttentionShape shape() const { return {nh, nkv, hd, max_seq, 1.0f / std::sqrt(float(hd))}; }
};

// Runs the layer on `be` for `batch`; caches persist across calls. Returns the final hidden [m, h].
struct LayerRun {
    Backend& be;
    const MiniLayer& L;
    Buffer table, n1, n2, inv, kc, vc;
    Linear qkv, o, gu, down;
    LayerRun(Backend& b, const MiniLayer& l, QuantMode mode) : be(b), L(l) {
        auto mk = [&](const std::vector<float>& w, int64_t n, int64_t k) {
            return be.make_linear(View::contiguous(const_cast<float*>(w.data()), DType::kF32, {n, k}), mode);
        };
        table = be.make_table(View::contiguous(const_cast<float*>(L.table.data()), DType::kF32, {L.vocab, L.h}));
        n1 = be.make_f32(View::contiguous(const_cast<float*>(L.norm1.data()), DType::kF32, {L.h}));
        n2 = be.make_f32(View::contiguous(const_cast<float*>(L.norm2.data()), DType::kF32, {L.h}));
        inv = be.make_f32(View::contiguous(const_cast<float*>(L.inv_freq.data()), DType::kF32, {L.hd / 2}));
        kc = be.alloc(be.activation_dtype(), {L.slots, L.max_seq, L.nkv, L.hd});
        vc = be.alloc(be.activation_dtype(), {L.slots, L.max_seq, L.nkv, L.hd});
        qkv = mk(L.wqkv, (L.nh + 2 * L.nkv) * L.hd, L.h);
        o = mk(L.wo, L.h, L.nh * L.hd);
        gu = mk(L.wgu, 2 * L.f, L.h);
        down = mk(L.wdown, L.h, L.f);
    }
    // Buffers sized for m tokens; reused across calls with the same m (graph requirement).
    struct Acts {
        Buffer x, y, qkv, att, o, gu, act, down;
    };
    Acts acts(int64_t m) {
        const DType a = be.activation_dtype();
        return {be.alloc(a, {m, L.h}),         be.alloc(a, {m, L.h}), be.alloc(a, {m, (L.nh + 2 * L.nkv) * L.hd}),
                be.alloc(a, {m, L.nh * L.hd}), be.alloc(a, {m, L.h}), be.alloc(a, {m, 2 * L.f}),
                be.alloc(a, {m, L.f}),         be.alloc(a, {m, L.h})};
    }
    void run(const TokenBatch& b, Acts& t) {
        const AttentionShape s = L.shape();
        be.embed(t.x.view(), table.view(), b, 0);
        be.rmsnorm(t.y.view(), t.x.view(), n1.view(), 1e-5f);
        be.linear(t.qkv.view(), t.y.view(), qkv);
        be.rope(t.qkv.view(), b, s, inv.view());
        be.attention(t.att.view(), t.qkv.view(), kc.view(), vc.view(), b, s);
        be.linear(t.o.view(), t.att.view(), o);
        be.add_rmsnorm(t.x.view(), t.o.view(), t.y.view(), n2.view(), 1e-5f);
        be.linear(t.gu.view(), t.y.view(), gu);
        be.silu_mul(t.act.view(), t.gu.view());
        be.linear(t.down.view(), t.act.view(), down);
        be.add(t.y.view(), t.x.view(), t.down.view());  // final hidden in y
    }
};

std::vector<float> result(Backend& be, const View& v) {
    if (be.device() == Device::kCpu) return cpu_host(static_cast<CpuBackend&>(be), v);
    return host_act(static_cast<CudaBackend&>(be), v);
}

}  // namespace

TEST_CASE("CudaBackend mini layer == CpuBackend (prefill, decode, graph replay)" * doctest::test_suite("cuda")) {
    LATTICE_REQUIRE_CUDA();
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    MiniLayer L(rng);
    CpuBackend cpu(CpuBackendOptions{1, false, false});
    for (DType act : kActs) {
        INFO(dtype_name(act));
        CudaBackend gpu(0, act);
        LayerRun rc(cpu, L, QuantMode::kNone), rg(gpu, L, QuantMode::kNone);
        const double tol = act == DType::kF16 ? 2e-2 : 8e-2;  // a whole layer of roundings
        // Prefill: slot 0 gets 13 tokens, slot 1 gets 7.
        std::vector<int32_t> ids, pos, slots;
        for (int32_t i = 0; i < 13; ++i) ids.push_back(int32_t(rng() % 50)), pos.push_back(i), slots.push_back(0);
        for (int32_t i = 0; i < 7; ++i) ids.push_back(int32_t(rng() % 50)), pos.push_back(i), slots.push_back(1);
        TokenBatch pb{ids.data(), pos.data(), slots.data(), int64_t(ids.size())};
        auto tc = rc.acts(pb.count), tg = rg.acts(pb.count);
        rc.run(pb, tc);
        rg.run(pb, tg);
        const std::vector<float> ref_p = result(cpu, tc.y.view());
        REQUIRE(any_nonzero(ref_p));
        CHECK(rel_err(result(gpu, tg.y.view()), ref_p) < tol);

        // Decode steps with m = 2 (one token per slot): eager, then a captured graph replayed with
        // new positions and ids must equal the eager CPU result of each step.
        auto dc = rc.acts(2), dg = rg.acts(2);
        std::vector<int32_t> did = {3, 4}, dpos = {13, 7}, dslot = {0, 1};
        TokenBatch db{did.data(), dpos.data(), dslot.data(), 2};
        rc.run(db, dc);
        rg.run(db, dg);  // eager warm-up of this bucket (sizes scratch)
        CHECK(rel_err(result(gpu, dg.y.view()), result(cpu, dc.y.view())) < tol);
        CudaGraph graph;
        std::vector<int32_t> gid = did, gpos = dpos;
        TokenBatch gb{gid.data(), gpos.data(), dslot.data(), 2};
        graph.capture(gpu, gb, [&] { rg.run(gb, dg); });
        for (int step = 0; step < 3; ++step) {
            INFO("graph step " << step);
            gid = {int32_t(rng() % 50), int32_t(rng() % 50)};
            gpos = {14 + step, 8 + step};
            rc.run(gb, dc);
            graph.replay(gpu, gb);
            CHECK(rel_err(result(gpu, dg.y.view()), result(cpu, dc.y.view())) < tol);
        }
        // Same count, other positions, eager: the staging must notice the change.
        gpos = {20, 20};
        rc.run(gb, dc);
        rg.run(gb, dg);
        CHECK(rel_err(result(gpu, dg.y.view()), result(cpu, dc.y.view())) < tol);
        // A bigger eager batch after the capture (70 tokens > the 64-token staging area): staging
        // and scratch grow, the graph keeps its own (retired, still allocated) buffers.
        std::vector<int32_t> bid, bpos, bslot;
        for (int32_t sl = 0; sl < 2; ++sl)
            for (int32_t p = 0; p < 35; ++p) bid.push_back(int32_t(rng() % 50)), bpos.push_back(p), bslot.push_back(sl);
        TokenBatch big{bid.data(), bpos.data(), bslot.data(), int64_t(bid.size())};
        auto bc = rc.acts(big.count), bg = rg.acts(big.count);
        rc.run(big, bc);
        rg.run(big, bg);
        CHECK(rel_err(result(gpu, bg.y.view()), result(cpu, bc.y.view())) < tol);
        gpos = {35, 35};
        rc.run(gb, dc);
        graph.replay(gpu, gb);
        CHECK(rel_err(result(gpu, dg.y.view()), result(cpu, dc.y.view())) < tol);
    }
}
