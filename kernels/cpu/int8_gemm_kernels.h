// Internal interface between int8_gemm.cpp (dispatch, activation prep, threading) and the per-ISA
// kernel files (int8_gemm_ref.cpp, _avx2.cpp, _avxvnni.cpp, _avx512.cpp, _amx_avx512.cpp). Not for use outside
// them but by the kernel tests (the AMX kernel on its tile model).
//
// Each *_panels function computes all m rows for output panels [p0, p1) of the packed weights
// (layout in int8_gemm.h) and writes through the epilogue. Prepared activations, row-major with
// leading dimension lda >= k_padded and zero padding past k:
//   scalar: int8 a;  avx2: int16 a (sign-extended);  avxvnni / avx512: uint8 a + 128 (then the
//   kernel subtracts 128 * col_sums).
// Epilogue: y == nullptr -> c[r * ldc + j] = int32 sum; else
//   y[r * ldy + j] = float(sum) * (row_scales[r] * col_scales[j])   (W8A8; identical on every path).
// W8A16 kernels read x (f32, ldx >= k_padded, zero past k) and write y = acc * scales[j].
#pragma once

#include <cstdint>

#include "kernels/cpu/int8_gemm.h"

namespace lattice::int8_detail {

struct Int8Epilogue {
    int32_t* c = nullptr;
    int64_t ldc = 0;
    float* y = nullptr;
    int64_t ldy = 0;
    const float* row_scales = nullptr;  // [m]
    const float* col_scales = nullptr;  // [n]
};

// Writes one row's 16 corrected int32 sums of panel p (only channels < n) through the epilogue.
inline void store_panel_row(const int32_t* s16, int64_t r, int64_t p, int64_t n, const Int8Epilogue& ep) {
    int64_t j0 = p * kInt8PanelN;
    int64_t cnt = n - j0 < kInt8PanelN ? n - j0 : kInt8PanelN;
    if (ep.y) {
        float rs = ep.row_scales[r];
        float* y = ep.y + r * ep.ldy + j0;
        for (int64_t j = 0; j < cnt; ++j) y[j] = float(s16[j]) * (rs * ep.col_scales[j0 + j]);
    } else {
        int32_t* c = ep.c + r * ep.ldc + j0;
        for (int64_t j = 0; j < cnt; ++j) c[j] = s16[j];
    }
}

void s8_panels_scalar(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                      const Int8Epilogue& ep);
void s8_panels_avx2(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                    const Int8Epilogue& ep);
void s8_panels_avxvnni(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                       const Int8Epilogue& ep);
void s8_panels_avx512(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                      const Int8Epilogue& ep);
// AMX-INT8 tiles (int8_gemm_amx_avx512.cpp), any m >= 1 (the front sends m >= kInt8AmxMinM): the avx512 operand
// form, lda >= k_padded rounded up to 64 (a row's bytes past k_padded are read and meet zero weights). Only where
// isa_supported(kAmx).
void s8_panels_amx(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                   const Int8Epilogue& ep);
// The same kernel on the software tile model (amx_tiles.h): the tests' way to run it without AMX (AVX-512 needed
// for its epilogue). Slow; never on the engine's path.
void s8_panels_amx_model(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                         const Int8Epilogue& ep);

// quantize_row_int8 (quantize.h) in AVX2, bit-identical results; for CPUs with at least kAvx2.
float quantize_row_int8_avx2(const float* x, int64_t k, int8_t* q);

void w8a16_panels_scalar(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                         int64_t p0, int64_t p1, float* y, int64_t ldy);
void w8a16_panels_avx2(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                       int64_t p0, int64_t p1, float* y, int64_t ldy);
void w8a16_panels_avx512(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                         int64_t p0, int64_t p1, float* y, int64_t ldy);

}  // namespace lattice::int8_detail
