// cuBLASLt GEMMs in the "TN" form the int8 tensor-core (IMMA) kernels require, for row-major
// y[m, n] = x[m, k] . W[n, k]^T: in cuBLAS's column-major terms C[n, m] = op_T(W)[n, k] . x[k, m],
// i.e. A = W (transposed), B = x (not transposed). Float (f16/bf16 in and out, fp32 accumulate)
// and int8 (int8 in, int32 out, CUBLAS_COMPUTE_32I).
// IMMA requirements with regular (CUBLASLT_ORDER_COL) ordering: TN only; m and k (cuBLAS terms:
// our n and k) multiples of 4; leading dimensions multiples of 4; pointers 4-byte aligned (16 for
// best speed). The callers pad n and k to multiples of 16 with zeros (make_linear, quantize_rows)
// and allocate with cudaMalloc (256-byte aligned); gemm_i8 checks n/k/ld % 4 and 16-byte pointers
// and throws otherwise. The tiled IMMA orders (COL32, COL4_4R2_8C, COL32_2R_4R4) are not used:
// they would need the weights re-laid out once and x (and the output) transformed every call,
// while sm_80+ cuBLASLt has IMMA kernels for plain column-major TN data.
//
// Algorithm choice. The first use of a shape (dtypes, m, n, k, leading dims, and the alignment
// class of each pointer: up to 256 bytes, passed to the heuristic as CUBLASLT_MATMUL_PREF_MIN_
// ALIGNMENT_*, so a less aligned pointer later gets a plan of its own rather than an algorithm
// that needs more) builds a plan: descriptors plus up to LtOptions::max_candidates heuristic
// results with the full workspace, then up to as many with no workspace (duplicates dropped), in
// the heuristic's order. One candidate is then chosen:
//   - autotuning on (LtOptions::autotune for int8; float GEMMs also need autotune_float, off by
//     default) and the caller's stream not capturing: each candidate runs once (one whose
//     cublasLtMatmul returns an error is dropped), then tune_iters timed runs between cudaEvents
//     on the caller's stream; one event synchronize at the end; the fastest wins. This costs
//     (1 + tune_iters) x candidates GEMMs and a stream sync, once per shape;
//   - autotuning off, or the stream capturing a graph (no synchronization allowed): the first
//     candidate whose cublasLtMatmul succeeds.
// The choice is final (eager and captured runs of a shape use the same algorithm, so float
// results do not change with graph capture); a candidate that later returns an error is dropped
// and the next one that works takes over. Only when none works does the call throw, naming the
// shape and the last status. Steady-state calls and graph capture of known shapes do no heuristic
// query and no timing. Timing needs the caller's stream not to be capturing; do not tune while
// another stream of this thread captures in global / thread-local mode (the synchronize would
// invalidate that capture): warm every shape up eagerly first, as the engine does.
// No algorithm: a shape for which the heuristic returns no candidate, or whose every candidate
// cublasLtMatmul refuses, makes gemm_* throw (naming the shape and status); try_gemm_i8 returns false
// instead (the plan remembers it: later calls of the shape return false at once, with no query), so
// the caller can take another path (CudaBackend: the GEMV in row chunks, with a warning once).
// One LtGemm per stream owner (not thread-safe).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <map>
#include <vector>

#include "base/dtype.h"

namespace lattice::cuda {

struct LtOptions {
    bool autotune = true;  // time the candidates on the first (eager) use of an int8 shape
    // Also time float GEMMs. Off by default: their rounding depends on the algorithm (split-k,
    // tile order), so a timing-based choice would make float results vary from run to run; int8
    // results are exact whatever the algorithm.
    bool autotune_float = false;
    int max_candidates = 8;  // heuristic results requested per workspace setting (1..32)
    int tune_iters = 3;      // timed runs per candidate after one untimed run
    // Tests: behave as if cuBLASLt had no int8 algorithm for any shape (try_gemm_i8 returns false,
    // gemm_i8 throws), to exercise the callers' fallbacks on a GPU where every shape has one.
    bool int8_unavailable = false;
};

// The algorithm a plan settled on (for benchmarks and tests).
struct LtAlgoInfo {
    int index = -1;        // position in the heuristic's order (0: its first pick)
    int candidates = 0;    // candidates the heuristic returned (both workspace settings, deduplicated)
    int dropped = 0;       // candidates cublasLtMatmul refused so far
    int algo_id = -1;      // CUBLASLT_ALGO_CONFIG_ID
    int tile = -1;         // CUBLASLT_ALGO_CONFIG_TILE_ID (cublasLtMatmulTile_t)
    int splitk = -1;       // CUBLASLT_ALGO_CONFIG_SPLITK_NUM
    size_t workspace = 0;  // bytes of workspace it uses
    bool timed = false;    // chosen by timing (false: the first that worked)
    float time_us = 0;     // its measured time per call when timed
};

class LtGemm {
public:
    static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
    LtGemm() : LtGemm(LtOptions{}) {}
    explicit LtGemm(const LtOptions& options);
    ~LtGemm();
    LtGemm(const LtGemm&) = delete;
    LtGemm& operator=(const LtGemm&) = delete;

    // y[m, ldy] = x[m, ldx] . W[n, ldw]^T over k; dtype f16 or bf16 for x and W; y in dtype or f32.
    void gemm_float(void* y, int64_t ldy, const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m, int64_t n,
                    int64_t k, DType dtype, DType out_dtype, cudaStream_t stream);
    // c[m, ldc] (int32) = xq[m, ldx] . W[n, ldw]^T over k (int8, exact int32 accumulation).
    void gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
                 int64_t n, int64_t k, cudaStream_t stream);
    // gemm_i8, or false (nothing enqueued) when cuBLASLt has no working algorithm for the shape.
    bool try_gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
                     int64_t n, int64_t k, cudaStream_t stream);

    // The algorithm of the shape the last gemm_* call ran (index -1 before any call).
    const LtAlgoInfo& last_algo() const { return last_ ? last_->info : no_info_; }
    int64_t plans_built() const { return plans_built_; }  // heuristic queries happen only here
    int64_t plans_timed() const { return plans_timed_; }  // shapes chosen by timing
    const LtOptions& options() const { return options_; }

private:
    // (dtype, out dtype, m, n, k, ldx, ldw, ldy, alignment of w, x, y in bytes capped at 256)
    struct Key {
        int dtype, out_dtype;
        int64_t m, n, k, ldx, ldw, ldy;
        int align_w, align_x, align_y;
        auto operator<=>(const Key&) const = default;
    };
    struct Candidate {
        cublasLtMatmulAlgo_t algo;
        size_t workspace;
        int index;  // heuristic order
        bool dropped = false;
    };
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        std::vector<Candidate> cands;
        bool int8 = false;
        int chosen = -1;           // into cands; -1: not chosen yet
        bool unavailable = false;  // no candidate, or every one refused: try_gemm_i8 returns false
        cublasStatus_t last_error = CUBLAS_STATUS_SUCCESS;  // of the last refused candidate
        LtAlgoInfo info;
    };
    // One call's operands (alpha/beta point to float or int32 per the plan's scale type).
    struct Args {
        const void *alpha, *beta, *w, *x;
        void* y;
    };

    Plan& plan(const Key& key, bool int8);
    // Runs the plan's chosen algorithm; false when none works (the plan is then marked unavailable).
    bool launch(Plan& p, const Args& a, cudaStream_t stream);
    [[noreturn]] void fail_unavailable(const Plan& p, const Key& key) const;
    Key i8_key(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
               int64_t n, int64_t k) const;
    void choose(Plan& p, const Args& a, cudaStream_t stream);
    cublasStatus_t matmul(const Plan& p, const Candidate& c, const Args& a, cudaStream_t stream) const;
    void set_chosen(Plan& p, int i, bool timed, float us);
    void drop(Plan& p, int i, cublasStatus_t st);

    LtOptions options_;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::map<Key, Plan> plans_;
    std::vector<cudaEvent_t> events_;  // timing: 2 per candidate, created on first use
    const Plan* last_ = nullptr;
    LtAlgoInfo no_info_;
    int64_t plans_built_ = 0, plans_timed_ = 0;
};

}  // namespace lattice::cuda
