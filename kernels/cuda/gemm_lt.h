// cuBLASLt GEMMs in the "TN" form the int8 tensor-core (IMMA) kernels require, for row-major
// y[m, n] = x[m, k] . W[n, k]^T: in cuBLAS's column-major terms C[n, m] = op_T(W)[n, k] . x[k, m],
// i.e. A = W (transposed), B = x (not transposed). Float (f16/bf16 in and out, fp32 accumulate)
// and int8 (int8 in, int32 out, CUBLAS_COMPUTE_32I).
// IMMA requirements with regular (CUBLASLT_ORDER_COL) ordering: TN only; m and k (cuBLAS terms:
// our n and k) multiples of 4; leading dimensions multiples of 4; pointers 4-byte aligned (16 for
// best speed). The callers pad n and k to multiples of 16 with zeros (make_linear, quantize_rows)
// and allocate with cudaMalloc (256-byte aligned); gemm_i8 checks and throws otherwise.
// One LtGemm per stream owner (not thread-safe). Plans (descriptors + heuristic algorithm) are
// cached per shape so steady-state calls, and CUDA graph capture, do no heuristic queries.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "base/dtype.h"

namespace lattice::cuda {

class LtGemm {
public:
    static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
    LtGemm();
    ~LtGemm();
    LtGemm(const LtGemm&) = delete;
    LtGemm& operator=(const LtGemm&) = delete;

    // y[m, ldy] = x[m, ldx] . W[n, ldw]^T over k; dtype f16 or bf16 for x and W; y in dtype or f32.
    void gemm_float(void* y, int64_t ldy, const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m, int64_t n,
                    int64_t k, DType dtype, DType out_dtype, cudaStream_t stream);
    // c[m, ldc] (int32) = xq[m, ldx] . W[n, ldw]^T over k (int8, exact int32 accumulation).
    void gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
                 int64_t n, int64_t k, cudaStream_t stream);

private:
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    // (dtype, out dtype, m, n, k, ldx, ldw, ldy)
    using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
    Plan& plan(const Key& key, bool int8);

    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::map<Key, Plan> plans_;
};

}  // namespace lattice::cuda
