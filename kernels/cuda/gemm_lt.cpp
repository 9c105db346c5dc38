// cuBLASLt plan cache and the two GEMM entry points (see gemm_lt.h for the layout contract).
#include "kernels/cuda/gemm_lt.h"

#include "base/cuda_check.h"
#include "base/error.h"

namespace lattice::cuda {

LtGemm::LtGemm() {
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
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const Key& key, bool int8) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    const auto [dt, out_dt, m, n, k, ldx, ldw, ldy] = key;
    cudaDataType_t ab_type, c_type;
    cublasComputeType_t compute;
    cudaDataType_t scale_type;
    if (int8) {
        ab_type = CUDA_R_8I;
        c_type = CUDA_R_32I;
        compute = CUBLAS_COMPUTE_32I;
        scale_type = CUDA_R_32I;
    } else {
        ab_type = DType(dt) == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
        c_type = DType(out_dt) == DType::kF32 ? CUDA_R_32F : ab_type;
        compute = CUBLAS_COMPUTE_32F;
        scale_type = CUDA_R_32F;
    }
    Plan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, scale_type));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major: A = W stored [k rows, n cols] ld ldw; B = x [k, m] ld ldx; C = y [n, m] ld ldy.
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab_type, uint64_t(k), uint64_t(n), ldw));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab_type, uint64_t(k), uint64_t(m), ldx));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_type, uint64_t(n), uint64_t(m), ldy));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
        LATTICE_FAIL("cuBLASLt has no {} algorithm for m={} n={} k={} (ldx {}, ldw {}, ldy {}): {}",
                     int8 ? "int8 (IMMA)" : dtype_name(DType(dt)), m, n, k, ldx, ldw, ldy, cublas_status_name(st));
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
}

void LtGemm::gemm_float(void* y, int64_t ldy, const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m,
                        int64_t n, int64_t k, DType dtype, DType out_dtype, cudaStream_t stream) {
    LATTICE_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, "LtGemm::gemm_float: dtype {}", dtype_name(dtype));
    LATTICE_CHECK(out_dtype == dtype || out_dtype == DType::kF32, "LtGemm::gemm_float: output dtype {} for {} inputs",
                  dtype_name(out_dtype), dtype_name(dtype));
    LATTICE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldy >= n,
                  "LtGemm::gemm_float: bad shape m={} n={} k={} ldx={} ldw={} ldy={}", m, n, k, ldx, ldw, ldy);
    Plan& p = plan(Key{int(dtype), int(out_dtype), m, n, k, ldx, ldw, ldy}, false);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                                kWorkspaceBytes, stream));
}

void LtGemm::gemm_i8(int32_t* c, int64_t ldc, const int8_t* xq, int64_t ldx, const int8_t* w, int64_t ldw, int64_t m,
                     int64_t n, int64_t k, cudaStream_t stream) {
    LATTICE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldc >= n,
                  "LtGemm::gemm_i8: bad shape m={} n={} k={} ldx={} ldw={} ldc={}", m, n, k, ldx, ldw, ldc);
    LATTICE_CHECK(n % 4 == 0 && k % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && ldc % 4 == 0,
                  "LtGemm::gemm_i8: IMMA needs n, k and leading dims multiples of 4 (n={} k={} ldx={} ldw={} ldc={})",
                  n, k, ldx, ldw, ldc);
    const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
    LATTICE_CHECK(!misaligned(c) && !misaligned(xq) && !misaligned(w),
                  "LtGemm::gemm_i8: pointers must be 16-byte aligned");
    Plan& p = plan(Key{int(DType::kI8), int(DType::kI32), m, n, k, ldx, ldw, ldc}, true);
    const int32_t alpha = 1, beta = 0;
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, xq, p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_,
                                kWorkspaceBytes, stream));
}

}  // namespace lattice::cuda
