// Element conversion between the plain float types (f32, f16, bf16) on the host: used by weight
// sources (row slices), backends (widening checkpoint weights) and the converter. Rounding to f16 /
// bf16 is round-to-nearest-even (base/dtype.h). The source may be unaligned. Host-only (fmt through
// base/error.h).
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
    // src may be unaligned (a safetensors header need not pad the data section to the element size):
    // loads go through memcpy, the same plain load on x86 and defined behaviour everywhere.
    const auto* b = static_cast<const unsigned char*>(src);
    auto f32_at = [b](int64_t i) {
        float v;
        std::memcpy(&v, b + 4 * i, 4);
        return v;
    };
    auto u16_at = [b](int64_t i) {
        uint16_t v;
        std::memcpy(&v, b + 2 * i, 2);
        return v;
    };
    switch (st) {
        case DType::kF32: detail::store_converted(f32_at, dst, dt, n); break;
        case DType::kF16: detail::store_converted([&](int64_t i) { return f16_to_f32(u16_at(i)); }, dst, dt, n); break;
        case DType::kBF16: detail::store_converted([&](int64_t i) { return bf16_to_f32(u16_at(i)); }, dst, dt, n); break;
        default: LATTICE_FAIL("convert: unsupported source dtype {}", dtype_name(st));
    }
}

}  // namespace lattice
