// Register-tiled float GEMM body shared by the AVX2 and AVX-512 translation units (each includes
// this header after defining a vector-traits struct V, and is compiled with its own ISA flags).
// Tile: MR rows of x by NR weight rows, MR x NR vector accumulators reduced horizontally at the end.
// Decode (m <= 4) converts weights on the fly (bandwidth bound); prefill converts a panel of NR
// weight rows to fp32 once per chunk of Mc activation rows (sized so the chunk of x stays in L2),
// then reuses it across the chunk. K tails go through a zero-padded stack copy.
#pragma once

#include "base/dtype.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace lattice::detail {

template <class V, DType WT>
inline typename V::reg load_w(const void* row, int64_t p) {
    if constexpr (WT == DType::kF32) return V::load_f32(static_cast<const float*>(row) + p);
    else if constexpr (WT == DType::kF16) return V::load_f16(static_cast<const uint16_t*>(row) + p);
    else return V::load_bf16(static_cast<const uint16_t*>(row) + p);
}

template <DType WT>
inline float scalar_w(const void* row, int64_t p) {
    if constexpr (WT == DType::kF32) return static_cast<const float*>(row)[p];
    else if constexpr (WT == DType::kF16) return f16_to_f32(static_cast<const uint16_t*>(row)[p]);
    else return bf16_to_f32(static_cast<const uint16_t*>(row)[p]);
}

template <class V, DType WT, int MR, int NR, bool PF>
inline void tile(const float* x, int64_t k, const void* const* wrows, float* y, int64_t ldy) {
    constexpr int W = V::kWidth;
    typename V::reg acc[MR][NR];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
    int64_t p = 0;
    constexpr int64_t kPrefetchElems = 2048 / int64_t(sizeof(float));  // ~2 KiB of fp32 ahead
    for (; p + W <= k; p += W) {
        typename V::reg wv[NR];
        // Software prefetch of each weight stream: decode reads every weight once from DRAM and
        // the hardware prefetcher alone does not keep NR concurrent streams fed. Into L2 (prefetcht1): into L1
        // the requests held the L1's few miss buffers (bf16-weight decode of the 1.1B shape on Zen 4: 9.6-11.0
        // -> 12.6-13.9 tok/s, docs/benchmark-results.md 2026-12-07; decode attention likewise).
        if (PF && p + kPrefetchElems < k)
            for (int j = 0; j < NR; ++j)
                __builtin_prefetch(static_cast<const char*>(wrows[j]) + (p + kPrefetchElems) * int64_t(dtype_size(WT)),
                                   0, 2);
        for (int j = 0; j < NR; ++j) wv[j] = load_w<V, WT>(wrows[j], p);
        for (int i = 0; i < MR; ++i) {
            typename V::reg xv = V::load_f32(x + i * k + p);
            for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
        }
    }
    if (p < k) {
        const int64_t r = k - p;
        alignas(64) float wt[NR][W];
        alignas(64) float xt[W];
        for (int j = 0; j < NR; ++j)
            for (int q = 0; q < W; ++q) wt[j][q] = q < r ? scalar_w<WT>(wrows[j], p + q) : 0.0f;
        typename V::reg wv[NR];
        for (int j = 0; j < NR; ++j) wv[j] = V::load_f32(wt[j]);
        for (int i = 0; i < MR; ++i) {
            for (int q = 0; q < W; ++q) xt[q] = q < r ? x[i * k + p + q] : 0.0f;
            typename V::reg xv = V::load_f32(xt);
            for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) y[i * ldy + j] = V::reduce(acc[i][j]);
}

// Dispatch the runtime MR (1..4) and NR (1..V::kNR) onto the templates.
template <class V, DType WT, int MR, bool PF>
inline void tile_nr(int nr, const float* x, int64_t k, const void* const* wrows, float* y, int64_t ldy) {
    static_assert(V::kNR == 4 || V::kNR == 2);
    switch (nr) {
        case 1: tile<V, WT, MR, 1, PF>(x, k, wrows, y, ldy); break;
        case 2: tile<V, WT, MR, 2, PF>(x, k, wrows, y, ldy); break;
        case 3:
            if constexpr (V::kNR >= 3) tile<V, WT, MR, 3, PF>(x, k, wrows, y, ldy);
            break;
        default:
            if constexpr (V::kNR >= 4) tile<V, WT, MR, 4, PF>(x, k, wrows, y, ldy);
            break;
    }
}

// PF: prefetch the weight streams (weights come from DRAM); off for an L2-resident converted panel.
template <class V, DType WT, bool PF>
inline void tile_any(int mr, int nr, const float* x, int64_t k, const void* const* wrows, float* y, int64_t ldy) {
    switch (mr) {
        case 1: tile_nr<V, WT, 1, PF>(nr, x, k, wrows, y, ldy); break;
        case 2: tile_nr<V, WT, 2, PF>(nr, x, k, wrows, y, ldy); break;
        case 3: tile_nr<V, WT, 3, PF>(nr, x, k, wrows, y, ldy); break;
        default: tile_nr<V, WT, 4, PF>(nr, x, k, wrows, y, ldy); break;
    }
}

template <class V, DType WT>
void gemm_rows(const float* x, int64_t m, int64_t k, const void* w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
    constexpr int NR = V::kNR;
    const int64_t es = dtype_size(WT);
    const auto* wb = static_cast<const uint8_t*>(w);
    if (m <= 4 || WT == DType::kF32) {
        // Stream weights once per chunk of rows; for m <= 4 that is exactly once.
        const int64_t mc = std::max<int64_t>(4, std::min<int64_t>(64, (int64_t(128) << 10) / std::max<int64_t>(k, 1)) / 4 * 4);
        for (int64_t i0 = 0; i0 < m; i0 += mc) {
            const int64_t i1 = std::min(m, i0 + mc);
            for (int64_t j = n0; j < n1; j += NR) {
                const int nr = int(std::min<int64_t>(NR, n1 - j));
                const void* rows[NR];
                for (int q = 0; q < nr; ++q) rows[q] = wb + (j + q) * k * es;
                for (int64_t i = i0; i < i1; i += 4) {
                    const int mr = int(std::min<int64_t>(4, i1 - i));
                    tile_any<V, WT, true>(mr, nr, x + i * k, k, rows, y + i * ldy + j, ldy);
                }
            }
        }
        return;
    }
    // Prefill with 16-bit weights: convert an NR-row panel to fp32 once per chunk of x rows.
    thread_local std::vector<float> panel;
    panel.resize(size_t(NR * k));
    const int64_t mc = std::max<int64_t>(4, std::min<int64_t>(256, (int64_t(128) << 10) / std::max<int64_t>(k, 1)) / 4 * 4);
    for (int64_t i0 = 0; i0 < m; i0 += mc) {
        const int64_t i1 = std::min(m, i0 + mc);
        for (int64_t j = n0; j < n1; j += NR) {
            const int nr = int(std::min<int64_t>(NR, n1 - j));
            const void* rows[NR];
            for (int q = 0; q < nr; ++q) {
                float* dst = panel.data() + q * k;
                const void* src = wb + (j + q) * k * es;
                for (int64_t p = 0; p < k; ++p) dst[p] = scalar_w<WT>(src, p);
                rows[q] = dst;
            }
            for (int64_t i = i0; i < i1; i += 4) {
                const int mr = int(std::min<int64_t>(4, i1 - i));
                tile_any<V, DType::kF32, false>(mr, nr, x + i * k, k, rows, y + i * ldy + j, ldy);
            }
        }
    }
}

// Small k (a LoRA adapter's B^T, k = its rank): vectors run along n instead of k (W outputs of a row at a time
// from a transposed copy of W weight rows), so no output pays a horizontal sum (the tile above, at k = 16, spent
// most of its time in them). Each output is one fma chain over p = 0 .. k - 1 from zero, whatever m, the row or
// the column chunk: the results do not depend on the batch.
constexpr int64_t kSmallK = 16;

template <class V, DType WT>
void gemm_rows_small_k(const float* x, int64_t m, int64_t k, const void* w, int64_t n0, int64_t n1, float* y,
                       int64_t ldy) {
    constexpr int W = V::kWidth;
    const int64_t es = dtype_size(WT);
    alignas(64) float wt[kSmallK][W];
    alignas(64) float out[W];
    for (int64_t j = n0; j < n1; j += W) {
        const int nw = int(std::min<int64_t>(W, n1 - j));
        for (int64_t p = 0; p < k; ++p)
            for (int q = 0; q < W; ++q)
                wt[p][q] = q < nw ? scalar_w<WT>(static_cast<const uint8_t*>(w) + (j + q) * k * es, p) : 0.0f;
        for (int64_t i = 0; i < m; ++i) {
            const float* xr = x + i * k;
            typename V::reg acc = V::zero();
            for (int64_t p = 0; p < k; ++p) acc = V::fma(V::set1(xr[p]), V::load_f32(wt[p]), acc);
            if (nw == W) {
                V::store(y + i * ldy + j, acc);
            } else {
                V::store(out, acc);
                for (int q = 0; q < nw; ++q) y[i * ldy + j + q] = out[q];
            }
        }
    }
}

template <class V>
void gemm_rows_any(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
    if (k <= kSmallK) {
        switch (wt) {
            case DType::kF32: gemm_rows_small_k<V, DType::kF32>(x, m, k, w, n0, n1, y, ldy); break;
            case DType::kF16: gemm_rows_small_k<V, DType::kF16>(x, m, k, w, n0, n1, y, ldy); break;
            default: gemm_rows_small_k<V, DType::kBF16>(x, m, k, w, n0, n1, y, ldy); break;
        }
        return;
    }
    switch (wt) {
        case DType::kF32: gemm_rows<V, DType::kF32>(x, m, k, w, n0, n1, y, ldy); break;
        case DType::kF16: gemm_rows<V, DType::kF16>(x, m, k, w, n0, n1, y, ldy); break;
        default: gemm_rows<V, DType::kBF16>(x, m, k, w, n0, n1, y, ldy); break;
    }
}

}  // namespace lattice::detail
