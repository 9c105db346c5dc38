// The bf16-pair float GEMM (see gemm_bf16.h): packing, and the AVX-512 + AVX512_BF16 kernel by target attributes,
// chosen per call.
#include "kernels/cpu/gemm_bf16.h"

#include <algorithm>
#include <cstring>

#include "base/convert.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/isa_variants.h"

namespace lattice {

bool gemm_bf16_dot_available(IsaLevel isa) {
    return vector_level(isa) == IsaLevel::kAvx512Vnni && isa_supported(isa) && cpu_features().avx512bf16;
}

PackedBf16 pack_bf16_weights(const void* w, DType wt, int64_t n, int64_t k, ThreadPool* pool) {
    LATTICE_CHECK(wt == DType::kF32 || wt == DType::kF16 || wt == DType::kBF16,
                  "pack_bf16_weights: weight dtype {} is not float", dtype_name(wt));
    LATTICE_CHECK(n > 0 && k > 0, "pack_bf16_weights: [{}, {}]", n, k);
    PackedBf16 p;
    p.n = n;
    p.k = k;
    p.pairs = (k + 1) / 2;
    p.n_panels = (n + kBf16PanelN - 1) / kBf16PanelN;
    p.data.assign(size_t(packed_bf16_bytes(n, k)) / sizeof(uint16_t), 0);
    // With a oneDNN copy to make (onednn_int8.h) the matrix is converted to bf16 once, and both packings read that.
    const IsaLevel isa = detect_isa();
    const bool onednn = gemm_bf16_dot_available(isa) && int8_uses_onednn(isa);
    std::vector<uint16_t> rowmajor;
    if (onednn) {
        rowmajor.resize(static_cast<size_t>(n * k));
        convert_elements(w, wt, rowmajor.data(), DType::kBF16, n * k);
        w = rowmajor.data();
        wt = DType::kBF16;
    }
    const auto* wb = static_cast<const uint8_t*>(w);
    const int64_t es = dtype_size(wt);
    auto rows = [&](int64_t r0, int64_t r1, int) {
        std::vector<uint16_t> row(static_cast<size_t>(k));
        for (int64_t r = r0; r < r1; ++r) {
            convert_elements(wb + r * k * es, wt, row.data(), DType::kBF16, k);
            uint16_t* out = p.data.data() + (r / kBf16PanelN) * p.panel_elems() + (r % kBf16PanelN) * 2;
            for (int64_t c = 0; c < k; ++c) out[(c / 2) * kBf16PanelN * 2 + (c % 2)] = row[size_t(c)];
        }
    };
    if (pool)
        pool->parallel_for(n, rows, kBf16PanelN);
    else
        rows(0, n, 0);
    if (onednn) {
        std::string why;
        p.onednn = onednn_pack_bf16(rowmajor.data(), n, k, isa, &why);
        if (!p.onednn) LOG_INFO("bf16 GEMM: oneDNN not used for [{}, {}]: {}", n, k, why);
    }
    return p;
}

#if defined(__x86_64__)
// GCC 12's AVX-512 headers build some intrinsics on a self-initialized "undefined" register, which it reports as
// maybe-uninitialized once inlined under a target attribute.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace {

constexpr int64_t kRound = 32;  // rows of x are rounded 32 elements a step and padded with zeros to a multiple

// Rows [0, m) of x rounded to bf16 into xb (leading dimension kp, zeros past k).
LATTICE_TARGET_AVX512BF16 void round_rows(const float* x, int64_t m, int64_t k, int64_t kp, uint16_t* xb) {
    for (int64_t i = 0; i < m; ++i) {
        const float* xr = x + i * k;
        uint16_t* out = xb + i * kp;
        for (int64_t p = 0; p < kp; p += kRound) {
            const int64_t r = std::clamp<int64_t>(k - p, 0, kRound);
            const __mmask16 lo = __mmask16(r >= 16 ? 0xffff : (1u << r) - 1);
            const __mmask16 hi = __mmask16(r >= 32 ? 0xffff : r > 16 ? (1u << (r - 16)) - 1 : 0);
            const __m512 a = _mm512_maskz_loadu_ps(lo, xr + p);
            const __m512 b = _mm512_maskz_loadu_ps(hi, xr + p + 16);
            const __m512bh h = _mm512_cvtne2ps_pbh(b, a);  // a in the low half
            _mm512_storeu_si512(out + p, reinterpret_cast<const __m512i&>(h));
        }
    }
}

// MR rows of xb (leading dimension kp) by NB panels into y (leading dimension ldy; the last panel's first `last`
// channels). PF: prefetch the panels' streams into L2 (decode: they come from DRAM).
template <int MR, int NB, bool PF>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void tile(const uint16_t* xb, int64_t kp,
                                                                  const uint16_t* const* panels, int64_t pairs,
                                                                  float* y, int64_t ldy, int last) {
    constexpr int64_t kLine = kBf16PanelN * 2;  // elements of one pair of a panel: 64 bytes
    constexpr int64_t kAhead = 32;              // pairs (2 KiB of each stream) ahead, as the other decode GEMVs
    __m512 acc[MR][NB];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_setzero_ps();
    for (int64_t q = 0; q < pairs; ++q) {
        __m512i wv[NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
            if (PF) __builtin_prefetch(panels[b] + (q + kAhead) * kLine, 0, 2);
            wv[b] = _mm512_load_si512(panels[b] + q * kLine);
        }
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b) acc[i][b] = cpu::dot_pairs(acc[i][b], wv[b], xb + i * kp + 2 * q);
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
        for (int b = 0; b + 1 < NB; ++b) _mm512_storeu_ps(y + i * ldy + b * kBf16PanelN, acc[i][b]);
        _mm512_mask_storeu_ps(y + i * ldy + (NB - 1) * kBf16PanelN, __mmask16((uint32_t(1) << last) - 1),
                              acc[i][NB - 1]);
    }
}

template <int MR, bool PF>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void tile_nb(int nb, const uint16_t* xb, int64_t kp,
                                                                     const uint16_t* const* panels, int64_t pairs,
                                                                     float* y, int64_t ldy, int last) {
    switch (nb) {
        case 1:
            tile<MR, 1, PF>(xb, kp, panels, pairs, y, ldy, last);
            break;
        case 2:
            tile<MR, 2, PF>(xb, kp, panels, pairs, y, ldy, last);
            break;
        case 3:
            tile<MR, 3, PF>(xb, kp, panels, pairs, y, ldy, last);
            break;
        default:
            tile<MR, 4, PF>(xb, kp, panels, pairs, y, ldy, last);
            break;
    }
}

constexpr int kMR = 6, kNB = 4;

template <bool PF>
LATTICE_TARGET_AVX512BF16 void tile_any(int mr, int nb, const uint16_t* xb, int64_t kp, const uint16_t* const* panels,
                                        int64_t pairs, float* y, int64_t ldy, int last) {
    switch (mr) {
        case 1:
            tile_nb<1, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
        case 2:
            tile_nb<2, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
        case 3:
            tile_nb<3, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
        case 4:
            tile_nb<4, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
        case 5:
            tile_nb<5, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
        default:
            tile_nb<kMR, PF>(nb, xb, kp, panels, pairs, y, ldy, last);
            break;
    }
}

// Panels [p0, p1) for all m rows of xb: each group of kNB panels, then the rows over it.
void panel_range(const uint16_t* xb, int64_t m, int64_t kp, const PackedBf16& w, int64_t p0, int64_t p1, float* y) {
    const bool decode = m <= kMR;
    for (int64_t p = p0; p < p1; p += kNB) {
        const int nb = int(std::min<int64_t>(kNB, p1 - p));
        const uint16_t* panels[kNB];
        for (int b = 0; b < nb; ++b) panels[b] = w.panel(p + b);
        const int64_t c1 = std::min(w.n, (p + nb) * kBf16PanelN);
        const int last = int(c1 - (p + nb - 1) * kBf16PanelN);
        for (int64_t i = 0; i < m; i += kMR) {
            const int mr = int(std::min<int64_t>(kMR, m - i));
            float* yt = y + i * w.n + p * kBf16PanelN;
            if (decode)
                tile_any<true>(mr, nb, xb + i * kp, kp, panels, w.pairs, yt, w.n, last);
            else
                tile_any<false>(mr, nb, xb + i * kp, kp, panels, w.pairs, yt, w.n, last);
        }
    }
}

}  // namespace
#pragma GCC diagnostic pop
#endif

void gemm_bf16_dot(const float* x, int64_t m, const PackedBf16& w, float* y, ThreadPool& pool) {
    // The level was decided at packing (isa.h: an override reaches packed GEMMs from their next packing).
    LATTICE_CHECK(gemm_bf16_dot_available(IsaLevel::kAvx512Vnni),
                  "gemm_bf16_dot: the bf16-pair GEMM needs a CPU with AVX-512 and AVX512_BF16 (this one has{} {})",
                  isa_supported(IsaLevel::kAvx512Vnni) ? "" : " no AVX-512 VNNI and",
                  cpu_features().avx512bf16 ? "AVX512_BF16" : "no AVX512_BF16");
    LATTICE_CHECK(m >= 0, "gemm_bf16_dot: m {}", m);
#if defined(__x86_64__)
    note_path(KernelFamily::kGemmF32, IsaLevel::kAvx512Vnni);
    if (m == 0) return;
    const int64_t kp = (w.k + kRound - 1) / kRound * kRound;
    thread_local std::vector<uint16_t> xb;
    xb.resize(size_t(m * kp));
    round_rows(x, m, w.k, kp, xb.data());
    const uint16_t* xr = xb.data();
    if (w.onednn && m >= kInt8OnednnMinM && onednn_bf16_gemm(xr, m, kp, *w.onednn, y, pool)) return;
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { panel_range(xr, m, kp, w, p0, p1, y); });
#endif
}

}  // namespace lattice
