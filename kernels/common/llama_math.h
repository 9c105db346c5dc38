// The per-row math every device must agree on, written once as LATTICE_HD (__host__ __device__)
// inline functions: the CPU kernels call them in loops, the CUDA kernels call them per thread
// (after their own parallel reductions). Change the numerics here and every backend follows.
//
// - RMSNorm:  y = x * rsqrt(mean(x^2) + eps) * w, accumulation in fp32.
// - RoPE:     half-split ("rotate_half") pairing of element i with i + hd/2; angle = pos * inv_freq[i]
//             (llama3 / linear scaling is folded into the inv_freq table by ModelConfig).
// - Softmax:  max-subtracted exp in fp32; an online (streaming) form for tiled attention.
// - Quantize: lives in kernels/common/quantize.h (same LATTICE_HD style), not here.
// Only base/ may be included (kernels/ layering).
#pragma once

#include <cstdint>

#include "base/dtype.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace lattice::math {

LATTICE_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return std::exp(x);
#endif
}

LATTICE_HD float rsqrt_f32(float x) {
#if defined(__CUDA_ARCH__)
    return rsqrtf(x);
#else
    return 1.0f / std::sqrt(x);
#endif
}

LATTICE_HD float max_f32(float a, float b) {
    return a > b ? a : b;
}
LATTICE_HD float abs_f32(float a) {
    return a < 0.0f ? -a : a;
}

// ---- RMSNorm ------------------------------------------------------------------------------
// Inverse RMS of a row of n elements whose squares sum to sum_sq.
LATTICE_HD float rms_inv(float sum_sq, int64_t n, float eps) {
    return rsqrt_f32(sum_sq / float(n) + eps);
}

// Serial reference for one row (the CPU kernel; device kernels reduce sum_sq in parallel and
// then apply rms_inv exactly like this).
LATTICE_HD void rmsnorm_row(float* out, const float* x, const float* w, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float inv = rms_inv(ss, n, eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// ---- RoPE ---------------------------------------------------------------------------------
struct RopeCs {
    float c, s;
};

LATTICE_HD RopeCs rope_cos_sin(int32_t pos, float inv_freq) {
    const float a = float(pos) * inv_freq;
#if defined(__CUDA_ARCH__)
    RopeCs r;
    sincosf(a, &r.s, &r.c);  // full-precision (not __sincosf): positions reach 1e5 radians
    return r;
#else
    return RopeCs{std::cos(a), std::sin(a)};
#endif
}

// Rotates the pair (x0 = x[i], x1 = x[i + hd/2]) in place.
LATTICE_HD void rope_pair(float& x0, float& x1, RopeCs cs) {
    const float a = x0, b = x1;
    x0 = a * cs.c - b * cs.s;
    x1 = b * cs.c + a * cs.s;
}

// Serial reference for one head vector of hd elements.
LATTICE_HD void rope_head(float* x, int64_t hd, int32_t pos, const float* inv_freq) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) rope_pair(x[i], x[i + half], rope_cos_sin(pos, inv_freq[i]));
}

// ---- Softmax ------------------------------------------------------------------------------
LATTICE_HD void softmax_row(float* x, int64_t n) {
    float m = -3.402823466e38f;
    for (int64_t i = 0; i < n; ++i) m = max_f32(m, x[i]);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = exp_f32(x[i] - m);
        s += x[i];
    }
    const float inv = 1.0f / s;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// Streaming softmax state for one query: running max m and running sum l of exp(s - m).
// The output accumulator is rescaled by the returned factor whenever the max grows.
struct OnlineSoftmax {
    float m = -3.402823466e38f;
    float l = 0.0f;
    // Adds score s; returns (rescale for the old accumulator, weight of the new value).
    LATTICE_HD void add(float s, float& rescale, float& p) {
        const float m_new = max_f32(m, s);
        rescale = exp_f32(m - m_new);
        p = exp_f32(s - m_new);
        l = l * rescale + p;
        m = m_new;
    }
    // Merges another partial state (m2, l2); returns the rescales of both accumulators.
    LATTICE_HD void merge(float m2, float l2, float& r1, float& r2) {
        const float m_new = max_f32(m, m2);
        r1 = exp_f32(m - m_new);
        r2 = exp_f32(m2 - m_new);
        l = l * r1 + l2 * r2;
        m = m_new;
    }
};

// ---- Symmetric int8 quantization: kernels/common/quantize.h (quantize_row_int8 and friends, also
// LATTICE_HD), shared by the CPU INT8 kernels and the CUDA quantize / fused norm+quantize kernels.

// ---- SiLU ---------------------------------------------------------------------------------
LATTICE_HD float silu(float x) {
    return x / (1.0f + exp_f32(-x));
}

LATTICE_HD float tanh_f32(float x) {
#if defined(__CUDA_ARCH__)
    return tanhf(x);
#else
    return std::tanh(x);
#endif
}

// ---- GELU (tanh approximation: Gemma's gelu_pytorch_tanh) and soft-capping -----------------
LATTICE_HD float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanh_f32(k * (x + 0.044715f * x * x * x)));
}

// cap * tanh(x / cap): Gemma 2's attention scores and final logits.
LATTICE_HD float softcap(float x, float cap) {
    return cap * tanh_f32(x / cap);
}

}  // namespace lattice::math
