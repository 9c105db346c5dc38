// CpuBackend's weights (see cpu_backend.h): float linears kept as they are or quantized at load (int8 per output
// channel, row by row over the pool; 4-bit affine groups of 32), pre-quantized int8 and 4-bit linears packed for
// the kernels (kernels/cpu/int8_gemm.h, int4_gemm.h: a GGUF K-quant linear's super-blocks kept where the ISA can),
// norm vectors and embedding tables copied. Every packed buffer is the backend's own (the caller's copy can go).
#include <cmath>
#include <cstring>

#include "base/convert.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/onednn_int8.h"
#include "runtime/backend/cpu/cpu_backend.h"

namespace lattice {

Linear CpuBackend::make_linear(const View& w, QuantMode mode) {
    LATTICE_CHECK(w.ndim == 2 && w.is_contiguous(), "make_linear: expected a contiguous [n, k] weight, got {}",
                  w.shape_str());
    if (is_int4(mode)) return make_linear_float_int4(w, mode);
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "make_linear: weight dtype {} unsupported for quant {}", dtype_name(w.dtype), quant_mode_name(mode));
    const int64_t n = w.dim(0), k = w.dim(1);
    if (mode != QuantMode::kNone) {
        // Symmetric per-output-channel int8 (row by row: no float copy of the matrix), then the same packing a
        // pre-quantized layer gets.
        std::vector<int8_t> q(static_cast<size_t>(w.numel()));
        std::vector<float> scales(static_cast<size_t>(n));
        quantize_weights_per_channel(w.data, w.dtype, n, k, q.data(), scales.data(), pool_.get());
        return make_linear_int8(View::contiguous(q.data(), DType::kI8, {n, k}),
                                View::contiguous(scales.data(), DType::kF32, {n}), mode);
    }
    if (bf16_ && gemm_bf16_dot_available()) {
        Linear l;
        l.n = n;
        l.k = k;
        l.mode = mode;
        l.weight_dtype = DType::kBF16;
        auto packed = std::make_shared<PackedBf16>(pack_bf16_weights(w.data, w.dtype, n, k, pool_.get()));
        l.prepared_bytes = packed->bytes();
        l.aside_bytes = packed->onednn ? onednn_bf16_bytes(*packed->onednn) : 0;
        l.prepared = std::move(packed);
        return l;
    }
    // --dtype bf16 without the bf16 pairs: f32 / f16 weights rounded to bf16 (what the pairs would multiply).
    return make_linear_rows(w, bf16_ ? DType::kBF16 : w.dtype);
}

Linear CpuBackend::make_tied_head(const View& w, QuantMode mode) {
    if (!bf16_ || mode != QuantMode::kNone) return make_linear(w, mode);
    LATTICE_CHECK(w.ndim == 2 && w.is_contiguous(), "make_tied_head: expected a contiguous [n, k] weight, got {}",
                  w.shape_str());
    return make_linear_rows(w, DType::kBF16);
}

// A float linear kept row-major in `dtype` (f32 / f16 / bf16; rounded to nearest even where narrower).
Linear CpuBackend::make_linear_rows(const View& w, DType dtype) {
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "make_linear: weight dtype {} is not float", dtype_name(w.dtype));
    Linear l;
    l.n = w.dim(0);
    l.k = w.dim(1);
    l.mode = QuantMode::kNone;
    l.weight_dtype = dtype;
    l.weight = alloc_bytes(dtype, View::contiguous(nullptr, dtype, {l.n, l.k}));
    convert_elements(w.data, w.dtype, l.weight.data(), dtype, l.n * l.k);
    return l;
}

// 4-bit from float weights: affine groups of 32 (Q4_1's form), then the packing a 4-bit checkpoint's gets.
Linear CpuBackend::make_linear_float_int4(const View& w, QuantMode mode) {
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "make_linear: {} weights cannot be quantized to {} (f32, f16 or bf16)", dtype_name(w.dtype),
                  quant_mode_name(mode));
    const int64_t n = w.dim(0), k = w.dim(1);
    return make_linear_int4(quantize_weights_int4(w.data, w.dtype, n, k, kInt4Block).matrix(), mode);
}

bool cpu_keeps_kquant() {
    return int4_kquant_isa(detect_isa());
}

bool cpu_w8a8_keeps_onednn_copy() {
    return int8_uses_onednn(detect_isa());
}

double cpu_bf16_linear_bytes(int64_t n, int64_t k) {
    const IsaLevel isa = detect_isa();
    const double rows = double(n) * double(k) * 2;
    if (!gemm_bf16_dot_available(isa)) return rows;
    return double(packed_bf16_bytes(n, k)) + (int8_uses_onednn(isa) ? rows : 0);
}

// Packed once for the kernels (kernels/cpu/int4_gemm.h); the caller's unpacked copy can go.
Linear CpuBackend::make_linear_int4(const Int4Matrix& w, QuantMode mode) {
    LATTICE_CHECK(is_int4(mode), "make_linear_int4: quant mode {} has no 4-bit weights", quant_mode_name(mode));
    Linear l;
    l.n = w.n;
    l.k = w.k;
    l.mode = mode;
    l.weight_dtype = DType::kU8;
    // W4A8 keeps a GGUF K-quant linear's super-blocks (Q4_K, Q6_K) at the file's bits where the ISA can.
    auto packed = std::make_shared<PackedInt4>(pack_int4_weights(w, detect_isa(), mode == QuantMode::kW4A8));
    l.prepared_bytes = packed->bytes() + int64_t(packed->perm.size() * sizeof(int32_t));
    l.prepared = std::move(packed);
    return l;
}

Linear CpuBackend::make_linear_int8(const View& q, const View& scales, QuantMode mode) {
    LATTICE_CHECK(q.ndim == 2 && q.is_contiguous() && q.dtype == DType::kI8 && q.device == Device::kCpu,
                  "make_linear_int8: expected contiguous host i8 [n, k] weights, got {} {}", dtype_name(q.dtype),
                  q.shape_str());
    LATTICE_CHECK(mode == QuantMode::kW8A8 || mode == QuantMode::kW8A16,
                  "make_linear_int8: quant mode {} has no int8 "
                  "weights",
                  quant_mode_name(mode));
    Linear l;
    l.n = q.dim(0);
    l.k = q.dim(1);
    LATTICE_CHECK(scales.dtype == DType::kF32 && scales.numel() == l.n && scales.is_contiguous(),
                  "make_linear_int8: scales must be f32 [{}], got {} {}", l.n, dtype_name(scales.dtype),
                  scales.shape_str());
    const float* s = static_cast<const float*>(scales.data);
    for (int64_t i = 0; i < l.n; ++i)
        LATTICE_CHECK(std::isfinite(s[i]) && s[i] > 0,
                      "make_linear_int8: scale {} of channel {} is not positive "
                      "and finite",
                      s[i], i);
    l.mode = mode;
    l.scales = alloc_bytes(DType::kF32, View::contiguous(nullptr, DType::kF32, {l.n}));
    std::memcpy(l.scales.data(), scales.data, size_t(l.n) * sizeof(float));
    auto packed = std::make_shared<PackedInt8>(
        pack_int8_weights(static_cast<const int8_t*>(q.data), l.n, l.k, detect_isa(), mode == QuantMode::kW8A8));
    // The panels, the column sums and, where the provider gives the GEMMs at m >= 16 to oneDNN (the amx level by
    // default), its reordered copy beside them.
    l.aside_bytes = packed->onednn ? onednn_int8_bytes(*packed->onednn) : 0;
    l.prepared_bytes =
        int64_t(packed->data.size()) + int64_t(packed->col_sums.size() * sizeof(int32_t)) + l.aside_bytes;
    l.prepared = std::move(packed);
    l.weight_dtype = DType::kI8;
    return l;
}

Buffer CpuBackend::make_f32(const View& host) {
    Buffer b = alloc_bytes(DType::kF32, View::contiguous(nullptr, DType::kF32, {host.numel()}));
    LATTICE_CHECK(host.dtype == DType::kF32, "make_f32: expected f32 host data, got {}", dtype_name(host.dtype));
    std::memcpy(b.data(), host.data, size_t(host.bytes()));
    return b;
}

Buffer CpuBackend::make_table(const View& host) {
    LATTICE_CHECK(host.ndim == 2, "make_table: expected [rows, cols], got {}", host.shape_str());
    Buffer b = alloc_bytes(host.dtype, View::contiguous(nullptr, host.dtype, {host.dim(0), host.dim(1)}));
    std::memcpy(b.data(), host.data, size_t(host.bytes()));
    return b;
}

}  // namespace lattice
