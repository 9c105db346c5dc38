// The paged KV cache's rows for the CPU attention (layout: attention.cpp's header and KvLayout in
// attention_internal.h): storing a step's tokens (converted to the cache's dtype, int8 quantized per token and
// kv head) and reading rows and K tiles back as f32 where a tile is not read in place (f16 caches, block sizes
// that are not a multiple of the tile). The readers have ISA variants (isa_variants.h); F16C converts f16 at
// the avx2 and avx512 levels, the portable conversion at the scalar level (the same values: both are exact).
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/error.h"
#include "kernels/common/quantize.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/isa_variants.h"

namespace lattice::cpu::attn {

namespace {

// One token's k or v head (hd floats) into its cache row (an int8 row's scale into *scale).
void store_row(uint8_t* dst, uint8_t* scale_dst, const float* x, int64_t hd, DType dt) {
    switch (dt) {
        case DType::kF32:
            std::memcpy(dst, x, size_t(hd) * 4);
            return;
        case DType::kF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = f32_to_f16(x[d]);
                std::memcpy(dst + 2 * d, &h, 2);
            }
            return;
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = f32_to_bf16(x[d]);
                std::memcpy(dst + 2 * d, &h, 2);
            }
            return;
        case DType::kI8: {
            const float scale = quantize_row_int8(x, hd, reinterpret_cast<int8_t*>(dst));
            std::memcpy(scale_dst, &scale, 4);
            return;
        }
        default:
            LATTICE_FAIL("attention: a KV cache of {} is not supported", dtype_name(dt));
    }
}

// One token's k head (hd floats) into its cache column: element d at dst + d * stride (the K block of a
// kv head is [head_dim][block_size], transposed); an int8 column's scale into *scale_dst.
void store_column(uint8_t* dst, int64_t stride, uint8_t* scale_dst, const float* x, int64_t hd, DType dt,
                  std::vector<int8_t>& q8) {
    switch (dt) {
        case DType::kF32:
            for (int64_t d = 0; d < hd; ++d) std::memcpy(dst + d * stride, x + d, 4);
            return;
        case DType::kF16:
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = dt == DType::kF16 ? f32_to_f16(x[d]) : f32_to_bf16(x[d]);
                std::memcpy(dst + d * stride, &h, 2);
            }
            return;
        case DType::kI8: {
            q8.resize(size_t(hd));
            const float scale = quantize_row_int8(x, hd, q8.data());
            for (int64_t d = 0; d < hd; ++d) dst[d * stride] = uint8_t(q8[size_t(d)]);
            std::memcpy(scale_dst, &scale, 4);
            return;
        }
        default:
            LATTICE_FAIL("attention: a KV cache of {} is not supported", dtype_name(dt));
    }
}

#if defined(__x86_64__)
// f16 -> f32 by the F16C instruction (exact, as f16_to_f32), 8 at a time: the compiler does not
// vectorize the bit manipulation of the portable conversion.
__attribute__((target("avx2,f16c"))) void f16_row_f16c(float* out, const uint8_t* src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
    for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
    }
}
#else
void f16_row_f16c(float*, const uint8_t*, int64_t) {}
#endif

// load_row of attention_internal.h; kF16c: convert f16 by F16C (the avx2 and avx512 levels have it).
template <bool kF16c>
[[gnu::always_inline]] inline void load_row_body(float* __restrict out, const uint8_t* __restrict src,
                                                 const uint8_t* scale_src, int64_t hd, DType dt) {
    switch (dt) {
        case DType::kF32:
            std::memcpy(out, src, size_t(hd) * 4);
            return;
        case DType::kF16:
            if (kF16c) return f16_row_f16c(out, src, hd);
            for (int64_t d = 0; d < hd; ++d) {
                uint16_t h;
                std::memcpy(&h, src + 2 * d, 2);
                out[d] = f16_to_f32(h);
            }
            return;
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                uint16_t h;
                std::memcpy(&h, src + 2 * d, 2);
                out[d] = bf16_to_f32(h);
            }
            return;
        default: {  // kI8 (checked when stored and on entry)
            float scale;
            std::memcpy(&scale, scale_src, 4);
            const int8_t* q = reinterpret_cast<const int8_t*>(src);
            for (int64_t d = 0; d < hd; ++d) out[d] = float(q[d]) * scale;
        }
    }
}

// load_k_tile of attention_internal.h.
template <bool kF16c>
[[gnu::always_inline]] inline void load_k_tile_body(float* __restrict kt, const uint8_t* __restrict kc,
                                                    int64_t stride, const float* __restrict scales, int64_t jn,
                                                    int64_t hd, DType dt) {
    for (int64_t d = 0; d < hd; ++d) {
        float* o = kt + d * kTile;
        const uint8_t* src = kc + d * stride;
        switch (dt) {
            case DType::kF32:
                std::memcpy(o, src, size_t(jn) * 4);
                break;
            case DType::kF16:
                if (kF16c) {
                    f16_row_f16c(o, src, jn);
                    break;
                }
                for (int64_t j = 0; j < jn; ++j) {
                    uint16_t h;
                    std::memcpy(&h, src + 2 * j, 2);
                    o[j] = f16_to_f32(h);
                }
                break;
            case DType::kBF16:
                for (int64_t j = 0; j < jn; ++j) {
                    uint16_t h;
                    std::memcpy(&h, src + 2 * j, 2);
                    o[j] = bf16_to_f32(h);
                }
                break;
            default: {
                const int8_t* q = reinterpret_cast<const int8_t*>(src);
                for (int64_t j = 0; j < jn; ++j) o[j] = float(q[j]) * scales[j];
            }
        }
        for (int64_t j = jn; j < kTile; ++j) o[j] = 0.0f;
    }
}


#define LATTICE_READER_ARGS_ROW float *out, const uint8_t *src, const uint8_t *scale_src, int64_t hd, DType dt
void load_row_scalar(LATTICE_READER_ARGS_ROW) { load_row_body<false>(out, src, scale_src, hd, dt); }
LATTICE_TARGET_AVX2 void load_row_avx2(LATTICE_READER_ARGS_ROW) { load_row_body<true>(out, src, scale_src, hd, dt); }
LATTICE_TARGET_AVX512 void load_row_avx512(LATTICE_READER_ARGS_ROW) {
    load_row_body<true>(out, src, scale_src, hd, dt);
}
#define LATTICE_READER_ARGS_K \
    float *kt, const uint8_t *kc, int64_t stride, const float *scales, int64_t jn, int64_t hd, DType dt
void load_k_tile_scalar(LATTICE_READER_ARGS_K) { load_k_tile_body<false>(kt, kc, stride, scales, jn, hd, dt); }
LATTICE_TARGET_AVX2 void load_k_tile_avx2(LATTICE_READER_ARGS_K) {
    load_k_tile_body<true>(kt, kc, stride, scales, jn, hd, dt);
}
LATTICE_TARGET_AVX512 void load_k_tile_avx512(LATTICE_READER_ARGS_K) {
    load_k_tile_body<true>(kt, kc, stride, scales, jn, hd, dt);
}
#undef LATTICE_READER_ARGS_ROW
#undef LATTICE_READER_ARGS_K
constexpr IsaVariants<decltype(&load_row_scalar)> load_row_variants{load_row_scalar, load_row_avx2, load_row_avx512};
constexpr IsaVariants<decltype(&load_k_tile_scalar)> load_k_tile_variants{load_k_tile_scalar, load_k_tile_avx2,
                                                                           load_k_tile_avx512};

}  // namespace

// One cache element as a float (int8 times `scale`).
float load_element(const uint8_t* src, float scale, DType dt) {
    uint16_t h;
    switch (dt) {
        case DType::kF32: {
            float x;
            std::memcpy(&x, src, 4);
            return x;
        }
        case DType::kF16:
            std::memcpy(&h, src, 2);
            return f16_to_f32(h);
        case DType::kBF16:
            std::memcpy(&h, src, 2);
            return bf16_to_f32(h);
        default:
            return float(*reinterpret_cast<const int8_t*>(src)) * scale;
    }
}

CacheReaders cache_readers(IsaLevel isa) { return {load_row_variants.at(isa), load_k_tile_variants.at(isa)}; }

KvLayout kv_layout(void* k_cache, void* v_cache, const AttentionArgs& a) {
    const int64_t es = a.kv_dtype == DType::kI8 ? 1 : int64_t(dtype_size(a.kv_dtype));
    return KvLayout{static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache), a.block_tables, a.table_width,
                    a.block_size, a.n_kv, a.head_dim, kv_row_bytes(a.kv_dtype, a.head_dim), es, a.head_dim * es};
}

void store_tokens(const KvLayout& c, const float* qkv, const int32_t* positions, const int32_t* seqs, int64_t m,
                  const AttentionArgs& a) {
    const int64_t hd = c.hd, nh = a.n_heads, nkv = c.nkv, row = (nh + 2 * nkv) * hd;
    std::vector<int8_t> q8;
    for (int64_t t = 0; t < m; ++t)
        for (int64_t g = 0; g < nkv; ++g) {
            const int64_t s = seqs[t], p = positions[t];
            store_column(c.k_column(s, p, g), c.B * c.es, reinterpret_cast<uint8_t*>(c.row_scale(c.k_cache, s, p, g)),
                         qkv + t * row + (nh + g) * hd, hd, a.kv_dtype, q8);
            store_row(c.v_row(s, p, g), reinterpret_cast<uint8_t*>(c.row_scale(c.v_cache, s, p, g)),
                      qkv + t * row + (nh + nkv + g) * hd, hd, a.kv_dtype);
        }
}

}  // namespace lattice::cpu::attn
