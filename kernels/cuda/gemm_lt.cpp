// cuBLASLt plan cache, algorithm choice (heuristic candidates, optional timing, fallback on error)
// and the two GEMM entry points. See gemm_lt.h for the layout contract and the choice rules.
#include "kernels/cuda/gemm_lt.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/cuda_check.h"
#include "base/error.h"

namespace lattice::cuda {
namespace {

// Alignment class of a pointer: the largest power of two <= 256 dividing it.
int align_of(const void* p) {
    const auto v = reinterpret_cast<uintptr_t>(p);
    return v == 0 ? 256 : int(std::min<uintptr_t>(v & (~v + 1), 256));
}

// True while `stream` captures a graph, or when that cannot be asked (e.g. the legacy stream
// while another stream captures): then nothing may synchronize.
bool stream_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: keep it from surfacing at the next launch check
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    T v{};
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS ||
        written != sizeof(v))
        return T(-1);
    return v;
}

}  // namespace

LtGemm::LtGemm(const LtOptions& options) : options_(options) {
    LATTICE_CHECK(options_.max_candidates >= 1 && options_.max_candidates <= 32 && options_.tune_iters >= 1 &&
                      options_.tune_iters <= 100,
                  "LtGemm: max_candidates {} (1..32), tune_iters {} (1..100)", options_.max_candidates,
                  options_.tune_iters);
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

LtGemm::~LtGemm() {
    for (auto& [key, p] : plans_) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const Key& key, bool int8) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    cudaDataType_t ab_type, c_type;
    cublasComputeType_t compute;
    cudaDataType_t scale_type;
    if (int8) {
        ab_type = CUDA_R_8I;
        c_type = CUDA_R_32I;
        compute = CUBLAS_COMPUTE_32I;
        scale_type = CUDA_R_32I;
    } else {
        ab_type = DType(key.dtype) == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
        c_type = DType(key.out_dtype) == DType::kF32 ? CUDA_R_32F : ab_type;
        compute = CUBLAS_COMPUTE_32F;
        scale_type = CUDA_R_32F;
    }
    Plan p;
    p.int8 = int8;
    cublasLtMatmulPreference_t pref = nullptr;
    auto release = [&] {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (p.a) cublasLtMatrixLayoutDestroy(p.a);
        if (p.b) cublasLtMatrixLayoutDestroy(p.b);
        if (p.c) cublasLtMatrixLayoutDestroy(p.c);
        if (p.op) cublasLtMatmulDescDestroy(p.op);
    };
    const auto what = [&] {
        return fmt::format("{} GEMM m={} n={} k={} (ldx {}, ldw {}, ldy {}; pointers aligned to {}/{}/{} bytes)",
                           int8 ? "int8 (IMMA)" : dtype_name(DType(key.dtype)), key.m, key.n, key.k, key.ldx, key.ldw,
                           key.ldy, key.align_x, key.align_w, key.align_y);
    };
    // The first failing cuBLASLt call releases what was made and throws with its status.
    const auto check = [&](cublasStatus_t st, const char* call) {
        if (st == CUBLAS_STATUS_SUCCESS) return;
        release();
        LATTICE_FAIL("cuBLASLt {} failed for {}: {}", call, what(), cublas_status_name(st));
    };
    check(cublasLtMatmulDescCreate(&p.op, compute, scale_type), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    // Column-major: A = W stored [k rows, n cols] ld ldw; B = x [k, m] ld ldx; C = y [n, m] ld ldy.
    check(cublasLtMatrixLayoutCreate(&p.a, ab_type, uint64_t(key.k), uint64_t(key.n), key.ldw), "layout A");
    check(cublasLtMatrixLayoutCreate(&p.b, ab_type, uint64_t(key.k), uint64_t(key.m), key.ldx), "layout B");
    check(cublasLtMatrixLayoutCreate(&p.c, c_type, uint64_t(key.n), uint64_t(key.m), key.ldy), "layout C");

    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint32_t align[4] = {uint32_t(key.align_w), uint32_t(key.align_x), uint32_t(key.align_y),
                               uint32_t(key.align_y)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
        check(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i])),
              "set MIN_ALIGNMENT");
    // Full workspace first (split-k and stream-k variants), then none: more fallbacks and more
    // to time; the heuristic's order within each query is kept.
    std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(options_.max_candidates));
    cublasStatus_t last = CUBLAS_STATUS_NOT_SUPPORTED;
    for (const uint64_t ws : {uint64_t(kWorkspaceBytes), uint64_t(0)}) {
        check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
              "set MAX_WORKSPACE_BYTES");
        int found = 0;
        last = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, options_.max_candidates,
                                              results.data(), &found);
        if (last != CUBLAS_STATUS_SUCCESS) continue;  // e.g. NOT_SUPPORTED with no workspace: the other may work
        for (int i = 0; i < std::min(found, options_.max_candidates); ++i) {
            const cublasLtMatmulHeuristicResult_t& r = results[size_t(i)];
            if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kWorkspaceBytes) continue;
            const bool dup = std::any_of(p.cands.begin(), p.cands.end(), [&](const Candidate& c) {
                return std::memcmp(&c.algo, &r.algo, sizeof(r.algo)) == 0;
            });
            if (!dup) p.cands.push_back(Candidate{r.algo, r.workspaceSize, int(p.cands.size())});
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    if (int8 && options_.int8_unavailable) p.cands.clear();
    if (p.cands.empty()) {
        p.unavailable = true;  // the caller throws (gemm_*) or falls back (try_gemm_i8)
        p.last_error = last == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : last;
    }
    p.info.candidates = int(p.cands.size());
    ++plans_built_;
    return plans_.emplace(key, std::move(p)).first->second;
}

cublasStatus_t LtGemm::matmul(const Plan& p, const Candidate& c, const Args& a, cudaStream_t stream) const {
    return cublasLtMatmul(handle_, p.op, a.alpha, a.w, p.a, a.x, p.b, a.beta, a.y, p.c, a.y, p.c, &c.algo, workspace_,
                          kWorkspaceBytes, stream);
}

void LtGemm::drop(Plan& p, int i, cublasStatus_t st) {
    p.cands[size_t(i)].dropped = true;
    ++p.info.dropped;
    p.last_error = st;
}

void LtGemm::set_chosen(Plan& p, int i, bool timed, float us) {
    p.chosen = i;
    LtAlgoInfo& info = p.info;
    const Candidate& c = p.cands[size_t(i)];
    info.index = c.index;
    info.algo_id = algo_attr<int32_t>(c.algo, CUBLASLT_ALGO_CONFIG_ID);
    info.tile = int(algo_attr<uint32_t>(c.algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
    info.splitk = algo_attr<int32_t>(c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    info.workspace = c.workspace;
    info.timed = timed;
    info.time_us = us;
}

// Picks p.chosen among the live candidates (see gemm_lt.h). Leaves it -1 only when every
// candidate was refused during timing; launch() then throws.
void LtGemm::choose(Plan& p, const Args& a, cudaStream_t stream) {
    const int n = int(p.cands.size());
    int live = 0;
    for (const Candidate& c : p.cands) live += !c.dropped;
    const bool tune = options_.autotune && (p.int8 || options_.autotune_float);
    if (!tune || live <= 1 || stream_capturing(stream)) {
        for (int i = 0; i < n; ++i)
            if (!p.cands[size_t(i)].dropped) {
                set_chosen(p, i, false, 0.0f);  // launch() drops it and moves on if it fails
                return;
            }
        return;
    }
    if (events_.size() < size_t(2 * n)) {
        events_.reserve(size_t(2 * n));
        while (events_.size() < size_t(2 * n)) {
            cudaEvent_t e = nullptr;
            CUDA_CHECK(cudaEventCreate(&e));
            events_.push_back(e);
        }
    }
    std::vector<bool> timed(size_t(n), false);
    int last = -1;
    for (int i = 0; i < n; ++i) {
        Candidate& c = p.cands[size_t(i)];
        if (c.dropped) continue;
        cublasStatus_t st = matmul(p, c, a, stream);  // untimed run: refusals, lazy module loading
        if (st != CUBLAS_STATUS_SUCCESS) {
            drop(p, i, st);
            continue;
        }
        CUDA_CHECK(cudaEventRecord(events_[size_t(2 * i)], stream));
        for (int it = 0; it < options_.tune_iters && st == CUBLAS_STATUS_SUCCESS; ++it) st = matmul(p, c, a, stream);
        CUDA_CHECK(cudaEventRecord(events_[size_t(2 * i + 1)], stream));
        if (st != CUBLAS_STATUS_SUCCESS) {
            drop(p, i, st);
            continue;
        }
        timed[size_t(i)] = true;
        last = i;
    }
    if (last < 0) return;
    CUDA_CHECK(cudaEventSynchronize(events_[size_t(2 * last + 1)]));  // stream order: all earlier ones are done
    int best = -1;
    float best_ms = std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) {
        if (!timed[size_t(i)]) continue;
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, events_[size_t(2 * i)], events_[size_t(2 * i + 1)]));
        if (ms < best_ms) {  // strict: ties keep the heuristic's earlier pick
            best_ms = ms;
            best = i;
        }
    }
    set_chosen(p, best, true, best_ms * 1000.0f / float(options_.tune_iters));
    ++plans_timed_;
}

bool LtGemm::launch(Plan& p, const Args& a, cudaStream_t stream) {
    last_ = &p;
    if (p.unavailable) return false;
    if (p.chosen < 0) choose(p, a, stream);
    while (p.chosen >= 0) {
        const cublasStatus_t st = matmul(p, p.cands[size_t(p.chosen)], a, stream);
        if (st == CUBLAS_STATUS_SUCCESS) return true;
        // Refused (no timing here: this may be a capture): the next live candidate in heuristic order.
        const int from = p.chosen;
        drop(p, from, st);
        p.chosen = -1;
        for (int i = from + 1; i < int(p.cands.size()) && p.chosen < 0; ++i)
            if (!p.cands[size_t(i)].dropped) set_chosen(p, i, false, 0.0f);
        for (int i = 0; i < from && p.chosen < 0; ++i)
            if (!p.cands[size_t(i)].dropped) set_chosen(p, i, false, 0.0f);
    }
    p.unavailable = true;
    return false;
}

void LtGemm::fail_unavailable(const Plan& p, const Key& key) const {
    LATTICE_FAIL(
        "cuBLASLt has no working algorithm ({} candidates, every one refused or none offered) for {} GEMM m={} n={} "
        "k={} (ldx {}, ldw {}, ldy {}; pointers aligned to {}/{}/{} bytes); last status {}",
        p.cands.size(), p.int8 ? "int8 (IMMA)" : dtype_name(DType(key.dtype)), key.m, key.n, key.k, key.ldx, key.ldw,
        key.ldy, key.align_x, key.align_w, key.align_y, cublas_status_name(p.last_error));
}

void LtGemm::gemm_float(void* y, int64_t ldy, const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m,
                        int64_t n, int64_t k, DType dtype, DType out_dtype, cudaStream_t stream) {
    LATTICE_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, "LtGemm::gemm_float: dtype {}", dtype_name(dtype));
    LATTICE_CHECK(out_dtype == dtype || out_dtype == DType::kF32, "LtGemm::gemm_float: output dtype {} for {} inputs",
                  dtype_name(out_dtype), dtype_name(dtype));
    LATTICE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldy >= n,
                  "LtGemm::gemm_float: bad shape m={} n={} k={} ldx={} ldw={} ldy={}", m, n, k, ldx, ldw, ldy);
    const Key key{int(dtype), int(out_dtype), m, n, k, ldx, ldw, ldy, align_of(w), align_of(x), align_of(y)};
    const float alpha = 1.0f, beta = 0.0f;
    Plan& p = plan(key, false);
    if (!launch(p, Args{&alpha, &beta, w, x, y}, stream)) fail_unavailable(p, key);
}

LtGemm::Key LtGemm::i8_key(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw,
                           int64_t m, int64_t n, int64_t k) const {
    LATTICE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldc >= n,
                  "LtGemm::gemm_i8: bad shape m={} n={} k={} ldx={} ldw={} ldc={}", m, n, k, ldx, ldw, ldc);
    LATTICE_CHECK(n % 4 == 0 && k % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && ldc % 4 == 0,
                  "LtGemm::gemm_i8: IMMA needs n, k and leading dims multiples of 4 (n={} k={} ldx={} ldw={} ldc={})",
                  n, k, ldx, ldw, ldc);
    const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
    LATTICE_CHECK(!misaligned(c) && !misaligned(xq) && !misaligned(w),
                  "LtGemm::gemm_i8: pointers must be 16-byte aligned");
    return Key{int(DType::kI8), int(DType::kI32), m, n, k, ldx, ldw, ldc, align_of(w), align_of(xq), align_of(c)};
}

void LtGemm::gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
                     int64_t n, int64_t k, cudaStream_t stream) {
    const Key key = i8_key(c, ldc, xq, ldx, w, ldw, m, n, k);
    Plan& p = plan(key, true);
    const int32_t alpha = 1, beta = 0;
    if (!launch(p, Args{&alpha, &beta, w, xq, c}, stream)) fail_unavailable(p, key);
}

bool LtGemm::try_gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    const Key key = i8_key(c, ldc, xq, ldx, w, ldw, m, n, k);
    const int32_t alpha = 1, beta = 0;
    return launch(plan(key, true), Args{&alpha, &beta, w, xq, c}, stream);
}

}  // namespace lattice::cuda
