// K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 elements each) dequantized to f32, and Q4_K repacked as 4-bit
// affine groups of 32 (kernels/common/int4.h) for a 4-bit run. Layouts, arithmetic order and the repack's one
// rounding are in dequant.h. Scalar on purpose like dequant.cpp: load time only, clarity over speed.
#include <cstring>

#include "base/error.h"
#include "kernels/common/byte_loads.h"
#include "kernels/common/int4.h"
#include "runtime/weights/dequant.h"

namespace lattice {

namespace {

constexpr int64_t kSuper = 256;

// Element t (0..31) of sub-block j of a Q4_K / Q5_K super-block's 128 nibble bytes.
int nibble(const uint8_t* qs, int j, int t) {
    const uint8_t b = qs[(j / 2) * 32 + t];
    return j % 2 == 0 ? b & 15 : b >> 4;
}

// Q4_K and Q5_K (qh null for Q4_K): value = (d * sc) * q - (dmin * mn).
void dequant_k_affine(const uint8_t* blocks, float* out, int64_t n, bool five) {
    const int64_t bytes = five ? 176 : 144;
    for (int64_t b = 0; b < n / kSuper; ++b) {
        const uint8_t* p = blocks + b * bytes;
        const float d = f16_to_f32(load_u16(p)), dmin = f16_to_f32(load_u16(p + 2));
        const uint8_t* scales = p + 4;
        const uint8_t* qh = five ? p + 16 : nullptr;
        const uint8_t* qs = five ? p + 48 : p + 16;
        for (int j = 0; j < 8; ++j) {
            int sc = 0, mn = 0;
            q4k_scale_min(scales, j, &sc, &mn);
            const float dj = d * float(sc), mj = dmin * float(mn);
            float* o = out + b * kSuper + j * 32;
            for (int t = 0; t < 32; ++t) {
                const int q = nibble(qs, j, t) | (qh ? ((qh[t] >> j) & 1) << 4 : 0);
                o[t] = dj * float(q) - mj;
            }
        }
    }
}

}  // namespace

void dequant_q4_k(const uint8_t* blocks, float* out, int64_t n) {
    dequant_k_affine(blocks, out, n, false);
}
void dequant_q5_k(const uint8_t* blocks, float* out, int64_t n) {
    dequant_k_affine(blocks, out, n, true);
}

void dequant_q6_k(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kSuper; ++b) {
        const uint8_t* p = blocks + b * 210;
        const uint8_t* ql = p;
        const uint8_t* qh = p + 128;
        const auto* scales = reinterpret_cast<const int8_t*>(p + 192);
        const float d = f16_to_f32(load_u16(p + 208));
        float* o = out + b * kSuper;
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, r = e % 128;
            const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 15;
            const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            o[e] = (d * float(scales[e / 16])) * float((lo | hi << 4) - 32);
        }
    }
}

int64_t q4_k_to_int4(const uint8_t* blocks, int64_t n, uint8_t* qs, uint16_t* d, uint16_t* m) {
    for (int64_t b = 0; b < n / kSuper; ++b) {
        const uint8_t* p = blocks + b * 144;
        const float sd = f16_to_f32(load_u16(p)), sdmin = f16_to_f32(load_u16(p + 2));
        const uint8_t* nib = p + 16;
        for (int j = 0; j < 8; ++j) {
            const int64_t g = b * 8 + j;
            int sc = 0, mn = 0;
            q4k_scale_min(p + 4, j, &sc, &mn);
            d[g] = f32_to_f16(sd * float(sc));
            m[g] = f32_to_f16(-(sdmin * float(mn)));
            if ((d[g] & 0x7C00) == 0x7C00 || (m[g] & 0x7C00) == 0x7C00) return g;
            // int4.h: byte i holds element i (low nibble) and element 16 + i (high nibble) of the group.
            uint8_t* o = qs + g * 16;
            for (int i = 0; i < 16; ++i) o[i] = uint8_t(nibble(nib, j, i) | nibble(nib, j, 16 + i) << 4);
        }
    }
    return -1;
}

}  // namespace lattice
