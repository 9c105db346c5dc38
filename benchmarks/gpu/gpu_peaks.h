// Published dense peaks of the GPUs lattice targets, matched by device-name substring, for the
// "ratio to peak" columns of the GPU benchmarks. Dense (no sparsity) tensor-core numbers from the
// vendor datasheets; HBM bandwidth in GB/s. Unknown GPUs fall back to the memory clock x bus width
// the driver reports (bandwidth only; compute ratios are then omitted). measure_copy_gbs gives the
// bandwidth a device-to-device copy reaches, the practical floor the decode benchmark uses.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace lattice::bench {

struct GpuPeaks {
    std::string model;       // matched table row, or "unknown"
    double int8_tops = 0;    // dense INT8 tensor TOPS
    double fp16_tflops = 0;  // dense FP16/BF16 tensor TFLOPS (fp32 accumulate)
    double hbm_gbs = 0;      // memory bandwidth GB/s
};

inline GpuPeaks gpu_peaks(int device) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, device);
    const std::string name = p.name;
    const size_t gib = p.totalGlobalMem >> 30;
    struct Row {
        const char* key;
        bool big_mem;  // disambiguates 40 GB / 80 GB A100 and PCIe / SXM H100 by memory when needed
        GpuPeaks peaks;
    };
    // Order matters: the first row whose key is in the name (and memory class) wins.
    const Row rows[] = {
        {"H200", true, {"H200", 1979, 989.5, 4800}},
        {"H100 NVL", true, {"H100 NVL", 1671, 835, 3900}},
        {"H100 PCIe", true, {"H100 PCIe", 1513, 756, 2000}},
        {"H100", true, {"H100 SXM", 1979, 989.5, 3350}},
        {"GH200", true, {"GH200", 1979, 989.5, 4000}},
        {"A100-PCIE-40GB", false, {"A100 PCIe 40GB", 624, 312, 1555}},
        {"A100-SXM4-40GB", false, {"A100 SXM 40GB", 624, 312, 1555}},
        {"A100 80GB PCIe", true, {"A100 PCIe 80GB", 624, 312, 1935}},
        {"A100-SXM4-80GB", true, {"A100 SXM 80GB", 624, 312, 2039}},
        {"A100", true, {"A100 (80GB assumed)", 624, 312, 1935}},
        {"L40S", true, {"L40S", 733, 362, 864}},
        {"A10", true, {"A10", 250, 125, 600}},
    };
    for (const Row& r : rows)
        if (name.find(r.key) != std::string::npos) {
            GpuPeaks g = r.peaks;
            if (std::string(r.key) == "A100" && gib < 60) g = {"A100 (40GB assumed)", 624, 312, 1555};
            return g;
        }
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
    GpuPeaks g;
    g.model = "unknown (" + name + ")";
    g.hbm_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    return g;
}

// The HBM floor as this GPU reaches it: device-to-device copy bandwidth in GB/s counting bytes read
// plus bytes written (a copy of N bytes moves 2N), best of `reps` cudaMemcpyAsync of `bytes` after a
// warm-up, timed with events. An H200 copies at about 4300 GB/s this way, below the datasheet's
// 4800; the decode floor is set by this number measured in the same run. 0 when allocation fails.
inline double measure_copy_gbs(int device, size_t bytes = size_t(2) << 30, int reps = 10) {
    if (cudaSetDevice(device) != cudaSuccess) return 0;
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess) return 0;
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0;
    }
    cudaStream_t s = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double best_s = 0;
    if (cudaStreamCreate(&s) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        cudaMemsetAsync(a, 1, bytes, s) == cudaSuccess) {
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);  // warm-up
        for (int r = 0; r < reps; ++r) {
            cudaEventRecord(e0, s);
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
            cudaEventRecord(e1, s);
            if (cudaEventSynchronize(e1) != cudaSuccess) break;
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (ms > 0 && (best_s == 0 || ms * 1e-3 < best_s)) best_s = ms * 1e-3;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
    return best_s > 0 ? 2.0 * double(bytes) / best_s / 1e9 : 0;
}

}  // namespace lattice::bench
