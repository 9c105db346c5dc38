// The one way to make a Backend: CPU or CUDA from plain options, for code that must compile with
// or without CUDA (the engine's builder, tests, benchmarks). LATTICE_HAVE_CUDA is defined
// (publicly, by lattice_kernels_cuda through lattice_runtime) only when CUDA is built; without it,
// asking for CUDA is a clear Error. Device binding (which ordinal a rank uses) is the caller's.
#pragma once

#include "runtime/backend/backend.h"

#include <memory>
#include <string_view>

namespace lattice {

enum class BackendKind : uint8_t {
    kAuto,  // CUDA when built with it and a device is visible, else CPU
    kCpu,
    kCuda,
    kSim,  // the simulated device (runtime/backend/sim/sim_device.h): a one-thread CPU backend for
           // host scratch; the model is shape-only and the engine waits out predicted step times
};
BackendKind parse_backend_kind(std::string_view s);  // "auto" | "cpu" | "cuda" | "sim"; throws Error

struct BackendOptions {
    BackendKind kind = BackendKind::kAuto;
    // CPU
    int threads = 0;     // <= 0: one per available core
    bool pin = false;    // pin the pool's workers to cores (off: unpinned measured equal or faster, and a
                         // pinned worker cannot leave a core that the caller or another process holds)
    bool mlock = false;  // lock weight memory
    bool cpu_select_tokens = false;  // CpuBackendOptions::select_tokens (tests)
    bool cpu_step_graphs = false;    // CpuBackendOptions::step_graphs (tests)
    bool cpu_fused_quant = false;    // CpuBackendOptions::fused_quant (tests)
    bool cpu_bf16 = false;           // CpuBackendOptions::bf16 (`--dtype bf16` on the CPU)
    // CUDA
    int cuda_device = 0;            // ordinal
    DType cuda_act = DType::kBF16;  // activations: kF16 or kBF16
};

// kAuto resolved: what make_backend(opt) would build.
BackendKind resolve_backend_kind(BackendKind kind);
std::unique_ptr<Backend> make_backend(const BackendOptions& opt);

// Visible CUDA devices; 0 when there is no driver, no device, or no CUDA in this build (never throws).
int cuda_device_count();

#if defined(LATTICE_HAVE_CUDA)
// act: kF16 or kBF16. Throws Error when the device does not exist or CUDA fails.
std::unique_ptr<Backend> make_cuda_backend(int device, DType act);
#endif

}  // namespace lattice
