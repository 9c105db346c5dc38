// The layout planner's device and link tables (plan_model.h): each device's memory, bandwidth and peaks, each link's
// bandwidth and latency; find_device, find_link, parse_link.
//
// Sources of the constants (dense figures, no sparsity):
// - A10: NVIDIA A10 datasheet (24 GB GDDR6, 600 GB/s, FP16 tensor 125 TFLOPS, INT8 250 TOPS).
// - A10G: AWS G5 / NVIDIA A10G product brief (24 GB GDDR6, 600 GB/s, FP16 tensor 70 TFLOPS,
//   INT8 140 TOPS): approximate, NVIDIA publishes no A10G datasheet.
// - A100 PCIe 40GB: NVIDIA A100 datasheet (40 GB HBM2, 1,555 GB/s, FP16 312 TFLOPS, INT8 624 TOPS).
// - A100 SXM 80GB: same datasheet (80 GB HBM2e, 2,039 GB/s; 312 / 624).
// - H100 SXM: NVIDIA H100 datasheet (80 GB HBM3, 3.35 TB/s, FP16 989 TFLOPS, INT8 1,979 TOPS).
// - H200: NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s; same peaks as H100 SXM); a
//   device-to-device copy reaches ~4.3 TB/s (this project's issue 13), hence bw_eff 0.9.
// - Achievable fractions on the A100/H100: ~85% of HBM bandwidth in a device copy, ~70% of the
//   dense tensor peak for large INT8/FP16 GEMMs (cuBLASLt), ~20 us per decode layer of kernel
//   gaps with the step in a CUDA graph. These are assumptions, stated, not measurements of ours.
// - Links: PCIe 4.0 x16 = 31.5 GB/s per direction, NCCL rings reach ~20 GB/s bus bandwidth
//   through a host bridge without NVLink; a small all-reduce on 4 such GPUs takes ~20 us
//   (DESIGN.md), i.e. ~3.5 us per ring hop. NVLink 3 (A100 SXM): 300 GB/s per direction, NCCL
//   ~230 GB/s; NVLink 4 (H100/H200 SXM): 450 GB/s per direction, NCCL ~360 GB/s. InfiniBand
//   HDR: 200 Gb/s = 25 GB/s per port, ~5 us. CPU ranks on one node: OpenMPI's shared-memory
//   transport, measured on the 2-core EPYC VM (benchmarks/results/cpu-2core-epyc-zen4/plan_validation.json).
// - cpu: the 2-core AMD EPYC (Zen 4, AVX-512 VNNI) VM this project is developed on, per core, measured:
//   read bandwidth of one core and of the node (bench_decode's stream), the in-engine W8A8 GEMM
//   rate (bench_gemm_int8); attention's achieved f32 rate (bench_attention --queries 64) from the
//   2-vCPU Xeon VM. `lattice plan --calibration FILE` replaces them with another machine's figures.
#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/plan_model.h"

namespace lattice {

const std::vector<DeviceSpec>& device_table() {
    static const std::vector<DeviceSpec> t = [] {
        std::vector<DeviceSpec> v;
        auto gpu = [&](std::string name, std::string label, double mem, double bw, double i8, double f16, double bw_eff,
                       std::string link, std::string src) {
            DeviceSpec d;
            d.name = std::move(name);
            d.label = std::move(label);
            d.mem_gib = mem;
            d.bw_gbs = bw;
            d.int8_tops = i8;
            d.fp16_tflops = f16;
            d.bw_eff = bw_eff;
            d.compute_eff = 0.7;
            d.reserved_gib = 1.5;  // CUDA context ~0.5, cuBLASLt workspace, NCCL buffers, allocator slack
            d.layer_overhead_us = 20;
            d.overlap = 1.0;
            d.link = std::move(link);
            d.per_node = 8;
            d.source = std::move(src);
            v.push_back(d);
        };
        // (memory in GiB as the devices report it: 24 GB GDDR6 = 22.5 GiB usable, 40 GB = 39.4 GiB)
        gpu("a10", "NVIDIA A10 24GB (PCIe)", 22.5, 600, 250, 125, 0.85, "pcie4", "NVIDIA A10 datasheet");
        gpu("a10g", "NVIDIA A10G 24GB (PCIe)", 22.5, 600, 140, 70, 0.85, "pcie4",
            "AWS G5 / NVIDIA A10G brief (approx.)");
        gpu("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", 39.4, 1555, 624, 312, 0.85, "pcie4", "NVIDIA A100 datasheet");
        gpu("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 79.2, 2039, 624, 312, 0.85, "nvlink3", "NVIDIA A100 datasheet");
        gpu("h100-sxm", "NVIDIA H100 SXM 80GB", 79.2, 3350, 1979, 989, 0.85, "nvlink4", "NVIDIA H100 datasheet");
        gpu("h200", "NVIDIA H200 SXM 141GB", 139.8, 4800, 1979, 989, 0.9, "nvlink4",
            "NVIDIA H200 datasheet; 4.3 TB/s measured copy");
        DeviceSpec c;
        c.name = "cpu";
        c.label = "CPU core (2-core AMD EPYC Zen 4 VM, AVX-512 VNNI; one rank per core)";
        c.mem_gib = 22.0;      // the node's memory (ranks of a node share it; see per_node)
        c.bw_gbs = 25;         // one rank streaming
        c.node_bw_gbs = 33;    // both ranks streaming at once
        c.int8_tops = 0.43;    // W8A8 GEMM of one core at prefill sizes (TinyLlama's shapes)
        c.fp16_tflops = 0.10;  // f32 per core (assumed: ~half the AVX-512 FMA peak; not measured)
        // f32 paged attention of one core: 38.5-40.6 GFLOP/s for 64-token prefill chunks, 14.0-14.9
        // for decode (bench_attention, TinyLlama's heads, 2-vCPU Xeon VM, 2026-12-03, after the
        // register-blocked kernel; 10 and 7.5 before it); not measured on the Zen 4 VM the other
        // figures come from.
        c.attn_tflops = 0.040;
        c.bw_eff = 1.0;  // the figures above are achieved rates already
        c.compute_eff = 1.0;
        c.reserved_gib = 0.1;
        c.node_int8_tops = 0.84;  // both cores
        c.layer_overhead_us = 15;
        c.overlap = 0.0;
        c.link = "shm";
        c.per_node = 2;
        c.cpu = true;
        c.source = "measured on the development VM (benchmarks/results/cpu-2core-epyc-zen4/plan_validation.json)";
        v.push_back(c);
        return v;
    }();
    return t;
}

const std::vector<LinkSpec>& link_table() {
    static const std::vector<LinkSpec> t = {
        {"pcie4", 3.5, 20, "PCIe 4.0 x16 31.5 GB/s/dir; NCCL ~20 GB/s, ~20 us per small all-reduce on 4 GPUs"},
        {"nvlink3", 2.0, 230, "NVLink 3: 300 GB/s/dir (A100 SXM); NCCL ~230 GB/s bus bandwidth"},
        {"nvlink4", 2.0, 360, "NVLink 4: 450 GB/s/dir (H100/H200 SXM); NCCL ~360 GB/s bus bandwidth"},
        {"ib-hdr", 5.0, 23, "InfiniBand HDR 200 Gb/s = 25 GB/s per port"},
        {"ib-hdr100", 5.0, 11.5, "InfiniBand HDR100 100 Gb/s = 12.5 GB/s per port; ~11.5 GB/s achieved bus bandwidth"},
        {"eth25", 10.0, 2.9, "25 Gb/s Ethernet = 3.1 GB/s; TCP ~2.9 GB/s, ~10 us a small message"},
        {"shm", 0.6, 1.7, "OpenMPI shared memory between CPU ranks of one node (measured, 2-core EPYC VM)"},
    };
    return t;
}

namespace {
template <class T>
const T& find_named(const std::vector<T>& table, const std::string& name, const char* what) {
    for (const T& x : table)
        if (x.name == name) return x;
    std::string names;
    for (const T& x : table) names += (names.empty() ? "" : ", ") + x.name;
    LATTICE_FAIL("unknown {} \"{}\" (known: {})", what, name, names);
}
}  // namespace

const DeviceSpec& find_device(const std::string& name) {
    return find_named(device_table(), name, "device");
}
const LinkSpec& find_link(const std::string& name) {
    return find_named(link_table(), name, "interconnect");
}

LinkSpec parse_link(const std::string& spec) {
    for (const LinkSpec& l : link_table())
        if (l.name == spec) return l;
    const size_t comma = spec.find(',');
    if (comma == std::string::npos) return find_link(spec);  // the error lists the names
    double bw = 0, alpha = -1;
    try {
        size_t a = 0, b = 0;
        bw = std::stod(spec.substr(0, comma), &a);
        alpha = std::stod(spec.substr(comma + 1), &b);
        if (a != comma || b != spec.size() - comma - 1) bw = 0;
    } catch (const std::exception&) {
        bw = 0;
    }
    LATTICE_CHECK(std::isfinite(bw) && bw > 0 && std::isfinite(alpha) && alpha >= 0,
                  "link \"{}\": a name or GB/s,latency-us (e.g. 12.5,5), bandwidth > 0 and latency >= 0", spec);
    return LinkSpec{fmt::format("{:g}GB/s,{:g}us", bw, alpha), alpha, bw, "given as GB/s,latency-us"};
}

}  // namespace lattice
