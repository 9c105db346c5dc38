// Every non-GEMM CUDA kernel against the CPU op (kernels/cpu/ops.h) on random inputs, for fp16 and
// bf16 activations: odd sizes (not multiples of any tile), m = 1, poisoned outputs (NaN until
// written), inputs asserted non-zero. The CPU sees the same activation-rounded inputs, so the
// remaining difference is output rounding and summation order, bounded by kTolF16 / kTolBF16.
#include <algorithm>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/common/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;
using namespace lattice::test;

namespace {

const DType kActs[] = {DType::kF16, DType::kBF16};

ThreadPool& pool() {
    static ThreadPool p(1, false);
    return p;
}

// Rounds a host float vector through act (in place) and returns its device copy.
std::vector<uint16_t> rounded(std::vector<float>& v, DType act) {
    for (auto& x : v) x = round_act(x, act);
    return to_act(v, act);
}

}  // namespace

TEST_CASE("cuda embed: f32/f16/bf16 tables, vocab-parallel offset, exact" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t rows = 37, h = 70, offset = 20;
    std::vector<float> table = random_vec(rng, size_t(rows * h));
    for (DType act : kActs) {
        for (DType tdt : {DType::kF32, DType::kF16, DType::kBF16}) {
            for (int64_t m : {int64_t(1), int64_t(9)}) {
                std::vector<int32_t> ids(static_cast<size_t>(m));
                for (int64_t i = 0; i < m; ++i) ids[size_t(i)] = int32_t(rng() % 70);  // some outside [20, 57)
                ids[0] = 20 + 36;                                                      // last local row
                std::vector<float> tf = table;
                DevBuf dtab(size_t(rows * h) * 4);
                if (tdt == DType::kF32) {
                    dtab.upload(tf);
                } else {
                    std::vector<uint16_t> bits(tf.size());
                    for (size_t i = 0; i < tf.size(); ++i) {
                        bits[i] = tdt == DType::kF16 ? f32_to_f16(tf[i]) : f32_to_bf16(tf[i]);
                        tf[i] = tdt == DType::kF16 ? f16_to_f32(bits[i]) : bf16_to_f32(bits[i]);
                    }
                    dtab.upload(bits);
                }
                DevBuf dids(ids), dout(size_t(m * h) * 2);
                cuda::embed(dout.get(), act, dtab.get(), tdt, rows, h, dids.get<int32_t>(), m, offset, nullptr);
                std::vector<float> got = from_act(dout.download<uint16_t>(size_t(m * h)), act);
                std::vector<float> ref(static_cast<size_t>(m * h));
                cpu::embed(ref.data(), tf.data(), DType::kF32, rows, h, ids.data(), m, offset);
                for (auto& x : ref) x = round_act(x, act);
                REQUIRE(any_nonzero(ref));
                CHECK(got == ref);
            }
        }
    }
}

TEST_CASE("cuda rmsnorm, add_rmsnorm and the fused quantize" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 1}, {1, 4099}, {7, 130}, {3, 8192}, {2, 2048}, {1, 40000}}) {
            INFO(dtype_name(act) << " m=" << m << " n=" << n);
            std::vector<float> x = random_vec(rng, size_t(m * n), -3, 3), r = random_vec(rng, size_t(m * n), -3, 3);
            std::vector<float> w = random_vec(rng, size_t(n), 0.5f, 1.5f);
            DevBuf dx(rounded(x, act)), dr(rounded(r, act)), dw(w), dout(size_t(m * n) * 2);
            cuda::rmsnorm(dout.get(), dx.get(), dw.get<float>(), m, n, 1e-5f, act, nullptr);
            std::vector<float> got = from_act(dout.download<uint16_t>(size_t(m * n)), act), ref(size_t(m * n));
            cpu::rmsnorm(ref.data(), x.data(), w.data(), m, n, 1e-5f, pool());
            check_close(got, ref, m, n, act);

            // Fused: residual += x, out = norm(residual), q = quantize(out).
            const int64_t ldq = (n + 15) / 16 * 16;
            DevBuf dq(size_t(m * ldq)), ds(size_t(m) * 4);
            dout.poison();
            cuda::add_rmsnorm_quant(dr.get(), dx.get(), dout.get(), dq.get<int8_t>(), ldq, ds.get<float>(),
                                    dw.get<float>(), m, n, 1e-5f, act, nullptr);
            std::vector<float> res_got = from_act(dr.download<uint16_t>(size_t(m * n)), act);
            std::vector<float> out_got = from_act(dout.download<uint16_t>(size_t(m * n)), act);
            std::vector<float> res_ref = r, out_ref(size_t(m * n));
            cpu::add_rmsnorm(res_ref.data(), x.data(), out_ref.data(), w.data(), m, n, 1e-5f, pool());
            check_close(res_got, res_ref, m, n, act);
            check_close(out_got, out_ref, m, n, act);
            // The int8 rows must be exactly the shared quantize_row_int8 of the device's own output.
            std::vector<int8_t> q = dq.download<int8_t>(size_t(m * ldq));
            std::vector<float> s = ds.download<float>(size_t(m));
            for (int64_t i = 0; i < m; ++i) {
                std::vector<int8_t> qr(static_cast<size_t>(n));
                const float sr = quantize_row_int8(&out_got[size_t(i * n)], n, qr.data());
                CHECK(s[size_t(i)] == sr);
                CHECK(std::equal(qr.begin(), qr.end(), q.begin() + i * ldq));
                for (int64_t j = n; j < ldq; ++j) CHECK(q[size_t(i * ldq + j)] == 0);
            }
            // add_rmsnorm (unfused entry) equals the fused output.
            DevBuf dr2(to_act(r, act)), dout2(size_t(m * n) * 2);
            cuda::add_rmsnorm(dr2.get(), dx.get(), dout2.get(), dw.get<float>(), m, n, 1e-5f, act, nullptr);
            CHECK(from_act(dout2.download<uint16_t>(size_t(m * n)), act) == out_got);
        }
    }
}

TEST_CASE("cuda quantize_rows equals the shared quantize_row_int8 exactly" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 5}, {5, 300}, {2, 4096}, {3, 40000}}) {
            const int64_t ldq = (k + 15) / 16 * 16;
            std::vector<float> x = random_vec(rng, size_t(m * k), -4, 4);
            std::fill(x.begin() + (m - 1) * k, x.end(), 0.0f);  // an all-zero row: scale 1, q 0
            if (m == 1) x[0] = 2.5f;
            DevBuf dx(rounded(x, act)), dq(size_t(m * ldq)), ds(size_t(m) * 4);
            cuda::quantize_rows(dq.get<int8_t>(), ldq, ds.get<float>(), dx.get(), m, k, act, nullptr);
            std::vector<int8_t> q = dq.download<int8_t>(size_t(m * ldq));
            std::vector<float> s = ds.download<float>(size_t(m));
            for (int64_t i = 0; i < m; ++i) {
                std::vector<int8_t> qr(static_cast<size_t>(k));
                CHECK(s[size_t(i)] == quantize_row_int8(&x[size_t(i * k)], k, qr.data()));
                CHECK(std::equal(qr.begin(), qr.end(), q.begin() + i * ldq));
                for (int64_t j = k; j < ldq; ++j) CHECK(q[size_t(i * ldq + j)] == 0);
            }
        }
    }
}

TEST_CASE("cuda rope: half-split pairs, GQA row layout, large positions" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [nh, nkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{6, 2, 16}, {8, 2, 128}}) {
            for (int64_t m : {int64_t(1), int64_t(11)}) {
                const int64_t row = (nh + 2 * nkv) * hd;
                std::vector<float> qkv = random_vec(rng, size_t(m * row));
                std::vector<float> inv(static_cast<size_t>(hd / 2));
                for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(hd));
                std::vector<int32_t> pos(static_cast<size_t>(m));
                for (auto& p : pos) p = int32_t(rng() % 8000);
                DevBuf dq(rounded(qkv, act)), dpos(pos), dinv(inv);
                cuda::rope(dq.get(), dpos.get<int32_t>(), m, nh, nkv, hd, dinv.get<float>(), act, nullptr);
                std::vector<float> got = from_act(dq.download<uint16_t>(size_t(m * row)), act);
                cpu::rope(qkv.data(), m, row, pos.data(), nh + nkv, hd, inv.data(), pool());
                check_close(got, qkv, m * (nh + 2 * nkv), hd, act);  // per head row
                // v heads untouched (bit-exact).
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = (nh + nkv) * hd; j < row; ++j)
                        REQUIRE(got[size_t(i * row + j)] == qkv[size_t(i * row + j)]);
            }
        }
    }
}

TEST_CASE("cuda silu_mul, add, dequant_weights" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [m, f] : {std::pair<int64_t, int64_t>{1, 1}, {3, 345}}) {
            std::vector<float> gu = random_vec(rng, size_t(m * 2 * f), -5, 5);
            DevBuf dgu(rounded(gu, act)), dout(size_t(m * f) * 2);
            cuda::silu_mul(dout.get(), dgu.get(), m, f, act, nullptr);
            std::vector<float> ref(static_cast<size_t>(m * f));
            cpu::silu_mul(ref.data(), gu.data(), m, f, pool());
            check_close(from_act(dout.download<uint16_t>(size_t(m * f)), act), ref, m, f, act);

            std::vector<float> a = random_vec(rng, size_t(m * f)), b = random_vec(rng, size_t(m * f));
            DevBuf da(rounded(a, act)), db(rounded(b, act));
            dout.poison();
            cuda::add(dout.get(), da.get(), db.get(), m * f, act, nullptr);
            cpu::add(ref.data(), a.data(), b.data(), m * f);
            for (auto& x : ref) x = round_act(x, act);
            CHECK(from_act(dout.download<uint16_t>(size_t(m * f)), act) == ref);  // one rounding: exact
        }
        // int8 weights back to float: exact (one product, one rounding).
        const int64_t n = 5, k = 19, ldw = 32;
        std::vector<int8_t> w(static_cast<size_t>(n * ldw));
        for (auto& v : w) v = int8_t(int(rng() % 255) - 127);
        std::vector<float> sw = random_vec(rng, size_t(n), 0.001f, 0.02f);
        DevBuf dw(w), dsw(sw), dout(size_t(n * k) * 2);
        cuda::dequant_weights(dout.get(), dw.get<int8_t>(), ldw, dsw.get<float>(), n, k, act, nullptr);
        std::vector<float> got = from_act(dout.download<uint16_t>(size_t(n * k)), act);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < k; ++j)
                CHECK(got[size_t(i * k + j)] == round_act(float(w[size_t(i * ldw + j)]) * sw[size_t(i)], act));
    }
}

// The fused SiLU * up + quantize (vector path for f % 8 == 0 up to 32768, scalar beyond or for odd
// f) equals silu_mul followed by quantize_rows exactly, and silu_mul equals the CPU op.
TEST_CASE("cuda silu_mul_quant equals silu_mul then quantize_rows" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [m, f] : {std::pair<int64_t, int64_t>{1, 345}, {1, 3584}, {4, 2048}, {2, 33000}, {1, 8}}) {
            INFO(dtype_name(act) << " m=" << m << " f=" << f);
            const int64_t ldq = (f + 15) / 16 * 16;
            std::vector<float> gu = random_vec(rng, size_t(m * 2 * f), -5, 5);
            DevBuf dgu(rounded(gu, act)), dout(size_t(m * f) * 2), dq(size_t(m * ldq)), ds(size_t(m) * 4);
            dout.poison();
            dq.poison();
            cuda::silu_mul_quant(dout.get(), dq.get<int8_t>(), ldq, ds.get<float>(), dgu.get(), m, f, act, nullptr);
            std::vector<float> out = from_act(dout.download<uint16_t>(size_t(m * f)), act);
            std::vector<float> ref(static_cast<size_t>(m * f));
            cpu::silu_mul(ref.data(), gu.data(), m, f, pool());
            check_close(out, ref, m, f, act);
            // Unfused on the device: the same out bits, then quantize_rows of them.
            DevBuf dout2(size_t(m * f) * 2), dq2(size_t(m * ldq)), ds2(size_t(m) * 4);
            cuda::silu_mul(dout2.get(), dgu.get(), m, f, act, nullptr);
            CHECK(from_act(dout2.download<uint16_t>(size_t(m * f)), act) == out);
            cuda::quantize_rows(dq2.get<int8_t>(), ldq, ds2.get<float>(), dout2.get(), m, f, act, nullptr);
            CHECK(dq.download<int8_t>(size_t(m * ldq)) == dq2.download<int8_t>(size_t(m * ldq)));
            CHECK(ds.download<float>(size_t(m)) == ds2.download<float>(size_t(m)));
            std::vector<int8_t> q = dq.download<int8_t>(size_t(m * ldq));
            for (int64_t i = 0; i < m; ++i) {
                std::vector<int8_t> qr(static_cast<size_t>(f));
                quantize_row_int8(&out[size_t(i * f)], f, qr.data());
                CHECK(std::equal(qr.begin(), qr.end(), q.begin() + i * ldq));
                for (int64_t j = f; j < ldq; ++j) CHECK(q[size_t(i * ldq + j)] == 0);
            }
        }
    }
}
