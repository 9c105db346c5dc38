// 4-bit GEMM front end: dequantization, packing (the unpacked form's checks and float -> 4-bit quantization are
// kernels/common/int4_quantize.h's, shared with the converter),
// per-call activation preparation (quantize once per row, group sums) and the split of output panels across
// the thread pool. Kernels live in int4_gemm_{ref,avx2,avx512,kq*,amx_avx512}.cpp; layout and numerics in
// int4_gemm.h.
// Activation scratch is a thread_local buffer of the calling thread, grown on demand (no per-call
// allocation once warm); pool workers only read it while the caller waits in parallel_for.
#include "kernels/cpu/int4_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/common/quantize.h"
#include "kernels/cpu/gemm_front.h"
#include "kernels/cpu/int4_gemm_kernels.h"
#include "kernels/cpu/int8_gemm_kernels.h"

namespace lattice {

using gemm_front::for_rows;
using gemm_front::scratch;
using gemm_front::ScratchVec;

using int4_detail::F32Acts;
using int4_detail::Int4Acts;

namespace {

int64_t round_up(int64_t v, int64_t to) {
    return (v + to - 1) / to * to;
}

// Bytes of the per-kind extra field of a block (int4_gemm.h).
int64_t extra_bytes(Int4Kind kind) {
    return kind == Int4Kind::kOffset8 ? 0 : 32;
}

void check_packed(const PackedInt4& w, int64_t k, const char* fn) {
    LATTICE_CHECK(!w.data.empty() && w.n > 0 && w.k > 0, "{}: weights are not packed (empty PackedInt4)", fn);
    LATTICE_CHECK(k == w.k, "{}: activation k = {} but packed weights have k = {}", fn, k, w.k);
    LATTICE_CHECK(isa_supported(w.isa), "{}: weights packed for ISA '{}' which this CPU does not support", fn,
                  isa_name(w.isa));
}

}  // namespace

bool int4_kquant_isa(IsaLevel isa) {
    const IsaLevel level = vector_level(isa);
    return level == IsaLevel::kScalar || level == IsaLevel::kAvx512Vnni;
}

std::string int4_prefill_kernel(IsaLevel isa) {
    if (isa == IsaLevel::kAmx) return "lattice's AMX-INT8 tiles";
    return fmt::format("lattice's {} kernel", isa_name(vector_level(isa)));
}

PackedInt4 pack_int4_weights(const Int4Matrix& w, IsaLevel isa, bool kquant) {
    const bool kq = kquant && int4_kquant_isa(isa) && int4_detail::kq_packable(w);
    if (w.kquant_only()) {  // super-blocks alone (read_kquant): the K-quant layout or nothing
        LATTICE_CHECK(w.n > 0 && w.k > 0 && w.k <= kInt4MaxK && w.n <= (int64_t(1) << 31),
                      "pack_int4_weights: K-quant weights of shape [{}, {}]", w.n, w.k);
        LATTICE_CHECK(kq,
                      "pack_int4_weights: weights given as K-quant super-blocks only, which the {} {} cannot "
                      "pack (the K-quant layout needs W4A8 on the scalar or AVX-512 kernels, 256-column blocks, "
                      "and every part but the last in whole panels of 16 rows)",
                      isa_name(isa), kquant ? "kernels" : "W4A16 packing");
    } else {
        check_int4_matrix(w, "pack_int4_weights");
    }
    LATTICE_CHECK(isa_supported(isa), "pack_int4_weights: ISA '{}' not supported by this CPU", isa_name(isa));
    PackedInt4 p;
    p.n = w.n;
    p.k = w.k;
    p.group = w.group;
    p.k_padded = w.k_padded();
    p.groups = w.groups();
    p.n_panels = (w.n + kInt8PanelN - 1) / kInt8PanelN;
    p.kind = w.kind;
    p.isa = isa;
    if (kq) {
        p.group = kInt4Block;
        p.k_padded = w.k;
        p.groups = w.k / kInt4Block;
        int4_detail::pack_kq(w, p);
        return p;
    }
    p.block_bytes = 8 * w.group + 32 + extra_bytes(w.kind);
    p.data.assign(size_t(p.n_panels * p.groups * p.block_bytes), 0);
    if (w.perm) p.perm.assign(w.perm, w.perm + w.k);
    const int64_t row_bytes = p.k_padded / 2, subs = w.group / kInt4Block;
    for (int64_t panel = 0; panel < p.n_panels; ++panel) {
        const int64_t rows = std::min<int64_t>(kInt8PanelN, w.n - panel * kInt8PanelN);
        for (int64_t g = 0; g < p.groups; ++g) {
            uint8_t* blk = p.data.data() + (panel * p.groups + g) * p.block_bytes;
            for (int64_t j = 0; j < rows; ++j) {
                const int64_t row = panel * kInt8PanelN + j;
                const uint8_t* src = w.qs + row * row_bytes + g * subs * 16;
                for (int64_t s = 0; s < subs; ++s)
                    for (int c = 0; c < 4; ++c) std::memcpy(blk + s * 256 + c * 64 + j * 4, src + s * 16 + c * 4, 4);
                const int64_t gi = row * p.groups + g;
                std::memcpy(blk + int4_detail::scale_offset(w.group) + 2 * j, &w.d[gi], 2);
                if (w.kind == Int4Kind::kAffine)
                    std::memcpy(blk + int4_detail::extra_offset(w.group) + 2 * j, &w.m[gi], 2);
                if (w.kind == Int4Kind::kZeroPoint) blk[int4_detail::extra_offset(w.group) + j] = w.z[gi];
            }
        }
    }
    return p;
}

void dequantize_packed_int4(const PackedInt4& w, float* out) {
    LATTICE_CHECK(!w.data.empty() && out, "dequantize_packed_int4: empty weights or null output");
    if (w.kq) {
        for (int64_t row = 0; row < w.n; ++row)
            for (int64_t col = 0; col < w.k; ++col)
                out[row * w.k + col] = int4_detail::kq_value(w, row / kInt8PanelN, int(row % kInt8PanelN), col);
        return;
    }
    for (int64_t row = 0; row < w.n; ++row) {
        const int64_t p = row / kInt8PanelN, j = row % kInt8PanelN;
        for (int64_t col = 0; col < w.k; ++col) {
            const int64_t g = col / w.group, in = col % w.group, s = in / kInt4Block, i = in % kInt4Block;
            const uint8_t* blk = w.block(p, g);
            const uint8_t b = blk[s * 256 + (i % 16) / 4 * 64 + j * 4 + i % 4];
            const int32_t q = i < 16 ? (b & 15) : (b >> 4);
            uint16_t h;
            std::memcpy(&h, blk + int4_detail::scale_offset(w.group) + 2 * j, 2);
            const float d = f16_to_f32(h);
            float v = 0.0f;
            switch (w.kind) {
                case Int4Kind::kOffset8:
                    v = float(q - 8) * d;
                    break;
                case Int4Kind::kZeroPoint:
                    v = float(q - int32_t(blk[int4_detail::extra_offset(w.group) + j])) * d;
                    break;
                case Int4Kind::kAffine:
                    std::memcpy(&h, blk + int4_detail::extra_offset(w.group) + 2 * j, 2);
                    v = float(q) * d + f16_to_f32(h);
                    break;
            }
            out[row * w.k + (w.perm.empty() ? col : w.perm[size_t(col)])] = v;
        }
    }
}

namespace {

// The 4-bit kernels have scalar, AVX2 and AVX-512 forms: vector_level of the packed level (AVX-VNNI runs the
// AVX2 kernels: vpmaddubsw cannot saturate on 4-bit; AMX the AVX-512 ones).
template <class Fn>
Fn kernel_for(IsaLevel packed, Fn scalar, Fn avx2, Fn avx512) {
    const IsaLevel level = vector_level(packed);
    note_path(KernelFamily::kGemmInt4, level);
    return level == IsaLevel::kAvx512Vnni ? avx512 : level == IsaLevel::kAvx2 ? avx2 : scalar;
}

// Scratch of the W4A8 activations: rows of ldq int8, then the group sums, then the group scales, then (K-quant
// layout) the sums of each group's first 16.
struct W4A8Scratch {
    Int4Acts acts;
    int8_t* q = nullptr;
    int32_t* xsum = nullptr;
    float* scales = nullptr;
    int32_t* xsum16 = nullptr;
};

W4A8Scratch w4a8_scratch(int64_t m, const PackedInt4& w) {
    thread_local ScratchVec buf;
    const int64_t ldq = round_up(w.k_padded, 64);
    const int64_t q_bytes = m * ldq, sum_bytes = round_up(m * w.groups * 4, 64);
    uint8_t* base = scratch(buf, size_t(q_bytes + 3 * sum_bytes));
    W4A8Scratch s;
    s.q = reinterpret_cast<int8_t*>(base);
    s.xsum = reinterpret_cast<int32_t*>(base + q_bytes);
    s.scales = reinterpret_cast<float*>(base + q_bytes + sum_bytes);
    s.xsum16 = reinterpret_cast<int32_t*>(base + q_bytes + 2 * sum_bytes);
    s.acts = Int4Acts{s.q, ldq, s.xsum, w.groups, s.scales, w.kq ? s.xsum16 : nullptr};
    return s;
}

// One row: each group quantized on its own (quantize_row_int8, or its bit-identical AVX2 form), zero padding
// past k, the group sums.
void quantize_w4a8_row(const float* x, const PackedInt4& w, int8_t* q, int32_t* xsum, float* scales,
                       int32_t* xsum16) {
    const bool simd = w.isa != IsaLevel::kScalar;
    for (int64_t g = 0; g < w.groups; ++g) {
        const int64_t c0 = g * w.group, len = std::min(w.k, c0 + w.group) - c0;
        if (len <= 0) {
            scales[g] = 1.0f;
        } else {
            scales[g] = simd ? int8_detail::quantize_row_int8_avx2(x + c0, len, q + c0)
                             : quantize_row_int8(x + c0, len, q + c0);
        }
    }
    std::memset(q + w.k, 0, size_t(w.k_padded - w.k));
    for (int64_t g = 0; g < w.groups; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * w.group; i < (g + 1) * w.group; ++i) {
            sum += q[i];
            if (xsum16 && i == g * w.group + 15) xsum16[g] = sum;
        }
        xsum[g] = sum;
    }
}


}  // namespace

void gemm_w4a8(const float* x, int64_t m, int64_t k, const PackedInt4& w, float* y, ThreadPool& pool) {
    check_packed(w, k, "gemm_w4a8");
    LATTICE_CHECK(m >= 0, "gemm_w4a8: m = {}", m);
    if (m == 0) return;
    LATTICE_CHECK(x && y, "gemm_w4a8: null pointer");
    W4A8Scratch s = w4a8_scratch(m, w);
    for_rows(m, pool, [&](int64_t r) {
        const float* row = x + r * k;
        if (!w.perm.empty()) {  // act-order: stored column c holds input channel perm[c]
            thread_local std::vector<float> gathered;
            gathered.resize(size_t(k));
            for (int64_t c = 0; c < k; ++c) gathered[size_t(c)] = row[w.perm[size_t(c)]];
            row = gathered.data();
        }
        quantize_w4a8_row(row, w, s.q + r * s.acts.ldq, s.xsum + r * w.groups, s.scales + r * w.groups,
                          w.kq ? s.xsum16 + r * w.groups : nullptr);
    });
    const auto kernel = [&] {
        if (w.isa == IsaLevel::kAmx && m >= kInt4AmxMinM) {  // AMX tiles
            note_path(KernelFamily::kGemmInt4, IsaLevel::kAmx);
            return w.kq ? &int4_detail::w4a8_kq_panels_amx : &int4_detail::w4a8_panels_amx;
        }
        return w.kq ? kernel_for(w.isa, &int4_detail::w4a8_kq_panels_scalar, &int4_detail::w4a8_kq_panels_scalar,
                                 &int4_detail::w4a8_kq_panels_avx512)
                    : kernel_for(w.isa, &int4_detail::w4a8_panels_scalar, &int4_detail::w4a8_panels_avx2,
                                 &int4_detail::w4a8_panels_avx512);
    }();
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(s.acts, m, w, p0, p1, y, w.n); });
}

void gemm_w4a16(const float* x, int64_t m, int64_t k, const PackedInt4& w, float* y, ThreadPool& pool) {
    check_packed(w, k, "gemm_w4a16");
    LATTICE_CHECK(!w.kq, "gemm_w4a16: weights packed in the K-quant layout (for gemm_w4a8 only)");
    LATTICE_CHECK(m >= 0, "gemm_w4a16: m = {}", m);
    if (m == 0) return;
    LATTICE_CHECK(x && y, "gemm_w4a16: null pointer");
    F32Acts a{x, k, nullptr, w.groups};
    // A copy of the rows when the kernels need zero padding past k or the act-order gather, group sums for
    // the affine kind.
    const bool copy = w.k_padded != k || !w.perm.empty(), sums = w.kind == Int4Kind::kAffine;
    if (copy || sums) {
        thread_local ScratchVec buf;
        const int64_t ldx = copy ? w.k_padded : k;
        float* base = reinterpret_cast<float*>(scratch(buf, size_t((copy ? m * ldx : 0) + m * w.groups) * 4));
        if (copy) {
            for (int64_t r = 0; r < m; ++r) {
                float* dst = base + r * ldx;
                if (w.perm.empty())
                    std::memcpy(dst, x + r * k, size_t(k) * 4);
                else
                    for (int64_t c = 0; c < k; ++c) dst[c] = x[r * k + w.perm[size_t(c)]];
                std::fill(dst + k, dst + ldx, 0.0f);
            }
            a.x = base;
            a.ldx = ldx;
        }
        float* xsum = base + (copy ? m * ldx : 0);
        for (int64_t r = 0; r < m; ++r)
            for (int64_t g = 0; g < w.groups; ++g) {
                float s = 0.0f;
                for (int64_t i = g * w.group; i < std::min(k, (g + 1) * w.group); ++i) s += a.x[r * a.ldx + i];
                xsum[r * w.groups + g] = s;
            }
        a.xsum = xsum;
    }
    const auto kernel = kernel_for(w.isa, &int4_detail::w4a16_panels_scalar, &int4_detail::w4a16_panels_avx2,
                                   &int4_detail::w4a16_panels_avx512);
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(a, m, w, p0, p1, y, w.n); });
}

}  // namespace lattice
