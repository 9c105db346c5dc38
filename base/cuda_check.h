// CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK / KERNEL_CHECK: never compiled out. A failure throws
// lattice::Error prefixed by where_prefix() (host, rank/world, device, file:line) with the call's
// text and the library's error string, e.g.
//   "[gpu07 r5/16 dev1 cuda_backend.cpp:88] cudaMalloc(&p, n): out of memory (cudaErrorMemoryAllocation)".
// Header-only for host-compiled files (parallel/cuda, runtime/backend/cuda): the throw is inline.
// nvcc's front end cannot digest fmt 9's consteval format strings (base/error.h), so files that
// nvcc compiles (__CUDACC__) see only a declaration; kernels/cuda/cuda_check.cpp, compiled by the
// host compiler into lattice_kernels_cuda, defines it for them.
// NCCL_CHECK expands against nccl.h: only files that include nccl.h may use it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#if !defined(__CUDACC__)
#include "base/error.h"
#endif

namespace lattice {

// Both throw lattice::Error("<where> <call>: <what>"); the macros pick the one this compiler can see.
// Defined in kernels/cuda/cuda_check.cpp, for files nvcc compiles.
[[noreturn]] void throw_call_error_nvcc(const char* file, int line, const char* call, const std::string& what);
#if !defined(__CUDACC__)
[[noreturn]] inline void throw_call_error(const char* file, int line, const char* call, const std::string& what) {
    throw Error(where_prefix(file, line), std::string(call) + ": " + what);
}
#define LATTICE_THROW_CALL_ERROR ::lattice::throw_call_error
#else
#define LATTICE_THROW_CALL_ERROR ::lattice::throw_call_error_nvcc
#endif

inline const char* cublas_status_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
        default: return "CUBLAS_STATUS_(unknown)";
    }
}

}  // namespace lattice

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        const cudaError_t lattice_cuda_err_ = (call);                                               \
        if (lattice_cuda_err_ != cudaSuccess) [[unlikely]]                                          \
            LATTICE_THROW_CALL_ERROR(__FILE__, __LINE__, #call,                                  \
                                        std::string(cudaGetErrorString(lattice_cuda_err_)) + " (" + \
                                            cudaGetErrorName(lattice_cuda_err_) + ")");             \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                             \
    do {                                                                                                               \
        const cublasStatus_t lattice_cublas_st_ = (call);                                                              \
        if (lattice_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                  \
            LATTICE_THROW_CALL_ERROR(__FILE__, __LINE__, #call, ::lattice::cublas_status_name(lattice_cublas_st_)); \
    } while (0)

#define NCCL_CHECK(call)                                                                              \
    do {                                                                                              \
        const ncclResult_t lattice_nccl_r_ = (call);                                                  \
        if (lattice_nccl_r_ != ncclSuccess && lattice_nccl_r_ != ncclInProgress) [[unlikely]]         \
            LATTICE_THROW_CALL_ERROR(                                                              \
                __FILE__, __LINE__, #call,                                                            \
                std::string(ncclGetErrorString(lattice_nccl_r_)) + ": " + ncclGetLastError(nullptr)); \
    } while (0)

// Checks the last kernel launch (launch-configuration errors surface here, not at the next sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Argument check for .cu host code: `msg` is a std::string expression evaluated only on failure.
#define KERNEL_CHECK(cond, msg)                                            \
    do {                                                                   \
        if (!(cond)) [[unlikely]]                                          \
            LATTICE_THROW_CALL_ERROR(__FILE__, __LINE__, #cond, (msg)); \
    } while (0)
