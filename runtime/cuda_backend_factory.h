// The one entry point to the CUDA backend for code that must compile with or without CUDA
// (launch/, the engine, tests). LATTICE_HAVE_CUDA is defined (publicly, by lattice_kernels_cuda
// through lattice_runtime) only when CUDA is built; otherwise the factory throws a clear Error.
//   auto be = make_cuda_backend(local_device, DType::kBF16);   // device binding is launch/'s job
// The concrete type with CUDA-only extras (stream, argmax/sample, CudaGraph) is
// runtime/cuda/cuda_backend.h, which only CUDA builds may include.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace lattice {

#if defined(LATTICE_HAVE_CUDA)
// act: kF16 or kBF16. Throws Error when the device does not exist or CUDA fails.
std::unique_ptr<Backend> make_cuda_backend(int device, DType act);
// Visible CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();
constexpr bool kHaveCuda = true;
#else
inline std::unique_ptr<Backend> make_cuda_backend(int device, DType act) {
    LATTICE_FAIL(
        "CUDA backend requested (device {}, {}) but lattice was built without CUDA "
        "(reconfigure with -DLATTICE_CUDA=ON on a machine with nvcc)",
        device, dtype_name(act));
}
inline int cuda_device_count() {
    return 0;
}
constexpr bool kHaveCuda = false;
#endif

}  // namespace lattice
