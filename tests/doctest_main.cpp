// doctest entry point shared by every test executable. Tests that need hardware this machine may
// lack (LATTICE_TEST_CUDA_DEVICES > 0: that many CUDA devices) check for it before running any
// case and otherwise exit with kSkipCode, which CTest reports as "Skipped" with the printed reason
// (SKIP_RETURN_CODE in tests/CMakeLists.txt) — never as a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#if LATTICE_TEST_CUDA_DEVICES > 0
#include <cuda_runtime_api.h>
#endif

namespace {
constexpr int kSkipCode = 77;
}

int main(int argc, char** argv) {
#if LATTICE_TEST_CUDA_DEVICES > 0
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count < LATTICE_TEST_CUDA_DEVICES) {
        std::printf("SKIP: needs %d CUDA device(s), found %d (%s)\n", LATTICE_TEST_CUDA_DEVICES,
                    err == cudaSuccess ? count : 0, err == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorString(err));
        std::fflush(stdout);
        return kSkipCode;
    }
#endif
    doctest::Context ctx(argc, argv);
    return ctx.run();
}
