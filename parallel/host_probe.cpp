// The facts of this rank and its host (see host_probe.h): sysfs for PCI/NUMA/IOMMU/ACS/CPU lists,
// sched_getaffinity for this rank's CPUs, the CUDA runtime (LATTICE_HAVE_CUDA) for devices, free
// memory and the P2P matrix, NCCL (LATTICE_HAVE_NCCL) for its version. Moved out of launch/cmd_doctor.cpp
// unchanged: the records' keys and values are what the doctor report (and tests/launch/test_doctor.sh) reads.
#include "parallel/host_probe.h"

#include "base/error.h"
#include "parallel/world_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#if defined(LATTICE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(LATTICE_HAVE_NCCL) && __has_include(<nccl.h>)
#include <nccl.h>
#define LATTICE_PROBE_NCCL 1
#endif

namespace lattice {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_sysfs_text(const fs::path& p, size_t limit) {
    std::ifstream f(p, std::ios::binary);
    if (!f) return {};
    std::string s(limit, '\0');
    f.read(s.data(), std::streamsize(limit));
    s.resize(size_t(f.gcount()));
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

std::set<int> parse_cpulist(const std::string& text) {
    std::set<int> out;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find(',', pos);
        if (end == std::string::npos) end = text.size();
        std::string item = text.substr(pos, end - pos);
        pos = end + 1;
        int a = 0, b = 0;
        if (std::sscanf(item.c_str(), "%d-%d", &a, &b) == 2 && a >= 0 && b >= a && b - a < 65536) {
            for (int i = a; i <= b; ++i) out.insert(i);
        } else if (std::sscanf(item.c_str(), "%d", &a) == 1 && a >= 0) {
            out.insert(a);
        }
    }
    return out;
}

std::string format_cpulist(const std::set<int>& cpus) {
    std::vector<std::string> parts;
    for (auto it = cpus.begin(); it != cpus.end();) {
        int a = *it, b = a;
        while (++it != cpus.end() && *it == b + 1) b = *it;
        parts.push_back(a == b ? std::to_string(a) : fmt::format("{}-{}", a, b));
    }
    return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ","));
}

namespace {

std::set<int> my_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::set<int> out;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int i = 0; i < CPU_SETSIZE; ++i)
            if (CPU_ISSET(i, &set)) out.insert(i);
    return out;
}

}  // namespace

int pcie_acs_control(const std::string& config) {
    if (config.size() < 0x104) return -1;  // no extended config space readable (non-root: 64 bytes)
    auto u32 = [&](size_t off) {
        return uint32_t(uint8_t(config[off])) | uint32_t(uint8_t(config[off + 1])) << 8 |
               uint32_t(uint8_t(config[off + 2])) << 16 | uint32_t(uint8_t(config[off + 3])) << 24;
    };
    size_t off = 0x100;
    for (int hops = 0; hops < 64 && off >= 0x100 && off + 8 <= config.size(); ++hops) {
        uint32_t h = u32(off);
        if (h == 0 || h == 0xffffffffu) return -1;
        if ((h & 0xffff) == 0x000d) return int(uint8_t(config[off + 6]) | uint8_t(config[off + 7]) << 8);
        off = h >> 20;
    }
    return -1;
}

// Host-level facts from sysfs: NVIDIA display/3D controllers, their NUMA node, IOMMU domain type,
// and bridges above them whose ACS redirects peer-to-peer requests or completions.
json describe_pci(const fs::path& sysfs) {
    json gpus = json::array();
    std::error_code ec;
    fs::path devices = sysfs / "bus/pci/devices";
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(devices, ec)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& dev : entries) {
        if (read_sysfs_text(dev / "vendor") != "0x10de") continue;
        std::string cls = read_sysfs_text(dev / "class");
        if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
        json g;
        g["bus"] = dev.filename().string();
        std::string numa = read_sysfs_text(dev / "numa_node");
        g["numa"] = numa.empty() ? -1 : std::atoi(numa.c_str());
        fs::path group = fs::read_symlink(dev / "iommu_group", ec);
        g["iommu"] = ec ? std::string("none") : read_sysfs_text(dev / "iommu_group" / "type");
        if (!ec && g["iommu"].get<std::string>().empty()) g["iommu"] = "unknown";
        json acs = json::array();
        fs::path real = fs::canonical(dev, ec);
        if (!ec) {
            for (fs::path p = real.parent_path(); p.has_filename() && p != p.root_path(); p = p.parent_path()) {
                std::string name = p.filename().string();
                if (name.size() != 12 || name[4] != ':' || name[7] != ':') continue;  // dddd:bb:dd.f only
                int ctl = pcie_acs_control(read_sysfs_text(p / "config", 4096));
                if (ctl >= 0 && (ctl & 0x0c)) acs.push_back(fmt::format("{} (ACSCtl 0x{:04x})", name, ctl));
            }
        }
        g["acs_redirect"] = acs;
        gpus.push_back(g);
    }
    int numa_nodes = 0;
    for (const auto& e : fs::directory_iterator(sysfs / "devices/system/node", ec))
        if (e.path().filename().string().rfind("node", 0) == 0 && e.path().filename() != "node") ++numa_nodes;
    int iommu_groups = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(sysfs / "kernel/iommu_groups", ec)) ++iommu_groups;
    return json{{"pci_gpus", gpus}, {"numa_nodes", std::max(numa_nodes, 1)}, {"iommu_groups", iommu_groups}};
}

json describe_cuda_host() {
    json h = json::object();
#if defined(LATTICE_HAVE_CUDA)
    int drv = 0, rt = 0, n = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    h["cuda_driver"] = drv ? fmt::format("{}.{}", drv / 1000, drv % 1000 / 10) : "none";
    h["cuda_runtime"] = fmt::format("{}.{}", rt / 1000, rt % 1000 / 10);
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        h["cuda_error"] = cudaGetErrorString(err);
        n = 0;
    }
    json devs = json::array(), p2p = json::array();
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp prop{};
        cudaGetDeviceProperties(&prop, i);
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&free_b, &total_b);
        devs.push_back({{"index", i},
                        {"name", prop.name},
                        {"bus", fmt::format("{:04x}:{:02x}:{:02x}.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID)},
                        {"free_mib", free_b >> 20},
                        {"total_mib", total_b >> 20}});
        json row = json::array();
        for (int j = 0; j < n; ++j) {
            int ok = (i == j);
            if (i != j) cudaDeviceCanAccessPeer(&ok, i, j);
            row.push_back(ok);
        }
        p2p.push_back(row);
    }
    h["cuda_devices"] = devs;
    h["p2p"] = p2p;
#endif
    return h;
}

json describe_rank(int rank, int local_rank, int local_size, const fs::path& sysfs,
                   const char* cuda_visible_devices) {
    json r{{"rank", rank}, {"host", host_name()}, {"local_rank", local_rank}, {"local_size", local_size}};
    std::set<int> cpus = my_cpus();
    r["cpus"] = format_cpulist(cpus);
    r["cuda_visible_devices"] = cuda_visible_devices ? cuda_visible_devices : "(unset)";
    r["device"] = -1;
#if defined(LATTICE_HAVE_CUDA)
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    r["visible_gpus"] = n;
    const int device = device_of_local_rank(local_rank, local_size);
    if (device < n) {
        cudaDeviceProp prop{};
        cudaGetDeviceProperties(&prop, device);
        std::string bus = fmt::format("{:04x}:{:02x}:{:02x}.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
        r["device"] = device;
        r["device_name"] = prop.name;
        r["device_bus"] = bus;
        std::string numa = read_sysfs_text(sysfs / "bus/pci/devices" / bus / "numa_node");
        int node = numa.empty() ? -1 : std::atoi(numa.c_str());
        r["device_numa"] = node;
        if (node >= 0) {
            std::set<int> near = parse_cpulist(read_sysfs_text(sysfs / fmt::format("devices/system/node/node{}/cpulist", node)));
            r["cpus_on_device_numa"] = !near.empty() && std::includes(near.begin(), near.end(), cpus.begin(), cpus.end());
            r["device_numa_cpus"] = format_cpulist(near);
        }
    }
#else
    r["visible_gpus"] = 0;
#endif
    return r;
}

// The first "model name" of /proc/cpuinfo ("" where there is none: other architectures, no procfs).
std::string cpu_model_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            return colon == std::string::npos ? std::string() : line.substr(line.find_first_not_of(" \t", colon + 1));
        }
    return {};
}

json describe_host(const fs::path& sysfs) {
    json node = describe_pci(sysfs);
    node.update(describe_cuda_host());
    node["cpus_online"] = read_sysfs_text(sysfs / "devices/system/cpu/online");
    node["cpu_model"] = cpu_model_name();
    return node;
}

std::string versions_line() {
    std::string s = "lattice 0.1.0, CUDA backend: ";
#if defined(LATTICE_HAVE_CUDA)
    s += "built";
#else
    s += "not built (CPU only)";
#endif
#if defined(LATTICE_PROBE_NCCL)
    int v = 0;
    ncclGetVersion(&v);
    s += fmt::format(", NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
#else
    s += ", NCCL: not built";
#endif
    return s;
}

}  // namespace lattice
