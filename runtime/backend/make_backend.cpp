// make_backend (see make_backend.h). The CUDA half (make_cuda_backend, cuda_device_count) lives in
// runtime/backend/cuda/cuda_backend_ops.cpp, compiled in CUDA builds only.
#include "runtime/backend/make_backend.h"

#include "runtime/backend/cpu/cpu_backend.h"

namespace lattice {

#if !defined(LATTICE_HAVE_CUDA)
int cuda_device_count() { return 0; }
#endif

BackendKind parse_backend_kind(std::string_view s) {
    if (s == "auto") return BackendKind::kAuto;
    if (s == "cpu") return BackendKind::kCpu;
    if (s == "cuda") return BackendKind::kCuda;
    if (s == "sim") return BackendKind::kSim;
    LATTICE_FAIL("unknown device \"{}\" (expected auto, cpu, cuda or sim)", s);
}

BackendKind resolve_backend_kind(BackendKind kind) {
    if (kind != BackendKind::kAuto) return kind;
    return cuda_device_count() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
    if (o.kind == BackendKind::kSim) return std::make_unique<CpuBackend>(CpuBackendOptions{1, false, false});
    if (resolve_backend_kind(o.kind) == BackendKind::kCpu)
        return std::make_unique<CpuBackend>(CpuBackendOptions{o.threads, o.pin, o.mlock, o.cpu_select_tokens, o.cpu_step_graphs,
                                                                o.cpu_fused_quant, o.cpu_bf16});
#if defined(LATTICE_HAVE_CUDA)
    const int count = cuda_device_count();
    LATTICE_CHECK(o.cuda_device >= 0 && o.cuda_device < count, "CUDA device {} requested but {} visible",
                  o.cuda_device, count);
    return make_cuda_backend(o.cuda_device, o.cuda_act);
#else
    LATTICE_FAIL("CUDA backend requested (device {}, {}) but lattice was built without CUDA (reconfigure with "
                 "-DLATTICE_CUDA=ON on a machine with nvcc)",
                 o.cuda_device, dtype_name(o.cuda_act));
#endif
}

}  // namespace lattice
