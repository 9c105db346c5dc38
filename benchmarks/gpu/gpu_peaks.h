// Published dense peaks of the GPUs lattice targets, matched by device-name substring, for the
// "ratio to peak" columns of the GPU benchmarks. Dense (no sparsity) tensor-core numbers from the
// vendor datasheets; HBM bandwidth in GB/s. Unknown GPUs fall back to the memory clock x bus width
// the driver reports (bandwidth only; compute ratios are then omitted).
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

}  // namespace lattice::bench
