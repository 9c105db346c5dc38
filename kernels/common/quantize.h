// Symmetric int8 quantization math shared by the CPU kernels and the CUDA kernels (LATTICE_HD), so a
// row quantized on either device gives the same int8 values and scale bit for bit:
//   s = max|x| / 127 (s = 1 when the row is all zero),  q = clamp(round(x / s), -127, 127)
// with round = half away from zero (roundf) and IEEE division (no fast-math). max|x| is exact and
// order-independent, so a parallel (warp) reduction of the absmax gives the same s.
// Used per output channel for weights (at load) and per token for W8A8 activations (every call).
// NaN inputs quantize to 0 rather than invoking undefined float->int conversion; callers that must
// reject non-finite data (weights at load) check before.
#pragma once

#include <math.h>

#include <cstdint>

#include "base/dtype.h"

namespace lattice {

// Scale for a row whose largest magnitude is `absmax` (>= 0).
LATTICE_HD float int8_scale_from_absmax(float absmax) { return absmax > 0.0f ? absmax / 127.0f : 1.0f; }

// One value: clamp(round(x / s), -127, 127); NaN -> 0.
LATTICE_HD int8_t quantize_int8_value(float x, float scale) {
    float v = roundf(x / scale);
    if (!(v == v)) return 0;
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    return int8_t(int(v));
}

// max |x[i]| over a row (NaN ignored).
LATTICE_HD float absmax_row(const float* x, int64_t k) {
    float m = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

// Quantizes one row x[k] into q[k]; returns its scale s (x ~= q * s).
LATTICE_HD float quantize_row_int8(const float* x, int64_t k, int8_t* q) {
    float s = int8_scale_from_absmax(absmax_row(x, k));
    for (int64_t i = 0; i < k; ++i) q[i] = quantize_int8_value(x[i], s);
    return s;
}

}  // namespace lattice
