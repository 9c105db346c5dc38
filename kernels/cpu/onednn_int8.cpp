// oneDNN as the W8A8 GEMM provider (see onednn_int8.h): the chunked weight reorder, the primitive cache,
// the per-thread OpenMP setting and scratchpad, and lattice's epilogue over each chunk's int32 sums.
#include "kernels/cpu/onednn_int8.h"

#include "base/error.h"
#include "base/log.h"

#if LATTICE_HAVE_ONEDNN
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace lattice {

#if LATTICE_HAVE_ONEDNN

struct OnednnInt8 {
    int64_t n = 0, k = 0;
    std::vector<dnnl::memory::desc> descs;  // [chunks] the blocked layout of each chunk
    std::vector<dnnl::memory> weights;      // [chunks] reordered weights, owned by oneDNN
    int64_t bytes = 0;
    int64_t chunks() const { return int64_t(weights.size()); }
    int64_t width(int64_t c) const { return std::min(kOnednnChunkN, n - c * kOnednnChunkN); }
};

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

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

dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t k, int64_t width, int64_t lda, const dnnl::memory::desc& wd) {
    dnnl::memory::desc a({m, k}, dt::u8, dnnl::memory::dims{lda, 1});
    dnnl::memory::desc c({m, width}, dt::s32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, wd, c), attr, cpu_engine());
}

struct Prim {
    dnnl::matmul prim;
    dnnl::memory::desc src, dst, scratch;
    std::string impl;
};

using PrimKey = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // m, k, width, lda
std::mutex g_prims_mu;
// nullptr entries: oneDNN has no primitive for the key.
auto& g_prims = *new std::map<PrimKey, std::shared_ptr<const Prim>>;

// The cached primitive for m rows of a chunk whose layout is wd (nullptr when oneDNN refuses the shape).
std::shared_ptr<const Prim> prim_for(int64_t m, int64_t k, int64_t width, int64_t lda, const dnnl::memory::desc& wd) {
    const PrimKey key{m, k, width, lda};
    std::lock_guard<std::mutex> lock(g_prims_mu);
    if (auto it = g_prims.find(key); it != g_prims.end()) return it->second;
    if (g_prims.size() >= kOnednnMaxPrims) g_prims.clear();
    std::shared_ptr<const Prim> p;
    try {
        auto pd = make_pd(m, k, width, lda, wd);
        p = std::make_shared<const Prim>(Prim{dnnl::matmul(pd), pd.src_desc(), pd.dst_desc(), pd.scratchpad_desc(),
                                              pd.impl_info_str()});
    } catch (const dnnl::error& e) {
        LOG_DEBUG("oneDNN: no u8 x s8 matmul for m = {}, k = {}, n = {}: {}", m, k, width, e.what());
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

// Runs chunk ch on the calling thread.
void run_chunk(const uint8_t* a, int64_t m, const OnednnInt8& w, int64_t ch, const Prim& p, const int32_t* col_sums,
               const int8_detail::Int8Epilogue& ep) {
    one_omp_thread();
    thread_local dnnl::stream strm(cpu_engine());
    thread_local std::vector<uint8_t> scratch;
    thread_local std::vector<int32_t> sums;
    const int64_t width = w.width(ch);
    if (scratch.size() < p.scratch.get_size()) scratch.resize(p.scratch.get_size());
    if (sums.size() < size_t(m * width)) sums.resize(size_t(m * width));
    dnnl::memory src(p.src, cpu_engine(), const_cast<uint8_t*>(a));
    dnnl::memory dst(p.dst, cpu_engine(), sums.data());
    dnnl::memory pad(p.scratch, cpu_engine(), scratch.data());
    p.prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.weights[size_t(ch)]}, {DNNL_ARG_DST, dst},
                          {DNNL_ARG_SCRATCHPAD, pad}});
    strm.wait();
    chunk_epilogue(sums.data(), m, ch * kOnednnChunkN, width, col_sums, ep);
}

}  // namespace

bool onednn_compiled() { return true; }

std::string onednn_describe() {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

std::shared_ptr<const OnednnInt8> onednn_pack_int8(const int8_t* q, int64_t n, int64_t k, IsaLevel isa,
                                                   std::string* why) {
    LATTICE_CHECK(q && n > 0 && k > 0, "onednn_pack_int8: bad weights [{}, {}]", n, k);
    LATTICE_CHECK(isa == IsaLevel::kAvx512Vnni || isa == IsaLevel::kAmx,
                  "onednn_pack_int8: oneDNN serves the avx512 and amx levels only, not '{}'", isa_name(isa));
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
        LOG_INFO("int8 GEMM: W8A8 at m >= {} runs {} (level {})", kInt8OnednnMinM, onednn_describe(), isa_name(isa));
    });
    if (g_isa_fixed != isa) {
        if (why)
            *why = fmt::format("oneDNN was fixed at the '{}' level earlier in this process", isa_name(g_isa_fixed));
        return nullptr;
    }
    auto w = std::make_shared<OnednnInt8>();
    w->n = n;
    w->k = k;
    try {
        dnnl::stream strm(cpu_engine());
        const int64_t chunks = (n + kOnednnChunkN - 1) / kOnednnChunkN;
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t width = std::min(kOnednnChunkN, n - c * kOnednnChunkN);
            // The layout oneDNN chooses for this chunk (at m = kInt8OnednnMinM; other m reuse it).
            dnnl::memory::desc any({k, width}, dt::s8, tag::any);
            const auto pd = make_pd(kInt8OnednnMinM, k, width, (k + 63) / 64 * 64, any);
            // q's rows are the chunk's columns: [k, width] with strides {1, k}.
            dnnl::memory::desc src_d({k, width}, dt::s8, dnnl::memory::dims{1, k});
            dnnl::memory src(src_d, cpu_engine(), const_cast<int8_t*>(q + c * kOnednnChunkN * k));
            dnnl::memory dst(pd.weights_desc(), cpu_engine());
            dnnl::reorder(src, dst).execute(strm, src, dst);
            w->descs.push_back(pd.weights_desc());
            w->weights.push_back(dst);
            w->bytes += int64_t(pd.weights_desc().get_size());
        }
        strm.wait();
    } catch (const dnnl::error& e) {
        LATTICE_FAIL("oneDNN: reordering int8 weights [{}, {}] failed: {}", n, k, e.what());
    }
    return w;
}

int64_t onednn_int8_bytes(const OnednnInt8& w) { return w.bytes; }

bool onednn_int8_gemm(const uint8_t* a, int64_t m, int64_t lda, const OnednnInt8& w, const int32_t* col_sums,
                      const int8_detail::Int8Epilogue& ep, ThreadPool& pool) {
    // Created here, on the caller, so that workers only read the cache's entries.
    const int64_t chunks = w.chunks();
    const auto full = prim_for(m, w.k, w.width(0), lda, w.descs[0]);
    const auto tail = chunks > 1 && w.width(chunks - 1) != w.width(0)
                          ? prim_for(m, w.k, w.width(chunks - 1), lda, w.descs[size_t(chunks - 1)])
                          : full;
    if (!full || !tail) return false;
    try {
        pool.parallel_chunks(chunks, chunk_for(chunks, pool.size()), [&](int64_t c0, int64_t c1, int) {
            for (int64_t c = c0; c < c1; ++c)
                run_chunk(a, m, w, c, c == chunks - 1 ? *tail : *full, col_sums, ep);
        });
    } catch (const dnnl::error& e) {
        LATTICE_FAIL("oneDNN: int8 matmul m = {}, k = {}, n = {} failed: {}", m, w.k, w.n, e.what());
    }
    return true;
}

std::string onednn_int8_impl(const OnednnInt8& w, int64_t m, int64_t lda) {
    const auto p = prim_for(m, w.k, w.width(0), lda, w.descs[0]);
    return p ? p->impl : std::string("none");
}

#else  // !LATTICE_HAVE_ONEDNN

struct OnednnInt8 {};

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

#endif

}  // namespace lattice
