// `lattice doctor [--tp T --pp P]`: preflight report for a launch, run under mpirun/srun like the
// real job. Every rank describes itself (host, local rank, CPU binding, the GPU it would use);
// local rank 0 of each host also describes the host (GPUs on the PCI bus, NUMA nodes, IOMMU, PCIe
// ACS, P2P matrix, free memory). Rank 0 gathers the JSON records, prints them, then prints
// warnings, each with its fix, for the traps that make multi-GPU jobs hang or crawl before the
// first token. Exit 0 when nothing blocks the layout, 1 when something does (world != tp*pp,
// two ranks on one GPU, a rank with no GPU to pick).
// The ranks come from parallel/world_session.h (MPI stays behind it), like every other command; a
// build without MPI reports its one process as the whole world. The layout rules (world == tp x pp,
// whole TP groups per node, device = local rank) are WorldConfig's (parallel/world_config.h).
// PCI facts come from sysfs (--sysfs DIR substitutes a fake tree in tests), so the CPU build also
// sees NVIDIA devices and ACS/IOMMU state; CUDA/NCCL facts are compiled in only with
// LATTICE_HAVE_CUDA / LATTICE_HAVE_NCCL. Device choice is the engine's: local rank i uses CUDA
// device i of those visible (device_of_local_rank).
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "base/error.h"
#include "parallel/world_config.h"
#include "parallel/world_session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#if defined(LATTICE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(LATTICE_HAVE_NCCL) && __has_include(<nccl.h>)
#include <nccl.h>
#define LATTICE_DOCTOR_NCCL 1
#endif

namespace lattice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct DoctorOptions {
    int tp = 0;  // 0: not given
    int pp = 0;
    std::string sysfs = "/sys";
};

std::string read_text(const fs::path& p, size_t limit = 4096) {
    std::ifstream f(p, std::ios::binary);
    if (!f) return {};
    std::string s(limit, '\0');
    f.read(s.data(), std::streamsize(limit));
    s.resize(size_t(f.gcount()));
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; malformed pieces are ignored (sysfs is trusted but terse).
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

std::set<int> my_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::set<int> out;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int i = 0; i < CPU_SETSIZE; ++i)
            if (CPU_ISSET(i, &set)) out.insert(i);
    return out;
}

// PCIe ACS control word of a device from its config space (extended capability 0x000D), or -1.
int acs_control(const std::string& config) {
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
        if (read_text(dev / "vendor") != "0x10de") continue;
        std::string cls = read_text(dev / "class");
        if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
        json g;
        g["bus"] = dev.filename().string();
        std::string numa = read_text(dev / "numa_node");
        g["numa"] = numa.empty() ? -1 : std::atoi(numa.c_str());
        fs::path group = fs::read_symlink(dev / "iommu_group", ec);
        g["iommu"] = ec ? std::string("none") : read_text(dev / "iommu_group" / "type");
        if (!ec && g["iommu"].get<std::string>().empty()) g["iommu"] = "unknown";
        json acs = json::array();
        fs::path real = fs::canonical(dev, ec);
        if (!ec) {
            for (fs::path p = real.parent_path(); p.has_filename() && p != p.root_path(); p = p.parent_path()) {
                std::string name = p.filename().string();
                if (name.size() != 12 || name[4] != ':' || name[7] != ':') continue;  // dddd:bb:dd.f only
                int ctl = acs_control(read_text(p / "config", 4096));
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

json describe_rank(int rank, int local_rank, int local_size, const fs::path& sysfs) {
    json r{{"rank", rank}, {"host", host_name()}, {"local_rank", local_rank}, {"local_size", local_size}};
    std::set<int> cpus = my_cpus();
    r["cpus"] = format_cpulist(cpus);
    const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
    r["cuda_visible_devices"] = cvd ? cvd : "(unset)";
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
        std::string numa = read_text(sysfs / "bus/pci/devices" / bus / "numa_node");
        int node = numa.empty() ? -1 : std::atoi(numa.c_str());
        r["device_numa"] = node;
        if (node >= 0) {
            std::set<int> near = parse_cpulist(read_text(sysfs / fmt::format("devices/system/node/node{}/cpulist", node)));
            r["cpus_on_device_numa"] = !near.empty() && std::includes(near.begin(), near.end(), cpus.begin(), cpus.end());
            r["device_numa_cpus"] = format_cpulist(near);
        }
    }
#else
    r["visible_gpus"] = 0;
#endif
    return r;
}

std::string versions_line() {
    std::string s = "lattice 0.1.0, CUDA backend: ";
#if defined(LATTICE_HAVE_CUDA)
    s += "built";
#else
    s += "not built (CPU only)";
#endif
#if defined(LATTICE_DOCTOR_NCCL)
    int v = 0;
    ncclGetVersion(&v);
    s += fmt::format(", NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
#else
    s += ", NCCL: not built";
#endif
    return s;
}

// One JSON record per rank on rank 0, in rank order (other ranks get none).
std::vector<json> gather_json(const json& mine) {
    std::vector<json> out;
    for (const std::string& text : gather_strings_to_root(mine.dump())) out.push_back(json::parse(text));
    return out;
}

struct Finding {
    bool blocking;
    std::string what, fix;
};

using Findings = std::vector<Finding>;
using HostRanks = std::vector<const json*>;

// The asked layout against the world (WorldConfig::make's rule and message).
void check_layout(const DoctorOptions& opt, int world, Findings& f) {
    if (opt.tp == 0 && opt.pp == 0) return;
    const int tp = std::max(opt.tp, 1), pp = std::max(opt.pp, 1);
    try {
        (void)WorldConfig::make(world, tp, pp, 0);
    } catch (const Error& e) {
        f.push_back({true, e.message(),
                     fmt::format("launch with lattice-mpirun --tp {} --pp {} (it sets -np {})", tp, pp, tp * pp)});
    }
}

// Per host: whole TP groups, enough GPUs, one GPU per rank, consistent CUDA_VISIBLE_DEVICES.
void check_host_gpus(const std::string& host, const HostRanks& rs, const json& hn, const DoctorOptions& opt,
                     size_t hosts, Findings& f) {
    const int pci_gpus = int(hn.value("pci_gpus", json::array()).size());
    const int visible = rs.front()->value("visible_gpus", 0);
    const int per_host = int(rs.size());
    if (opt.tp > 0 && hosts > 1 && !node_holds_whole_tp_groups(per_host, opt.tp))
        f.push_back({false, fmt::format("{} ranks on {} do not hold whole TP groups of {}", per_host, host, opt.tp),
                     "put tp ranks on each node (TP inside a node, PP across nodes): lattice-mpirun does"});
    if (visible > 0 && per_host > visible)
        f.push_back({true, fmt::format("{} ranks on {} but only {} GPUs visible: ranks would share a GPU", per_host,
                                       host, visible),
                     "use one rank per GPU (lattice-mpirun --tp/--pp), or add nodes"});
    if (visible == 0 && pci_gpus > 0)
        f.push_back({false, fmt::format("{} NVIDIA GPUs on the PCI bus of {} but none usable here", pci_gpus, host),
                     "build with CUDA (cmake -DLATTICE_CUDA=ON) and check the driver (nvidia-smi)"});
    std::set<std::string> cvds;
    for (const json* r : rs) cvds.insert((*r)["cuda_visible_devices"].get<std::string>());
    if (cvds.size() > 1)
        f.push_back({false, fmt::format("ranks on {} see different CUDA_VISIBLE_DEVICES ({})", host, fmt::join(cvds, " | ")),
                     "do not set CUDA_VISIBLE_DEVICES per rank: each rank picks device = local rank"});
    for (const json* r : rs) {
        if (visible > 0 && (*r)["device"] == -1)
            f.push_back({true, fmt::format("rank {} (local {}) on {} has no GPU to pick ({} visible)", (*r)["rank"].get<int>(),
                                           (*r)["local_rank"].get<int>(), host, (*r)["visible_gpus"].get<int>()),
                         "each rank uses device <local rank>: leave all of the node's GPUs visible to every rank"});
        if (r->value("cpus_on_device_numa", true) == false && hn.value("numa_nodes", 1) > 1)
            f.push_back({false, fmt::format("rank {} runs on CPUs {} but its GPU {} sits on NUMA node {} (CPUs {})",
                                            (*r)["rank"].get<int>(), (*r)["cpus"].get<std::string>(),
                                            r->value("device_bus", ""), r->value("device_numa", -1),
                                            r->value("device_numa_cpus", "")),
                         "bind each rank to its GPU's NUMA node: lattice-mpirun does (--map-by ppr:c:numa --bind-to numa)"});
    }
}

// CPU ranks sharing cores: each rank's thread pool pins its threads to the first CPUs it may use,
// so overlapping affinity means pools fighting over the same cores. One line per host is enough.
void check_shared_cores(const std::string& host, const HostRanks& rs, Findings& f) {
    for (size_t a = 0; a < rs.size(); ++a)
        for (size_t b = a + 1; b < rs.size(); ++b) {
            if ((*rs[a])["device"] != -1 || (*rs[b])["device"] != -1) continue;
            std::set<int> ca = parse_cpulist((*rs[a])["cpus"].get<std::string>());
            std::set<int> cb = parse_cpulist((*rs[b])["cpus"].get<std::string>());
            std::vector<int> both;
            std::set_intersection(ca.begin(), ca.end(), cb.begin(), cb.end(), std::back_inserter(both));
            if (both.empty()) continue;
            f.push_back({false, fmt::format("CPU ranks {} and {} on {} share CPUs {} (their thread pools compete)",
                                            (*rs[a])["rank"].get<int>(), (*rs[b])["rank"].get<int>(), host,
                                            format_cpulist(std::set<int>(both.begin(), both.end()))),
                         "give each rank its own cores: lattice-mpirun --cpu binds equal core blocks when there are enough cores"});
            return;
        }
}

// Several GPUs on a host: IOMMU translation, ACS redirection and missing P2P slow or hang NCCL.
void check_peer_to_peer(const std::string& host, const json& hn, Findings& f) {
    if (hn.value("pci_gpus", json::array()).size() < 2) return;
    for (const json& g : hn["pci_gpus"]) {
        std::string it = g.value("iommu", "none");
        if (it == "DMA" || it == "DMA-FQ")
            f.push_back({false, fmt::format("IOMMU translates DMA for GPU {} on {} (domain {})", g["bus"].get<std::string>(), host, it),
                         "PCIe P2P may fail or hang: boot with iommu=pt (intel_iommu=on iommu=pt), or set NCCL_P2P_DISABLE=1"});
        for (const json& b : g["acs_redirect"])
            f.push_back({false, fmt::format("PCIe ACS redirects P2P at bridge {} above GPU {} on {}", b.get<std::string>(),
                                            g["bus"].get<std::string>(), host),
                         "P2P is routed through the root complex or hangs: disable ACS on that bridge "
                         "(root: setpci -s <bridge> ECAP_ACS+0x6.w=0000, each boot) or in the BIOS; else set NCCL_P2P_DISABLE=1"});
    }
    const json p2p = hn.value("p2p", json::array());
    for (size_t i = 0; i < p2p.size(); ++i)
        for (size_t j = 0; j < p2p[i].size(); ++j)
            if (i < j && p2p[i][j] == 0)
                f.push_back({false, fmt::format("no CUDA P2P between GPU {} and {} on {}", i, j, host),
                             "NCCL falls back to host shared memory (about half the bandwidth); see the ACS/IOMMU warnings"});
}

Findings check(const std::vector<json>& ranks, const DoctorOptions& opt, int world) {
    Findings f;
    check_layout(opt, world, f);
    std::map<std::string, HostRanks> by_host;
    for (const json& r : ranks) by_host[r["host"].get<std::string>()].push_back(&r);
    std::set<std::string> names;
    for (const auto& [host, rs] : by_host) {
        static const json kNoNode = json::object();
        const json* head = nullptr;  // local rank 0's record carries the host facts
        for (const json* r : rs) {
            if (r->contains("node")) head = r;
            if (r->contains("device_name")) names.insert((*r)["device_name"].get<std::string>());
        }
        const json& hn = head ? (*head)["node"] : kNoNode;
        check_host_gpus(host, rs, hn, opt, by_host.size(), f);
        check_shared_cores(host, rs, f);
        check_peer_to_peer(host, hn, f);
    }
    if (names.size() > 1)
        f.push_back({false, fmt::format("mixed GPU types across ranks: {}", fmt::join(names, ", ")),
                     "the slowest GPU sets the pace and memory limits differ: run one GPU type per job"});
    const char* p2p_off = std::getenv("NCCL_P2P_DISABLE");
    if (p2p_off && *p2p_off && std::string(p2p_off) != "0")
        f.push_back({false, "NCCL_P2P_DISABLE is set: GPU-to-GPU copies go through host memory",
                     "unset it unless P2P is broken on this machine (ACS/IOMMU); lattice-mpirun sets NCCL_P2P_LEVEL=PXB instead"});
    return f;
}

// Rank 0's report: versions, hosts, ranks, findings. Returns the number of blocking findings.
int print_report(const std::vector<json>& all, const DoctorOptions& opt, int world) {
    std::set<std::string> hosts;
    for (const json& r : all) hosts.insert(r["host"].get<std::string>());
    print_stdout("lattice doctor\n  version: {}\n  MPI: {}\n", versions_line(), mpi_library_name());
    print_stdout("  world: {} rank(s) on {} host(s)", world, hosts.size());
    if (opt.tp || opt.pp) print_stdout(", asked tp {} x pp {}", std::max(opt.tp, 1), std::max(opt.pp, 1));
    print_stdout("\n");
    for (const json& r : all) {
        if (!r.contains("node")) continue;
        const json& n = r["node"];
        print_stdout("host {}: CPUs {}, NUMA nodes {}, IOMMU groups {}\n", r["host"].get<std::string>(),
                     n.value("cpus_online", "?"), n.value("numa_nodes", 1), n.value("iommu_groups", 0));
        if (n.contains("cuda_driver"))
            print_stdout("  CUDA driver {}, runtime {}{}\n", n["cuda_driver"].get<std::string>(),
                         n["cuda_runtime"].get<std::string>(),
                         n.contains("cuda_error") ? ", cudaGetDeviceCount: " + n["cuda_error"].get<std::string>() : "");
        if (n["pci_gpus"].empty()) print_stdout("  no GPUs (no NVIDIA device on the PCI bus)\n");
        for (const json& g : n["pci_gpus"])
            print_stdout("  PCI GPU {}: NUMA {}, IOMMU {}, ACS-redirecting bridges above: {}\n",
                         g["bus"].get<std::string>(), g["numa"].get<int>(), g["iommu"].get<std::string>(),
                         g["acs_redirect"].empty() ? "none" : g["acs_redirect"].dump());
        for (const json& d : n.value("cuda_devices", json::array()))
            print_stdout("  cuda:{} {} ({}), free {} / {} MiB\n", d["index"].get<int>(), d["name"].get<std::string>(),
                         d["bus"].get<std::string>(), d["free_mib"].get<uint64_t>(), d["total_mib"].get<uint64_t>());
        if (n.contains("p2p") && n["p2p"].size() > 1) {
            print_stdout("  P2P access (row can access column):\n");
            for (size_t i = 0; i < n["p2p"].size(); ++i)
                print_stdout("    {}: {}\n", i, fmt::join(n["p2p"][i].get<std::vector<int>>(), " "));
        }
    }
    for (const json& r : all) {
        std::string dev = r["device"] == -1 ? "no GPU" : fmt::format("cuda:{} {} NUMA {}", r["device"].get<int>(), r.value("device_name", ""), r.value("device_numa", -1));
        print_stdout("rank {} on {}: local rank {}/{}, CPUs {}, GPUs visible {}, uses {}\n", r["rank"].get<int>(),
                     r["host"].get<std::string>(), r["local_rank"].get<int>(), r["local_size"].get<int>(),
                     r["cpus"].get<std::string>(), r["visible_gpus"].get<int>(), dev);
    }
    const Findings findings = check(all, opt, world);
    int blocking = 0;
    for (const Finding& x : findings) {
        print_stdout("{}: {}\n  fix: {}\n", x.blocking ? "PROBLEM" : "warning", x.what, x.fix);
        blocking += x.blocking;
    }
    print_stdout("result: {}\n", blocking ? fmt::format("{} problem(s) block this launch", blocking)
                                          : fmt::format("ok ({} warning(s))", findings.size()));
    std::fflush(stdout);
    return blocking;
}

int run_doctor(const DoctorOptions& opt) {
    const WorldPlace me = join_world();  // initializes MPI (finalized by main) and knows the local ranks
    json mine = describe_rank(me.rank, me.local_rank, me.local_size, opt.sysfs);
    if (me.local_rank == 0) {
        json node = describe_pci(opt.sysfs);
        node.update(describe_cuda_host());
        node["cpus_online"] = read_text(fs::path(opt.sysfs) / "devices/system/cpu/online");
        mine["node"] = node;
    }
    const std::vector<json> all = gather_json(mine);
    const int blocking = broadcast_int_from_root(me.rank == 0 ? print_report(all, opt, me.size) : 0);
    return blocking ? 1 : 0;
}

}  // namespace

void add_doctor_command(CLI::App& app, CommandRun& run) {
    auto* cmd = app.add_subcommand("doctor", "Preflight report: versions, ranks, hosts, GPUs, P2P, NUMA, known traps");
    auto opt = std::make_shared<DoctorOptions>();
    cmd->add_option("--tp", opt->tp, "tensor-parallel size the job will use (checks world == tp*pp)")
        ->check(tp_flag_range())
        ->default_str("not checked");
    cmd->add_option("--pp", opt->pp, "pipeline-parallel size the job will use")
        ->check(pp_flag_range())
        ->default_str("not checked");
    cmd->add_option("--sysfs", opt->sysfs, "read PCI/NUMA/IOMMU facts from this tree instead of /sys (tests)");
    cmd->footer(R"(Examples:
  lattice doctor
  mpirun -np 2 --oversubscribe lattice doctor --tp 2
  launch/lattice-mpirun --tp 8 -- lattice doctor)");
    cmd->callback([&run, opt] { run = [opt] { return run_doctor(*opt); }; });
}

}  // namespace lattice
