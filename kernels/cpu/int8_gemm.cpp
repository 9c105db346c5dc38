// INT8 GEMM front end: weight quantization and packing, per-call
// activation preparation (quantize once per row, then widen/offset for the chosen kernel) and the
// split of output panels across the thread pool. Kernels live in int8_gemm_{ref,avx2,avxvnni,avx512,amx_avx512}.cpp.
// Activation scratch is a thread_local buffer of the calling thread, grown on demand (no per-call
// allocation once warm); pool workers only read it while the caller waits in parallel_for.
#include "kernels/cpu/int8_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "base/convert.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/common/quantize.h"
#include "kernels/common/quantize_rows.h"
#include "kernels/cpu/gemm_front.h"
#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/cpu/onednn_int8.h"

namespace lattice {

using gemm_front::for_rows;
using gemm_front::scratch;
using gemm_front::ScratchVec;

using int8_detail::Int8Epilogue;

namespace {

void check_packed(const PackedInt8& w, int64_t k, const char* fn) {
    LATTICE_CHECK(!w.data.empty() && w.n > 0 && w.k > 0, "{}: weights are not packed (empty PackedInt8)", fn);
    LATTICE_CHECK(k == w.k, "{}: activation k = {} but packed weights have k = {}", fn, k, w.k);
    LATTICE_CHECK(isa_supported(w.isa), "{}: weights packed for ISA '{}' which this CPU does not support", fn,
                  isa_name(w.isa));
}

// Bytes per prepared activation element for the packed ISA.
int64_t prep_elem_bytes(IsaLevel isa) { return isa == IsaLevel::kAvx2 ? 2 : 1; }

// Turns an int8 row sitting at the start of dst (k values) into the kernel's operand form, in place,
// padded with zeros (value 0, i.e. 128 in the u8 form) to k_padded; its bytes from there to the row stride
// `lda_bytes` zero (the AMX tiles read whole 64-byte blocks; zero weights meet them).
void finish_row(uint8_t* dst, int64_t k, int64_t k_padded, int64_t lda_bytes, IsaLevel isa) {
    std::memset(dst + k_padded * prep_elem_bytes(isa), 0, size_t(lda_bytes - k_padded * prep_elem_bytes(isa)));
    switch (isa) {
        case IsaLevel::kScalar:
            std::memset(dst + k, 0, size_t(k_padded - k));
            break;
        case IsaLevel::kAvx2: {
            int16_t* d16 = reinterpret_cast<int16_t*>(dst);
            for (int64_t i = k_padded - 1; i >= k; --i) d16[i] = 0;
            for (int64_t i = k - 1; i >= 0; --i) d16[i] = int16_t(int8_t(dst[i]));  // back to front: in place
            break;
        }
        case IsaLevel::kAvxVnni:
        case IsaLevel::kAvx512Vnni:
        case IsaLevel::kAmx:
            for (int64_t i = 0; i < k; ++i) dst[i] = uint8_t(dst[i] ^ 0x80u);  // a + 128 as u8
            std::memset(dst + k, 0x80, size_t(k_padded - k));
            break;
    }
}

std::atomic<uint8_t> g_provider{uint8_t(Int8Provider::kAuto)};
std::atomic<int> g_last_provider{-1};  // -1: none yet; else 0 own, 1 onednn

void run_s8_kernel(const uint8_t* a, int64_t m, int64_t lda, const PackedInt8& w, const Int8Epilogue& ep,
                   ThreadPool& pool) {
    if (w.onednn && m >= kInt8OnednnMinM && onednn_int8_gemm(a, m, lda, *w.onednn, w.col_sums.data(), ep, pool)) {
        note_path(KernelFamily::kGemmInt8, w.isa);
        g_last_provider.store(1, std::memory_order_relaxed);
        return;
    }
    g_last_provider.store(0, std::memory_order_relaxed);
    auto kernel = &int8_detail::s8_panels_scalar;
    IsaLevel ran = w.isa;
    switch (w.isa) {
        case IsaLevel::kScalar: kernel = &int8_detail::s8_panels_scalar; break;
        case IsaLevel::kAvx2: kernel = &int8_detail::s8_panels_avx2; break;
        case IsaLevel::kAvxVnni: kernel = &int8_detail::s8_panels_avxvnni; break;
        case IsaLevel::kAvx512Vnni:
            kernel = &int8_detail::s8_panels_avx512;
            break;
        case IsaLevel::kAmx:  // tiles from kInt8AmxMinM rows; the VNNI kernel streams the panels below it
            kernel = m >= kInt8AmxMinM ? &int8_detail::s8_panels_amx : &int8_detail::s8_panels_avx512;
            ran = m >= kInt8AmxMinM ? IsaLevel::kAmx : IsaLevel::kAvx512Vnni;
            break;
    }
    note_path(KernelFamily::kGemmInt8, ran);
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(a, m, lda, w, p0, p1, ep); });
}

}  // namespace

void set_int8_provider(Int8Provider p) { g_provider.store(uint8_t(p), std::memory_order_relaxed); }
Int8Provider int8_provider() { return Int8Provider(g_provider.load(std::memory_order_relaxed)); }

Int8Provider parse_int8_provider(std::string_view s) {
    if (s == "auto") return Int8Provider::kAuto;
    if (s == "own") return Int8Provider::kOwn;
    if (s == "onednn") return Int8Provider::kOnednn;
    LATTICE_FAIL("unknown int8 GEMM provider '{}' (expected auto, own or onednn)", s);
}

bool int8_uses_onednn(IsaLevel isa) {
    const bool level_ok = isa == IsaLevel::kAvx512Vnni || isa == IsaLevel::kAmx;
    switch (int8_provider()) {
        case Int8Provider::kOwn: return false;
        case Int8Provider::kOnednn: return level_ok;
        case Int8Provider::kAuto: return isa == IsaLevel::kAmx && onednn_compiled();
    }
    return false;
}

std::string_view last_int8_provider() {
    const int v = g_last_provider.load(std::memory_order_relaxed);
    return v < 0 ? "" : v == 1 ? "onednn" : "own";
}

std::string int8_prefill_kernel(IsaLevel isa) {
    if (int8_uses_onednn(isa)) return "oneDNN's matmul";
    if (isa == IsaLevel::kAmx) return "lattice's AMX-INT8 tiles";
    return fmt::format("lattice's {} kernel", isa_name(isa));
}

float quantize_row_int8_simd(const float* x, int64_t k, int8_t* q) {
    // Bit-identical to the scalar (tested); the scalar level runs the portable form.
    return detect_isa() != IsaLevel::kScalar ? int8_detail::quantize_row_int8_avx2(x, k, q)
                                             : quantize_row_int8(x, k, q);
}

void quantize_weights_per_channel(const float* w, int64_t n, int64_t k, int8_t* q, float* scales) {
    quantize_weights_per_channel(w, DType::kF32, n, k, q, scales);
}

void quantize_weights_per_channel(const void* w, DType dtype, int64_t n, int64_t k, int8_t* q, float* scales,
                                  ThreadPool* pool) {
    LATTICE_CHECK(n > 0 && k > 0, "quantize_weights_per_channel: bad shape [{}, {}]", n, k);
    LATTICE_CHECK(w && q && scales, "quantize_weights_per_channel: null pointer");
    LATTICE_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                  "quantize_weights_per_channel: {} weights (f32, f16 or bf16)", dtype_name(dtype));
    // The rows (kernels/common/quantize_rows.h), over the pool; the first non-finite row named after them all.
    std::atomic<int64_t> first_bad{n};
    auto rows = [&](int64_t r0, int64_t r1, int) {
        const int64_t bad = quantize_rows_int8(w, dtype, k, r0, r1, q, scales, &quantize_row_int8_simd);
        if (bad == r1) return;
        int64_t seen = first_bad.load(std::memory_order_relaxed);
        while (bad < seen && !first_bad.compare_exchange_weak(seen, bad, std::memory_order_relaxed)) {
        }
    };
    if (pool)
        pool->parallel_for(n, rows);
    else
        rows(0, n, 0);
    if (const int64_t i = first_bad.load(); i < n) fail_non_finite_row(w, dtype, k, i, "quantize_weights_per_channel");
}

PackedInt8 pack_int8_weights(const int8_t* q, int64_t n, int64_t k, IsaLevel isa, bool w8a8) {
    LATTICE_CHECK(q, "pack_int8_weights: null weights");
    LATTICE_CHECK(n > 0 && k > 0, "pack_int8_weights: bad shape [{}, {}]", n, k);
    LATTICE_CHECK(k <= kInt8MaxK, "pack_int8_weights: k = {} exceeds {} (int32 accumulation would overflow)", k,
                  kInt8MaxK);
    LATTICE_CHECK(n <= (int64_t(1) << 31), "pack_int8_weights: n = {} too large", n);
    LATTICE_CHECK(isa_supported(isa), "pack_int8_weights: ISA '{}' not supported by this CPU", isa_name(isa));
    PackedInt8 p;
    p.n = n;
    p.k = k;
    p.k_padded = (k + kInt8GroupK - 1) / kInt8GroupK * kInt8GroupK;
    p.n_panels = (n + kInt8PanelN - 1) / kInt8PanelN;
    p.isa = isa;
    p.data.assign(size_t(p.n_panels * p.panel_bytes()), 0);
    p.col_sums.assign(size_t(p.n_panels * kInt8PanelN), 0);
    // Panel by panel, writing each 64-byte k-group sequentially from the 16 source rows.
    const int64_t full_groups = k / 4;
    for (int64_t panel = 0; panel < p.n_panels; ++panel) {
        int8_t* dst = p.data.data() + panel * p.panel_bytes();
        const int64_t rows = std::min<int64_t>(kInt8PanelN, n - panel * kInt8PanelN);
        for (int64_t g = 0; g < full_groups; ++g)
            for (int64_t j = 0; j < rows; ++j)
                std::memcpy(dst + g * 64 + j * 4, q + (panel * kInt8PanelN + j) * k + g * 4, 4);
        if (k % 4)
            for (int64_t j = 0; j < rows; ++j)
                std::memcpy(dst + full_groups * 64 + j * 4, q + (panel * kInt8PanelN + j) * k + full_groups * 4,
                            size_t(k % 4));
    }
    for (int64_t i = 0; i < n; ++i) {
        const int8_t* src = q + i * k;
        int32_t sum = 0;
        for (int64_t kk = 0; kk < k; ++kk) sum += src[kk];
        p.col_sums[size_t(i)] = sum;
    }
    if (w8a8 && int8_uses_onednn(isa)) {
        std::string why;
        p.onednn = onednn_pack_int8(q, n, k, isa, &why);
        if (!p.onednn) LOG_INFO("int8 GEMM: oneDNN not used for [{}, {}]: {}", n, k, why);
    }
    return p;
}

void gemm_w8a8(const float* x, int64_t m, int64_t k, const PackedInt8& w, const float* w_scales, float* y,
               ThreadPool& pool) {
    check_packed(w, k, "gemm_w8a8");
    LATTICE_CHECK(m >= 0, "gemm_w8a8: m = {}", m);
    if (m == 0) return;
    LATTICE_CHECK(x && y && w_scales, "gemm_w8a8: null pointer");
    thread_local ScratchVec buf;
    const int64_t lda_bytes = (w.k_padded * prep_elem_bytes(w.isa) + 63) / 64 * 64;
    uint8_t* a = scratch(buf, size_t(m * lda_bytes + m * int64_t(sizeof(float))));
    float* row_scales = reinterpret_cast<float*>(a + m * lda_bytes);
    for_rows(m, pool, [&](int64_t r) {
        uint8_t* dst = a + r * lda_bytes;
        int8_t* q = reinterpret_cast<int8_t*>(dst);
        row_scales[r] = w.isa == IsaLevel::kScalar ? quantize_row_int8(x + r * k, k, q)
                                                   : int8_detail::quantize_row_int8_avx2(x + r * k, k, q);
        finish_row(dst, k, w.k_padded, lda_bytes, w.isa);
    });
    Int8Epilogue ep;
    ep.y = y;
    ep.ldy = w.n;
    ep.row_scales = row_scales;
    ep.col_scales = w_scales;
    run_s8_kernel(a, m, lda_bytes / prep_elem_bytes(w.isa), w, ep, pool);
}

namespace {
// Runs the int8 kernels on already-quantized rows a_in [m, lda_in] (first k columns): copies them
// into the kernels' row layout for w.isa, then the epilogue `ep`.
void run_s8_on_rows(const int8_t* a_in, int64_t lda_in, int64_t m, int64_t k, const PackedInt8& w,
                    const Int8Epilogue& ep, ThreadPool& pool) {
    thread_local ScratchVec buf;
    const int64_t lda_bytes = (w.k_padded * prep_elem_bytes(w.isa) + 63) / 64 * 64;
    uint8_t* a = scratch(buf, size_t(m * lda_bytes));
    for_rows(m, pool, [&](int64_t r) {
        uint8_t* dst = a + r * lda_bytes;
        std::memcpy(dst, a_in + r * lda_in, size_t(k));
        finish_row(dst, k, w.k_padded, lda_bytes, w.isa);
    });
    run_s8_kernel(a, m, lda_bytes / prep_elem_bytes(w.isa), w, ep, pool);
}
}  // namespace

void gemm_w8a8_quantized(const int8_t* xq, int64_t ldx, const float* x_scales, int64_t m, int64_t k,
                         const PackedInt8& w, const float* w_scales, float* y, ThreadPool& pool) {
    check_packed(w, k, "gemm_w8a8_quantized");
    LATTICE_CHECK(m >= 0 && ldx >= k, "gemm_w8a8_quantized: m = {}, ldx = {} for k = {}", m, ldx, k);
    if (m == 0) return;
    LATTICE_CHECK(xq && x_scales && w_scales && y, "gemm_w8a8_quantized: null pointer");
    Int8Epilogue ep;
    ep.y = y;
    ep.ldy = w.n;
    ep.row_scales = x_scales;
    ep.col_scales = w_scales;
    run_s8_on_rows(xq, ldx, m, k, w, ep, pool);
}

void gemm_s8s8_s32(const int8_t* a_in, int64_t m, int64_t k, const PackedInt8& w, int32_t* c, ThreadPool& pool) {
    check_packed(w, k, "gemm_s8s8_s32");
    LATTICE_CHECK(m >= 0, "gemm_s8s8_s32: m = {}", m);
    if (m == 0) return;
    LATTICE_CHECK(a_in && c, "gemm_s8s8_s32: null pointer");
    Int8Epilogue ep;
    ep.c = c;
    ep.ldc = w.n;
    run_s8_on_rows(a_in, k, m, k, w, ep, pool);
}

void gemm_w8a16(const float* x, int64_t m, int64_t k, const PackedInt8& w, const float* w_scales, float* y,
                ThreadPool& pool) {
    check_packed(w, k, "gemm_w8a16");
    LATTICE_CHECK(m >= 0, "gemm_w8a16: m = {}", m);
    if (m == 0) return;
    LATTICE_CHECK(x && y && w_scales, "gemm_w8a16: null pointer");
    const float* xp = x;
    int64_t ldx = k;
    if (w.k_padded != k) {  // kernels read whole k-groups: give them a zero-padded copy
        thread_local ScratchVec buf;
        ldx = w.k_padded;
        float* xs = reinterpret_cast<float*>(scratch(buf, size_t(m * ldx) * sizeof(float)));
        for (int64_t r = 0; r < m; ++r) {
            std::memcpy(xs + r * ldx, x + r * k, size_t(k) * sizeof(float));
            for (int64_t i = k; i < ldx; ++i) xs[r * ldx + i] = 0.0f;
        }
        xp = xs;
    }
    // No VNNI or AMX form for float FMA: vector_level's kernel.
    const IsaLevel level = vector_level(w.isa);
    const auto kernel = level == IsaLevel::kAvx512Vnni ? &int8_detail::w8a16_panels_avx512
                        : level == IsaLevel::kAvx2     ? &int8_detail::w8a16_panels_avx2
                                                       : &int8_detail::w8a16_panels_scalar;
    note_path(KernelFamily::kGemmInt8, level);
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(xp, m, ldx, w, w_scales, p0, p1, y, w.n); });
}

}  // namespace lattice
