// Small shapes of every kernel family for compute-sanitizer (benchmarks/gpu/check.sh's sanitize step:
// memcheck over every case, racecheck and synccheck over the decode-attention case, the one whose
// name holds "decode"): the shapes are a few hundred elements so the tools' 10-100x slowdown costs
// seconds, yet every code path of the family runs (tile edges, masked lanes, the cp.async ring, the
// split merge, the GEMV row counts). Each case also checks its result against the CPU, so the binary
// is a test of its own in the plain suite (a few hundred milliseconds).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/quantize.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/attention_test_util.h"
#include "tests/kernels/cuda/int4_test_util.h"

using namespace lattice;
using namespace lattice::test;

namespace {

ThreadPool& pool() {
    static ThreadPool p(1, false);
    return p;
}

std::vector<float> rounded_vec(std::mt19937_64& rng, size_t n, DType act, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v = random_vec(rng, n, lo, hi);
    for (auto& x : v) x = round_act(x, act);
    return v;
}

}  // namespace

TEST_CASE("sanitize: decode attention (split KV, GQA 4 and 8, cp.async ring, merge)" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    // Lengths around the split chunk (64) and a longer one; GQA 4 with hd 64, GQA 8 with hd 128;
    // f16 and bf16 instantiate both unpack paths.
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (auto [nh, nkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{8, 2, 64}, {16, 2, 128}}) {
            INFO(dtype_name(act) << " nh=" << nh << " hd=" << hd);
            const DecodeProblem p = make_problem(rng, act, nh, nkv, hd, 200, 3, {0, 63, 64, 150}, {0, 1, 2, 1}, false);
            const std::vector<float> ref = cpu_decode(p, pool());
            REQUIRE(any_nonzero(ref));
            check_close(device_decode(p, act), ref, p.m() * nh, hd, act);
        }
    }
}

TEST_CASE("sanitize: prefill attention tiles" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const DType act = DType::kF16;
    // Sequence 0: positions 0..4; sequence 1: 30..66 (two tiles, the first 32 rows full).
    std::vector<int32_t> pos, seqs;
    for (int32_t i = 0; i < 5; ++i) pos.push_back(i), seqs.push_back(0);
    for (int32_t i = 30; i < 67; ++i) pos.push_back(i), seqs.push_back(1);
    const DecodeProblem p = make_problem(rng, act, 4, 2, 64, 80, 2, pos, seqs, false);
    const std::vector<float> ref = cpu_decode(p, pool());  // the CPU op stores then attends, as prefill
    REQUIRE(any_nonzero(ref));
    check_close(device_prefill(p, act), ref, p.m() * p.nh, p.hd, act);
}

TEST_CASE("sanitize: W8A8 and W8A16 GEMV row counts and the int32 epilogue" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const DType act = DType::kF16;
    const int64_t n = 37, k = 96, ldw = 96;
    std::vector<int8_t> w(size_t(n * ldw));
    for (auto& v : w) v = int8_t(int(rng() % 255) - 127);
    const std::vector<float> sw = random_vec(rng, size_t(n), 0.001f, 0.01f);
    DevBuf dw(w), dsw(sw);
    for (int64_t m : {int64_t(1), int64_t(3), int64_t(16)}) {
        INFO("m " << m);
        // W8A8: exact int32 dots, then the dequant in the kernel's order float(dot) * (sx * sw) (gemv.cu's
        // epilogue), f32 out: int -> float and both products are correctly rounded on host and device, so
        // the bits agree (no tolerance to argue).
        std::vector<int8_t> xq(size_t(m * k));
        for (auto& v : xq) v = int8_t(int(rng() % 255) - 127);
        const std::vector<float> sx = random_vec(rng, size_t(m), 0.001f, 0.01f);
        DevBuf dxq(xq), dsx(sx), dy(size_t(m * n) * 4);
        cuda::gemv_w8a8(dy.get(), dxq.get<int8_t>(), k, dsx.get<float>(), dw.get<int8_t>(), ldw, dsw.get<float>(), m, n,
                        k, act, DType::kF32, nullptr);
        const std::vector<float> y = dy.download<float>(size_t(m * n));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                int32_t dot = 0;
                for (int64_t t = 0; t < k; ++t) dot += int32_t(xq[size_t(i * k + t)]) * w[size_t(j * ldw + t)];
                CHECK(y[size_t(i * n + j)] == float(dot) * (sx[size_t(i)] * sw[size_t(j)]));
            }
        // W8A16 on the 8-byte path (k % 4 == 0) and the any-k path (k = 70).
        for (int64_t kk : {k, int64_t(70)}) {
            const std::vector<float> x = rounded_vec(rng, size_t(m * kk), act);
            DevBuf dx(to_act(x, act)), dyh(size_t(m * n) * 2);
            cuda::gemv_w8a16(dyh.get(), dx.get(), dw.get<int8_t>(), ldw, dsw.get<float>(), m, n, kk, act, act, nullptr);
            std::vector<float> ref(size_t(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (int64_t t = 0; t < kk; ++t) s += double(x[size_t(i * kk + t)]) * w[size_t(j * ldw + t)];
                    ref[size_t(i * n + j)] = float(s * sw[size_t(j)]);
                }
            check_close(from_act(dyh.download<uint16_t>(size_t(m * n)), act), ref, m, n, act);
        }
        // The IMMA path's epilogue: int32 accumulators -> activations.
        std::vector<int32_t> acc(size_t(m * 48));
        for (auto& v : acc) v = int32_t(rng() % 200001) - 100000;
        DevBuf dacc(acc), dout(size_t(m * n) * 2);
        cuda::dequant_i32(dout.get(), dacc.get<int32_t>(), 48, dsx.get<float>(), dsw.get<float>(), m, n, act, act,
                          nullptr);
        // Exact, in the kernel's own order acc * (sx * sw) (elementwise.cu dequant_kernel): both f32
        // products are correctly rounded on host and device alike (IEEE-754, no add to contract into an
        // FMA, no fast-math), and f32 -> f16 rounds to nearest even on both sides (base/dtype.h,
        // __float2half_rn), so the bits must agree. The other order, (acc * sx) * sw, differs from it by
        // one f32 ulp on about a third of the elements, and that ulp moves the f16 rounding on ~4e-5 of
        // them: an exact comparison against it failed ~3% of runs of this case.
        const std::vector<float> got = from_act(dout.download<uint16_t>(size_t(m * n)), act);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                CHECK(got[size_t(i * n + j)] ==
                      round_act(float(acc[size_t(i * 48 + j)]) * (sx[size_t(i)] * sw[size_t(j)]), act));
    }
}

TEST_CASE("sanitize: W4A16 gather, GEMV and tensor-core GEMM (act-order, k off the group)" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const DType act = DType::kBF16;
    const int64_t n = 37, k = 70;  // kp = 96 (group 32) or 128 (group 64 / 128): padded columns everywhere
    for (Int4Kind kind : {Int4Kind::kOffset8, Int4Kind::kZeroPoint, Int4Kind::kAffine}) {
        const int64_t group = kind == Int4Kind::kOffset8 ? 32 : kind == Int4Kind::kZeroPoint ? 64 : 128;
        const Int4Weights w = random_int4(n, k, group, kind, rng, kind != Int4Kind::kAffine);
        const DevInt4 dw(w);
        for (int64_t m : {int64_t(1), int64_t(8), int64_t(17)}) {
            INFO(int4_kind_name(kind) << " m " << m);
            const std::vector<float> x = rounded_vec(rng, size_t(m * k), act);
            DevBuf dx(to_act(x, act)), xg(size_t(m * w.k_padded()) * 2), dy(size_t(m * n) * 2);
            cuda::int4_gather_rows(xg.get(), dx.get(), dw.perm_ptr(), m, k, w.k_padded(), act, nullptr);
            if (m <= cuda::kInt4GemvMaxRows)
                cuda::gemv_w4a16(dy.get(), xg.get(), dw.dev, m, act, act, nullptr);
            else
                cuda::gemm_w4a16(dy.get(), xg.get(), w.k_padded(), dw.dev, m, act, act, nullptr);
            check_close(from_act(dy.download<uint16_t>(size_t(m * n)), act), cpu_w4a16(w, x, m), m, n, act);
        }
    }
}

TEST_CASE("sanitize: row kernels (norm + quantize, SiLU + quantize, rope, embed, token selection)" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const DType act = DType::kBF16;
    const int64_t m = 3, n = 200, ldq = 208, f = 136;
    // residual += x; out = rmsnorm(residual) * w; q = quantize(out).
    std::vector<float> x = rounded_vec(rng, size_t(m * n), act, -3, 3), r = rounded_vec(rng, size_t(m * n), act, -3, 3);
    const std::vector<float> w = random_vec(rng, size_t(n), 0.5f, 1.5f);
    DevBuf dx(to_act(x, act)), dr(to_act(r, act)), dw(w), dout(size_t(m * n) * 2), dq(size_t(m * ldq)),
        ds(size_t(m) * 4);
    cuda::add_rmsnorm_quant(dr.get(), dx.get(), dout.get(), dq.get<int8_t>(), ldq, ds.get<float>(), dw.get<float>(), m,
                            n, 1e-5f, act, nullptr);
    std::vector<float> res_ref = r, out_ref(size_t(m * n));
    cpu::add_rmsnorm(res_ref.data(), x.data(), out_ref.data(), w.data(), m, n, 1e-5f, pool());
    const std::vector<float> out = from_act(dout.download<uint16_t>(size_t(m * n)), act);
    check_close(out, out_ref, m, n, act);
    const std::vector<int8_t> q = dq.download<int8_t>(size_t(m * ldq));
    for (int64_t i = 0; i < m; ++i) {
        std::vector<int8_t> qr(static_cast<size_t>(n));
        quantize_row_int8(&out[size_t(i * n)], n, qr.data());
        CHECK(std::equal(qr.begin(), qr.end(), q.begin() + i * ldq));
    }
    // SiLU(gate) * up, quantized in the same pass.
    const std::vector<float> gu = rounded_vec(rng, size_t(m * 2 * f), act, -5, 5);
    DevBuf dgu(to_act(gu, act)), dsil(size_t(m * f) * 2), dq2(size_t(m * 144)), ds2(size_t(m) * 4);
    cuda::silu_mul_quant(dsil.get(), dq2.get<int8_t>(), 144, ds2.get<float>(), dgu.get(), m, f, act, nullptr);
    std::vector<float> sref(size_t(m * f));
    cpu::silu_mul(sref.data(), gu.data(), m, f, pool());
    check_close(from_act(dsil.download<uint16_t>(size_t(m * f)), act), sref, m, f, act);
    // Rope over a GQA row layout.
    const int64_t nh = 4, nkv = 2, hd = 32, row = (nh + 2 * nkv) * hd;
    std::vector<float> qkv = rounded_vec(rng, size_t(m * row), act);
    std::vector<float> inv(size_t(hd / 2));
    for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(hd));
    const std::vector<int32_t> pos = {0, 17, 4000};
    DevBuf dqkv(to_act(qkv, act)), dpos(pos), dinv(inv);
    cuda::rope(dqkv.get(), dpos.get<int32_t>(), m, nh, nkv, hd, dinv.get<float>(), act, nullptr);
    const std::vector<float> rgot = from_act(dqkv.download<uint16_t>(size_t(m * row)), act);
    cpu::rope(qkv.data(), m, row, pos.data(), nh + nkv, hd, inv.data(), pool());
    check_close(rgot, qkv, m * (nh + 2 * nkv), hd, act);
    // Embedding rows (one id outside this shard's rows: zeros).
    const int64_t rows = 11;
    const std::vector<float> table = rounded_vec(rng, size_t(rows * n), act);
    const std::vector<int32_t> ids = {3, 10, 15};
    DevBuf dtab(to_act(table, act)), dids(ids), demb(size_t(3 * n) * 2);
    cuda::embed(demb.get(), act, dtab.get(), act, rows, n, dids.get<int32_t>(), 3, 0, nullptr);
    const std::vector<float> emb = from_act(demb.download<uint16_t>(size_t(3 * n)), act);
    CHECK(std::equal(emb.begin(), emb.begin() + n, table.begin() + 3 * n));
    CHECK(std::all_of(emb.begin() + 2 * n, emb.end(), [](float v) { return v == 0.0f; }));
    // Token selection: a greedy row, a sampled row with top-k / top-p, a row with bans.
    const int64_t vocab = 500;
    std::vector<float> logits = random_vec(rng, size_t(3 * vocab), -4, 4);
    logits[7] = 9.0f;
    logits[vocab + 11] = 9.0f;
    logits[2 * vocab + 5] = 9.0f;
    logits[2 * vocab + 6] = 8.0f;
    const std::vector<cuda::SelectParams> params = {
        {0.0f, 0, 1.0f, 0.0f, 0.5f, 0, 0}, {0.7f, 40, 0.9f, 0.0f, 0.25f, 0, 0}, {0.0f, 0, 1.0f, 0.0f, 0.5f, 0, 1}};
    const std::vector<int32_t> bans = {5};
    DevBuf dlog(logits), dparams(params), dbans(bans), dids_out(3 * 4), dlps(3 * 4);
    cuda::select_tokens(dids_out.get<int32_t>(), dlps.get<float>(), dlog.get<float>(), 3, vocab,
                        dparams.get<cuda::SelectParams>(), dbans.get<int32_t>(), nullptr, nullptr);
    const std::vector<int32_t> picked = dids_out.download<int32_t>(3);
    CHECK(picked[0] == 7);
    CHECK(picked[1] >= 0);
    CHECK(picked[1] < vocab);
    CHECK(picked[2] == 6);
}
