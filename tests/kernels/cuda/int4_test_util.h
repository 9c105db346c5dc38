// Helpers of the CUDA 4-bit tests (test_cuda_int4, test_cuda_sanitize): random Int4Weights of a kind
// (tests/kernels/common/int4_test_util.h), their upload in the device layout of kernels/cuda/int4_gemm.h (as
// CudaBackend::make_linear_int4 does it), and the CPU W4A16 kernel as the reference.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/int4_gemm.h"
#include "kernels/cuda/int4_gemm.h"
#include "tests/kernels/common/int4_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace lattice::test {

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
