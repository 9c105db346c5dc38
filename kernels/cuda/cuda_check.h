// CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK / KERNEL_CHECK: never compiled out. A failure throws
// lattice::Error prefixed by where_prefix() (host, rank/world, device, file:line) with the call's
// text and the library's error string, e.g.
//   "[gpu07 r5/16 dev1 cuda_backend.cpp:88] cudaMalloc(&p, n): out of memory (cudaErrorMemoryAllocation)".
// fmt-free on purpose: nvcc's front end cannot digest fmt 9's consteval format strings, so .cu
// files include only this header and the throwing lives in cuda_check.cpp (compiled by the host
// compiler). NCCL_CHECK expands against nccl.h: only files that include nccl.h may use it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

namespace lattice {

// Throws lattice::Error("<where> <call>: <what>").
[[noreturn]] void throw_call_error(const char* file, int line, const char* call, const std::string& what);
const char* cublas_status_name(cublasStatus_t s);

}  // namespace lattice

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        const cudaError_t lattice_cuda_err_ = (call);                                               \
        if (lattice_cuda_err_ != cudaSuccess) [[unlikely]]                                          \
            ::lattice::throw_call_error(__FILE__, __LINE__, #call,                                  \
                                        std::string(cudaGetErrorString(lattice_cuda_err_)) + " (" + \
                                            cudaGetErrorName(lattice_cuda_err_) + ")");             \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                             \
    do {                                                                                                               \
        const cublasStatus_t lattice_cublas_st_ = (call);                                                              \
        if (lattice_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                  \
            ::lattice::throw_call_error(__FILE__, __LINE__, #call, ::lattice::cublas_status_name(lattice_cublas_st_)); \
    } while (0)

#define NCCL_CHECK(call)                                                                              \
    do {                                                                                              \
        const ncclResult_t lattice_nccl_r_ = (call);                                                  \
        if (lattice_nccl_r_ != ncclSuccess && lattice_nccl_r_ != ncclInProgress) [[unlikely]]         \
            ::lattice::throw_call_error(                                                              \
                __FILE__, __LINE__, #call,                                                            \
                std::string(ncclGetErrorString(lattice_nccl_r_)) + ": " + ncclGetLastError(nullptr)); \
    } while (0)

// Checks the last kernel launch (launch-configuration errors surface here, not at the next sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Argument check for .cu host code: `msg` is a std::string expression evaluated only on failure.
#define KERNEL_CHECK(cond, msg)                                            \
    do {                                                                   \
        if (!(cond)) [[unlikely]]                                          \
            ::lattice::throw_call_error(__FILE__, __LINE__, #cond, (msg)); \
    } while (0)
