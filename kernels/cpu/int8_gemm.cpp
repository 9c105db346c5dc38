// INT8 GEMM front end: ISA detection and override, weight quantization and packing, per-call
// activation preparation (quantize once per row, then widen/offset for the chosen kernel) and the
// split of output panels across the thread pool. Kernels live in int8_gemm_{ref,avx2,avxvnni,avx512}.cpp.
// Activation scratch is a thread_local buffer of the calling thread, grown on demand (no per-call
// allocation once warm); pool workers only read it while the caller waits in parallel_for.
#include "kernels/cpu/int8_gemm.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/common/quantize.h"
#include "base/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace lattice {

using int8_detail::Int8Epilogue;

namespace {

std::atomic<int> g_isa_override{-1};

using ScratchVec = std::vector<uint8_t, AlignedAllocator64<uint8_t>>;

uint8_t* scratch(ScratchVec& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
}

void check_packed(const PackedInt8& w, int64_t k, const char* fn) {
    LATTICE_CHECK(!w.data.empty() && w.n > 0 && w.k > 0, "{}: weights are not packed (empty PackedInt8)", fn);
    LATTICE_CHECK(k == w.k, "{}: activation k = {} but packed weights have k = {}", fn, k, w.k);
    LATTICE_CHECK(isa_supported(w.isa), "{}: weights packed for ISA '{}' which this CPU does not support", fn,
                  isa_name(w.isa));
}

// Bytes per prepared activation element for the packed ISA.
int64_t prep_elem_bytes(IsaLevel isa) { return isa == IsaLevel::kAvx2 ? 2 : 1; }

// Turns an int8 row sitting at the start of dst (k values) into the kernel's operand form, in place,
// padded with zeros (value 0, i.e. 128 in the u8 form) to k_padded.
void finish_row(uint8_t* dst, int64_t k, int64_t k_padded, IsaLevel isa) {
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
            for (int64_t i = 0; i < k; ++i) dst[i] = uint8_t(dst[i] ^ 0x80u);  // a + 128 as u8
            std::memset(dst + k, 0x80, size_t(k_padded - k));
            break;
    }
}

void run_s8_kernel(const uint8_t* a, int64_t m, int64_t lda, const PackedInt8& w, const Int8Epilogue& ep,
                   ThreadPool& pool) {
    auto kernel = &int8_detail::s8_panels_scalar;
    switch (w.isa) {
        case IsaLevel::kScalar: kernel = &int8_detail::s8_panels_scalar; break;
        case IsaLevel::kAvx2: kernel = &int8_detail::s8_panels_avx2; break;
        case IsaLevel::kAvxVnni: kernel = &int8_detail::s8_panels_avxvnni; break;
        case IsaLevel::kAvx512Vnni: kernel = &int8_detail::s8_panels_avx512; break;
    }
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(a, m, lda, w, p0, p1, ep); });
}

// Runs fn(row) for rows [0, m): on the caller alone for small m (decode), else across the pool.
template <class Fn>
void for_rows(int64_t m, ThreadPool& pool, Fn&& fn) {
    if (m < 8 || pool.size() == 1) {
        for (int64_t r = 0; r < m; ++r) fn(r);
        return;
    }
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) fn(r);
    });
}

}  // namespace

std::string_view isa_name(IsaLevel isa) {
    switch (isa) {
        case IsaLevel::kScalar: return "scalar";
        case IsaLevel::kAvx2: return "avx2";
        case IsaLevel::kAvxVnni: return "avxvnni";
        case IsaLevel::kAvx512Vnni: return "avx512";
    }
    return "?";
}

IsaLevel parse_isa(std::string_view s) {
    if (s == "scalar") return IsaLevel::kScalar;
    if (s == "avx2") return IsaLevel::kAvx2;
    if (s == "avxvnni" || s == "avx-vnni") return IsaLevel::kAvxVnni;
    if (s == "avx512" || s == "avx512vnni" || s == "avx512_vnni") return IsaLevel::kAvx512Vnni;
    LATTICE_FAIL("unknown ISA level '{}' (expected scalar, avx2, avxvnni or avx512)", s);
}

#if defined(__x86_64__) || defined(__i386__)
// AVX-VNNI (VEX-encoded vpdpbusd): CPUID.(EAX=7, ECX=1):EAX bit 4. Asked of CPUID itself because clang 14's
// __builtin_cpu_supports does not know "avxvnni"; the OS's YMM state is covered by the avx2 check beside it.
static bool cpu_has_avxvnni() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a >> 4) & 1u;
}
#endif

bool isa_supported(IsaLevel isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (isa) {
        case IsaLevel::kScalar: return true;
        case IsaLevel::kAvx2: return avx2;
        case IsaLevel::kAvxVnni: return avx2 && cpu_has_avxvnni();
        case IsaLevel::kAvx512Vnni:
            return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vnni");
    }
    return false;
#else
    return isa == IsaLevel::kScalar;
#endif
}

IsaLevel best_isa() {
    static const IsaLevel best = [] {
        for (IsaLevel l : {IsaLevel::kAvx512Vnni, IsaLevel::kAvxVnni, IsaLevel::kAvx2})
            if (isa_supported(l)) return l;
        return IsaLevel::kScalar;
    }();
    return best;
}

IsaLevel detect_isa() {
    int o = g_isa_override.load(std::memory_order_relaxed);
    return o >= 0 ? IsaLevel(o) : best_isa();
}

void set_isa_override(IsaLevel isa) {
    LATTICE_CHECK(isa_supported(isa), "ISA override '{}' is not supported by this CPU (best: {})", isa_name(isa),
                  isa_name(best_isa()));
    g_isa_override.store(int(isa), std::memory_order_relaxed);
}

void clear_isa_override() { g_isa_override.store(-1, std::memory_order_relaxed); }

float quantize_row_int8_simd(const float* x, int64_t k, int8_t* q) {
    static const bool simd = isa_supported(IsaLevel::kAvx2);  // bit-identical to the scalar (tested)
    return simd ? int8_detail::quantize_row_int8_avx2(x, k, q) : quantize_row_int8(x, k, q);
}

void quantize_weights_per_channel(const float* w, int64_t n, int64_t k, int8_t* q, float* scales) {
    LATTICE_CHECK(n > 0 && k > 0, "quantize_weights_per_channel: bad shape [{}, {}]", n, k);
    LATTICE_CHECK(w && q && scales, "quantize_weights_per_channel: null pointer");
    for (int64_t i = 0; i < n; ++i) {
        const float* row = w + i * k;
        bool finite = true;
        for (int64_t j = 0; j < k; ++j) finite &= std::fabs(row[j]) <= FLT_MAX;  // NaN compares false
        if (!finite)
            for (int64_t j = 0; j < k; ++j)
                LATTICE_CHECK(std::isfinite(row[j]), "quantize_weights_per_channel: non-finite weight {} at [{}, {}]",
                              row[j], i, j);
        scales[i] = quantize_row_int8_simd(row, k, q + i * k);
    }
}

PackedInt8 pack_int8_weights(const int8_t* q, int64_t n, int64_t k, IsaLevel isa) {
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
        finish_row(dst, k, w.k_padded, w.isa);
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
        finish_row(dst, k, w.k_padded, w.isa);
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
    auto kernel = &int8_detail::w8a16_panels_scalar;
    switch (w.isa) {
        case IsaLevel::kScalar: kernel = &int8_detail::w8a16_panels_scalar; break;
        case IsaLevel::kAvx2:
        case IsaLevel::kAvxVnni: kernel = &int8_detail::w8a16_panels_avx2; break;  // no VNNI for float FMA
        case IsaLevel::kAvx512Vnni: kernel = &int8_detail::w8a16_panels_avx512; break;
    }
    pool.parallel_chunks(w.n_panels, chunk_for(w.n_panels, pool.size()),
                         [&](int64_t p0, int64_t p1, int) { kernel(xp, m, ldx, w, w_scales, p0, p1, y, w.n); });
}

}  // namespace lattice
