// Element conversion between the plain float types (f32, f16, bf16) on the host: used by weight
// sources (row slices), backends (widening checkpoint weights) and the converter. Rounding to f16 /
// bf16 is round-to-nearest-even (base/dtype.h). Host-only (fmt through base/error.h).
#pragma once

#include "base/dtype.h"
#include "base/error.h"

#include <cstdint>
#include <cstring>

namespace lattice {

namespace detail {
template <typename Load>
void store_converted(Load load, void* dst, DType dt, int64_t n) {
    switch (dt) {
        case DType::kF32:
            for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = load(i);
            break;
        case DType::kF16:
            for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(load(i));
            break;
        case DType::kBF16:
            for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(load(i));
            break;
        default: LATTICE_FAIL("convert: unsupported target dtype {}", dtype_name(dt));
    }
}
}  // namespace detail

// Converts n elements of src (f32/f16/bf16) to dst (f32/f16/bf16); a plain copy when the types match.
inline void convert_elements(const void* src, DType st, void* dst, DType dt, int64_t n) {
    if (st == dt) {
        std::memcpy(dst, src, size_t(n * dtype_size(st)));
        return;
    }
    const auto* f = static_cast<const float*>(src);
    const auto* h = static_cast<const uint16_t*>(src);
    switch (st) {
        case DType::kF32: detail::store_converted([f](int64_t i) { return f[i]; }, dst, dt, n); break;
        case DType::kF16: detail::store_converted([h](int64_t i) { return f16_to_f32(h[i]); }, dst, dt, n); break;
        case DType::kBF16: detail::store_converted([h](int64_t i) { return bf16_to_f32(h[i]); }, dst, dt, n); break;
        default: LATTICE_FAIL("convert: unsupported source dtype {}", dtype_name(st));
    }
}

}  // namespace lattice
