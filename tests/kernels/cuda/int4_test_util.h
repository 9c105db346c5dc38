// Helpers of the CUDA 4-bit tests (test_cuda_int4, test_cuda_sanitize): random Int4Weights of a kind, their
// upload in the device layout of kernels/cuda/int4_gemm.h (as CudaBackend::make_linear_int4 does it), and the
// CPU W4A16 kernel as the reference.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/int4_gemm.h"
#include "kernels/cuda/int4_gemm.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace lattice::test {

// Random weights of a kind: every nibble, scales of both signs, minimums, zero points 0..16, corners 0 and 15;
// with perm, a random act-order permutation.
inline Int4Weights random_int4(int64_t n, int64_t k, int64_t group, Int4Kind kind, bool perm, std::mt19937_64& rng) {
    Int4Weights w(n, k, group, kind);
    std::uniform_int_distribution<int> byte(0, 255), zp(0, 16);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (auto& b : w.qs) b = uint8_t(byte(rng));
    w.qs[0] = 0xF0;
    for (auto& d : w.d) d = f32_to_f16(nd(rng));
    for (auto& m : w.m) m = f32_to_f16(nd(rng) * 8);
    for (auto& z : w.z) z = uint8_t(zp(rng));
    if (perm) {
        w.perm.resize(size_t(k));
        std::iota(w.perm.begin(), w.perm.end(), 0);
        std::shuffle(w.perm.begin(), w.perm.end(), rng);
    }
    return w;
}

// The weights in the device layout (kernels/cuda/int4_gemm.h), as CudaBackend::make_linear_int4 uploads them.
struct DevInt4 {
    std::unique_ptr<DevBuf> qs, meta, perm;
    cuda::Int4Dev dev;
    explicit DevInt4(const Int4Weights& w) {
        const size_t plane = size_t(w.n * w.groups());
        std::vector<uint16_t> m(w.d);
        if (w.kind == Int4Kind::kAffine) m.insert(m.end(), w.m.begin(), w.m.end());
        if (w.kind == Int4Kind::kZeroPoint)
            for (uint8_t z : w.z) m.push_back(f32_to_f16(float(z)));
        qs = std::make_unique<DevBuf>(w.qs);
        meta = std::make_unique<DevBuf>(m);
        if (!w.perm.empty()) perm = std::make_unique<DevBuf>(w.perm);
        dev.qs = qs->get<uint8_t>();
        dev.d = meta->get<uint16_t>();
        dev.a = w.kind == Int4Kind::kOffset8 ? nullptr : meta->get<uint16_t>() + plane;
        dev.affine = w.kind == Int4Kind::kAffine;
        dev.n = w.n;
        dev.k = w.k;
        dev.kp = w.k_padded();
        dev.group = w.group;
    }
    const int32_t* perm_ptr() const { return perm ? perm->get<int32_t>() : nullptr; }
};

// The CPU W4A16 kernel on the same weights and (rounded) activations x [m, k]: y [m, n] f32.
inline std::vector<float> cpu_w4a16(const Int4Weights& w, const std::vector<float>& x, int64_t m) {
    static ThreadPool pool(1, false);
    const PackedInt4 p = pack_int4_weights(w.matrix(), detect_isa());
    std::vector<float> y(size_t(m * w.n));
    gemm_w4a16(x.data(), m, w.k, p, y.data(), pool);
    return y;
}

}  // namespace lattice::test
