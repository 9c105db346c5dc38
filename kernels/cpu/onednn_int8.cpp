// oneDNN as the W8A8 GEMM provider and the bf16-pair GEMM's (see onednn_int8.h): the chunked weight reorder, the
// primitive cache, the per-thread OpenMP setting and scratchpad, lattice's epilogue over each chunk's int32 sums
// (int8) or the chunk's f32 outputs copied into place (bf16).
#include "kernels/cpu/onednn_int8.h"

#include "base/error.h"
#include "base/log.h"

#if LATTICE_HAVE_ONEDNN
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>
#endif

namespace lattice {

#if LATTICE_HAVE_ONEDNN

namespace {
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
}  // namespace

// Weights reordered chunk by chunk; the types of the matmul they serve (int8: u8 x s8 -> s32; bf16: bf16 x bf16
// -> f32).
struct OnednnWeights {
    int64_t n = 0, k = 0;
    dt src = dt::u8, dst = dt::s32;
    std::vector<dnnl::memory::desc> descs;  // [chunks] the blocked layout of each chunk
    std::vector<dnnl::memory> weights;      // [chunks] reordered weights, owned by oneDNN
    int64_t bytes = 0;
    int64_t chunks() const { return int64_t(weights.size()); }
    int64_t width(int64_t c) const { return std::min(kOnednnChunkN, n - c * kOnednnChunkN); }
};
struct OnednnInt8 : OnednnWeights {};
struct OnednnBf16 : OnednnWeights {};

namespace {

// The engine and the primitive cache live until the process ends (never destroyed): their destructors would
// otherwise run after libdnnl's own statics at exit.
dnnl::engine& cpu_engine() {
    static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
    return *e;
}

// One OpenMP thread for the calling thread (libgomp's ICVs are per thread): oneDNN then runs the call on
// this thread alone. Looked up in the process (libdnnl brings libgomp) so that nothing here needs -fopenmp,
// which clang would pair with its own OpenMP runtime.
void one_omp_thread() {
    thread_local bool done = false;
    if (done) return;
    using SetFn = void (*)(int);
    static const SetFn set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set) set(1);
    done = true;
}

// The ISA level oneDNN was capped at (first pack fixes it; set_max_cpu_isa works once, before any primitive).
std::once_flag g_isa_once;
IsaLevel g_isa_fixed = IsaLevel::kScalar;

dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t k, int64_t width, int64_t lda, const dnnl::memory::desc& wd,
                                     dt src, dt dst) {
    dnnl::memory::desc a({m, k}, src, dnnl::memory::dims{lda, 1});
    dnnl::memory::desc c({m, width}, dst, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, wd, c), attr, cpu_engine());
}

struct Prim {
    dnnl::matmul prim;
    dnnl::memory::desc src, dst, scratch;
    std::string impl;
};

using PrimKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int>;  // m, k, width, lda, src type
std::mutex g_prims_mu;
// nullptr entries: oneDNN has no primitive for the key.
auto& g_prims = *new std::map<PrimKey, std::shared_ptr<const Prim>>;

// The cached primitive for m rows of chunk c of w (nullptr when oneDNN refuses the shape).
std::shared_ptr<const Prim> prim_for(int64_t m, int64_t lda, const OnednnWeights& w, int64_t c) {
    const int64_t k = w.k, width = w.width(c);
    const dnnl::memory::desc& wd = w.descs[size_t(c)];
    const PrimKey key{m, k, width, lda, int(w.src)};
    std::lock_guard<std::mutex> lock(g_prims_mu);
    if (auto it = g_prims.find(key); it != g_prims.end()) return it->second;
    if (g_prims.size() >= kOnednnMaxPrims) g_prims.clear();
    std::shared_ptr<const Prim> p;
    try {
        auto pd = make_pd(m, k, width, lda, wd, w.src, w.dst);
        p = std::make_shared<const Prim>(Prim{dnnl::matmul(pd), pd.src_desc(), pd.dst_desc(), pd.scratchpad_desc(),
                                              pd.impl_info_str()});
    } catch (const dnnl::error& e) {
        LOG_DEBUG("oneDNN: no {} matmul for m = {}, k = {}, n = {}: {}", w.src == dt::u8 ? "u8 x s8" : "bf16", m, k,
                  width, e.what());
    }
    g_prims.emplace(key, p);
    return p;
}

// c: the chunk's int32 sums [m, width] (dense); writes y or c of `ep` for columns [j0, j0 + width).
// Compiled for AVX-512F (oneDNN serves only the avx512 and amx levels): conversions and products, no sums,
// so no contraction into FMA; the same IEEE operations as the VNNI kernels' store16, lane for lane.
__attribute__((target("avx512f"))) void chunk_epilogue(const int32_t* s, int64_t m, int64_t j0, int64_t width,
                                                       const int32_t* col_sums, const int8_detail::Int8Epilogue& ep) {
    for (int64_t r = 0; r < m; ++r) {
        const int32_t* sr = s + r * width;
        if (ep.y) {
            const float rs = ep.row_scales[r];
            float* y = ep.y + r * ep.ldy + j0;
            const float* cs = ep.col_scales + j0;
            for (int64_t j = 0; j < width; ++j) {
                const int32_t v = int32_t(uint32_t(sr[j]) - (uint32_t(col_sums[j0 + j]) << 7));
                y[j] = float(v) * (rs * cs[j]);
            }
        } else {
            int32_t* c = ep.c + r * ep.ldc + j0;
            for (int64_t j = 0; j < width; ++j) c[j] = int32_t(uint32_t(sr[j]) - (uint32_t(col_sums[j0 + j]) << 7));
        }
    }
}

// Runs chunk ch on the calling thread into a dense [m, width] buffer of 4-byte outputs (s32 or f32), which
// `done` then takes.
template <class Done>
void run_chunk(const void* a, int64_t m, const OnednnWeights& w, int64_t ch, const Prim& p, Done&& done) {
    one_omp_thread();
    thread_local dnnl::stream strm(cpu_engine());
    thread_local std::vector<uint8_t> scratch;
    thread_local std::vector<int32_t> out;
    const int64_t width = w.width(ch);
    if (scratch.size() < p.scratch.get_size()) scratch.resize(p.scratch.get_size());
    if (out.size() < size_t(m * width)) out.resize(size_t(m * width));
    dnnl::memory src(p.src, cpu_engine(), const_cast<void*>(a));
    dnnl::memory dst(p.dst, cpu_engine(), out.data());
    dnnl::memory pad(p.scratch, cpu_engine(), scratch.data());
    p.prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.weights[size_t(ch)]}, {DNNL_ARG_DST, dst},
                          {DNNL_ARG_SCRATCHPAD, pad}});
    strm.wait();
    done(out.data(), width);
}

// Caps oneDNN's ISA at `isa` the first time (set_max_cpu_isa works once, before any primitive); false, with the
// reason in *why, when an earlier call fixed another level.
bool fix_isa(IsaLevel isa, std::string* why) {
    (void)cpu_features();  // the tile permission is asked for (isa.cpp) before oneDNN's first primitive
    std::call_once(g_isa_once, [isa] {
        // avx512_core_bf16 is the highest level below AMX in oneDNN 2.6's list.
        const auto cap = isa == IsaLevel::kAmx ? dnnl::cpu_isa::all : dnnl::cpu_isa::avx512_core_bf16;
        try {
            dnnl::set_max_cpu_isa(cap);
        } catch (const dnnl::error& e) {  // a primitive existed already (another user of the library)
            LOG_DEBUG("oneDNN: set_max_cpu_isa refused: {}", e.what());
        }
        g_isa_fixed = isa;
        LOG_INFO("GEMMs at m >= {} on oneDNN's copy of their weights run {} (level {})", kInt8OnednnMinM,
                 onednn_describe(), isa_name(isa));
    });
    if (g_isa_fixed == isa) return true;
    if (why) *why = fmt::format("oneDNN was fixed at the '{}' level earlier in this process", isa_name(g_isa_fixed));
    return false;
}

// Reorders q [n, k] (row-major, elements of type wdt, `es` bytes each) chunk by chunk into the layouts oneDNN
// chooses for a matmul of `src` rows into `dst` (at m = kInt8OnednnMinM; other m reuse them).
void pack_chunks(OnednnWeights& w, const void* q, dt wdt, int64_t es, int64_t n, int64_t k, dt src, dt dst) {
    w.n = n;
    w.k = k;
    w.src = src;
    w.dst = dst;
    dnnl::stream strm(cpu_engine());
    const int64_t chunks = (n + kOnednnChunkN - 1) / kOnednnChunkN;
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t width = std::min(kOnednnChunkN, n - c * kOnednnChunkN);
        dnnl::memory::desc any({k, width}, wdt, tag::any);
        const auto pd = make_pd(kInt8OnednnMinM, k, width, (k + 63) / 64 * 64, any, src, dst);
        // q's rows are the chunk's columns: [k, width] with strides {1, k}.
        dnnl::memory::desc src_d({k, width}, wdt, dnnl::memory::dims{1, k});
        dnnl::memory from(src_d, cpu_engine(),
                          const_cast<uint8_t*>(static_cast<const uint8_t*>(q) + c * kOnednnChunkN * k * es));
        dnnl::memory to(pd.weights_desc(), cpu_engine());
        dnnl::reorder(from, to).execute(strm, from, to);
        w.descs.push_back(pd.weights_desc());
        w.weights.push_back(to);
        w.bytes += int64_t(pd.weights_desc().get_size());
    }
    strm.wait();
}

// Runs every chunk of w over the pool (`done(chunk, outputs, width)` takes each chunk's outputs); false when
// oneDNN has no primitive for m.
template <class Done>
bool run_chunks(const void* a, int64_t m, int64_t lda, const OnednnWeights& w, ThreadPool& pool, Done&& done) {
    // Created here, on the caller, so that workers only read the cache's entries.
    const int64_t chunks = w.chunks();
    const auto full = prim_for(m, lda, w, 0);
    const auto tail = chunks > 1 && w.width(chunks - 1) != w.width(0) ? prim_for(m, lda, w, chunks - 1) : full;
    if (!full || !tail) return false;
    try {
        pool.parallel_chunks(chunks, chunk_for(chunks, pool.size()), [&](int64_t c0, int64_t c1, int) {
            for (int64_t c = c0; c < c1; ++c)
                run_chunk(a, m, w, c, c == chunks - 1 ? *tail : *full,
                          [&](const int32_t* out, int64_t width) { done(c, out, width); });
        });
    } catch (const dnnl::error& e) {
        LATTICE_FAIL("oneDNN: {} matmul m = {}, k = {}, n = {} failed: {}", w.src == dt::u8 ? "int8" : "bf16", m, w.k,
                     w.n, e.what());
    }
    return true;
}

}  // namespace

bool onednn_compiled() { return true; }

std::string onednn_describe() {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

namespace {
// onednn_pack_int8 / onednn_pack_bf16: the checks, the ISA cap, then pack_chunks into a T (`what`: "int8", "bf16").
template <class T>
std::shared_ptr<const T> pack_as(const void* q, dt wdt, int64_t es, int64_t n, int64_t k, IsaLevel isa,
                                 std::string* why, dt src, dt dst, const char* what) {
    LATTICE_CHECK(q && n > 0 && k > 0, "onednn_pack_{}: bad weights [{}, {}]", what, n, k);
    LATTICE_CHECK(isa == IsaLevel::kAvx512Vnni || isa == IsaLevel::kAmx,
                  "onednn_pack_{}: oneDNN serves the avx512 and amx levels only, not '{}'", what, isa_name(isa));
    if (!fix_isa(isa, why)) return nullptr;
    auto w = std::make_shared<T>();
    try {
        pack_chunks(*w, q, wdt, es, n, k, src, dst);
    } catch (const dnnl::error& e) {
        LATTICE_FAIL("oneDNN: reordering {} weights [{}, {}] failed: {}", what, n, k, e.what());
    }
    return w;
}

// The implementation oneDNN picked for m rows of w (its first chunk).
std::string impl_of(const OnednnWeights& w, int64_t m, int64_t lda) {
    const auto p = prim_for(m, lda, w, 0);
    return p ? p->impl : std::string("none");
}
}  // namespace

std::shared_ptr<const OnednnInt8> onednn_pack_int8(const int8_t* q, int64_t n, int64_t k, IsaLevel isa,
                                                   std::string* why) {
    return pack_as<OnednnInt8>(q, dt::s8, 1, n, k, isa, why, dt::u8, dt::s32, "int8");
}

int64_t onednn_int8_bytes(const OnednnInt8& w) { return w.bytes; }

bool onednn_int8_gemm(const uint8_t* a, int64_t m, int64_t lda, const OnednnInt8& w, const int32_t* col_sums,
                      const int8_detail::Int8Epilogue& ep, ThreadPool& pool) {
    return run_chunks(a, m, lda, w, pool, [&](int64_t c, const int32_t* sums, int64_t width) {
        chunk_epilogue(sums, m, c * kOnednnChunkN, width, col_sums, ep);
    });
}

std::string onednn_int8_impl(const OnednnInt8& w, int64_t m, int64_t lda) {
    return impl_of(w, m, lda);
}

std::shared_ptr<const OnednnBf16> onednn_pack_bf16(const uint16_t* w, int64_t n, int64_t k, IsaLevel isa,
                                                   std::string* why) {
    return pack_as<OnednnBf16>(w, dt::bf16, 2, n, k, isa, why, dt::bf16, dt::f32, "bf16");
}

int64_t onednn_bf16_bytes(const OnednnBf16& w) {
    return w.bytes;
}

bool onednn_bf16_gemm(const uint16_t* xb, int64_t m, int64_t lda, const OnednnBf16& w, float* y, ThreadPool& pool) {
    return run_chunks(xb, m, lda, w, pool, [&](int64_t c, const int32_t* out, int64_t width) {
        for (int64_t r = 0; r < m; ++r)
            std::memcpy(y + r * w.n + c * kOnednnChunkN, out + r * width, size_t(width) * sizeof(float));
    });
}

std::string onednn_bf16_impl(const OnednnBf16& w, int64_t m, int64_t lda) {
    return impl_of(w, m, lda);
}

#else  // !LATTICE_HAVE_ONEDNN

struct OnednnInt8 {};
struct OnednnBf16 {};

bool onednn_compiled() { return false; }
std::string onednn_describe() { return "oneDNN absent (built without libdnnl)"; }
std::shared_ptr<const OnednnInt8> onednn_pack_int8(const int8_t*, int64_t, int64_t, IsaLevel, std::string*) {
    LATTICE_FAIL("onednn_pack_int8: this build has no oneDNN (install libdnnl-dev and reconfigure)");
}
int64_t onednn_int8_bytes(const OnednnInt8&) { return 0; }
bool onednn_int8_gemm(const uint8_t*, int64_t, int64_t, const OnednnInt8&, const int32_t*,
                      const int8_detail::Int8Epilogue&, ThreadPool&) {
    LATTICE_FAIL("onednn_int8_gemm: this build has no oneDNN");
}
std::string onednn_int8_impl(const OnednnInt8&, int64_t, int64_t) { return "none"; }
std::shared_ptr<const OnednnBf16> onednn_pack_bf16(const uint16_t*, int64_t, int64_t, IsaLevel, std::string*) {
    LATTICE_FAIL("onednn_pack_bf16: this build has no oneDNN (install libdnnl-dev and reconfigure)");
}
int64_t onednn_bf16_bytes(const OnednnBf16&) {
    return 0;
}
bool onednn_bf16_gemm(const uint16_t*, int64_t, int64_t, const OnednnBf16&, float*, ThreadPool&) {
    LATTICE_FAIL("onednn_bf16_gemm: this build has no oneDNN");
}
std::string onednn_bf16_impl(const OnednnBf16&, int64_t, int64_t) {
    return "none";
}

#endif

}  // namespace lattice
