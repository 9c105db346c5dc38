// The launch rules of `lattice doctor` (see launch_check.h) over the gathered rank records. The
// layout rules themselves are WorldConfig's (world_config.h): this file asks them, it does not
// restate them. Messages and fixes are the report's text, byte for byte (tests/launch/test_doctor.sh).
#include "parallel/launch_check.h"

#include "base/error.h"
#include "parallel/host_probe.h"
#include "parallel/world_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

namespace lattice {

using nlohmann::json;
using HostRanks = std::vector<const json*>;

void check_layout(const LaunchCheckInput& opt, Findings& f) {
    if (opt.tp == 0 && opt.pp == 0) return;
    const int tp = std::max(opt.tp, 1), pp = std::max(opt.pp, 1);
    try {
        (void)WorldConfig::make(opt.world, tp, pp, 0);
    } catch (const Error& e) {
        f.push_back({Severity::kProblem, e.message(),
                     fmt::format("launch with lattice-mpirun --tp {} --pp {} (it sets -np {})", tp, pp, tp * pp)});
    }
}

void check_host_gpus(const std::string& host, const HostRanks& rs, const json& hn, const LaunchCheckInput& opt,
                     size_t hosts, Findings& f) {
    const int pci_gpus = int(hn.value("pci_gpus", json::array()).size());
    const int visible = rs.front()->value("visible_gpus", 0);
    const int per_host = int(rs.size());
    if (opt.tp > 0 && hosts > 1 && !node_holds_whole_tp_groups(per_host, opt.tp))
        f.push_back({Severity::kWarning, fmt::format("{} ranks on {} do not hold whole TP groups of {}", per_host, host, opt.tp),
                     "put tp ranks on each node (TP inside a node, PP across nodes): lattice-mpirun does"});
    if (visible > 0 && per_host > visible)
        f.push_back({Severity::kProblem, fmt::format("{} ranks on {} but only {} GPUs visible: ranks would share a GPU", per_host,
                                       host, visible),
                     "use one rank per GPU (lattice-mpirun --tp/--pp), or add nodes"});
    if (visible == 0 && pci_gpus > 0)
        f.push_back({Severity::kWarning, fmt::format("{} NVIDIA GPUs on the PCI bus of {} but none usable here", pci_gpus, host),
                     "build with CUDA (cmake -DLATTICE_CUDA=ON) and check the driver (nvidia-smi)"});
    std::set<std::string> cvds;
    for (const json* r : rs) cvds.insert((*r)["cuda_visible_devices"].get<std::string>());
    if (cvds.size() > 1)
        f.push_back({Severity::kWarning, fmt::format("ranks on {} see different CUDA_VISIBLE_DEVICES ({})", host, fmt::join(cvds, " | ")),
                     "do not set CUDA_VISIBLE_DEVICES per rank: each rank picks device = local rank"});
    for (const json* r : rs) {
        if (visible > 0 && (*r)["device"] == -1)
            f.push_back({Severity::kProblem, fmt::format("rank {} (local {}) on {} has no GPU to pick ({} visible)", (*r)["rank"].get<int>(),
                                           (*r)["local_rank"].get<int>(), host, (*r)["visible_gpus"].get<int>()),
                         "each rank uses device <local rank>: leave all of the node's GPUs visible to every rank"});
        if (r->value("cpus_on_device_numa", true) == false && hn.value("numa_nodes", 1) > 1)
            f.push_back({Severity::kWarning, fmt::format("rank {} runs on CPUs {} but its GPU {} sits on NUMA node {} (CPUs {})",
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
            f.push_back({Severity::kWarning, fmt::format("CPU ranks {} and {} on {} share CPUs {} (their thread pools compete)",
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
            f.push_back({Severity::kWarning, fmt::format("IOMMU translates DMA for GPU {} on {} (domain {})", g["bus"].get<std::string>(), host, it),
                         "PCIe P2P may fail or hang: boot with iommu=pt (intel_iommu=on iommu=pt), or set NCCL_P2P_DISABLE=1"});
        for (const json& b : g["acs_redirect"])
            f.push_back({Severity::kWarning, fmt::format("PCIe ACS redirects P2P at bridge {} above GPU {} on {}", b.get<std::string>(),
                                            g["bus"].get<std::string>(), host),
                         "P2P is routed through the root complex or hangs: disable ACS on that bridge "
                         "(root: setpci -s <bridge> ECAP_ACS+0x6.w=0000, each boot) or in the BIOS; else set NCCL_P2P_DISABLE=1"});
    }
    const json p2p = hn.value("p2p", json::array());
    for (size_t i = 0; i < p2p.size(); ++i)
        for (size_t j = 0; j < p2p[i].size(); ++j)
            if (i < j && p2p[i][j] == 0)
                f.push_back({Severity::kWarning, fmt::format("no CUDA P2P between GPU {} and {} on {}", i, j, host),
                             "NCCL falls back to host shared memory (about half the bandwidth); see the ACS/IOMMU warnings"});
}

Findings check_launch(const std::vector<json>& ranks, const LaunchCheckInput& opt) {
    Findings f;
    check_layout(opt, f);
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
        f.push_back({Severity::kWarning, fmt::format("mixed GPU types across ranks: {}", fmt::join(names, ", ")),
                     "the slowest GPU sets the pace and memory limits differ: run one GPU type per job"});
    if (opt.nccl_p2p_disabled)
        f.push_back({Severity::kWarning, "NCCL_P2P_DISABLE is set: GPU-to-GPU copies go through host memory",
                     "unset it unless P2P is broken on this machine (ACS/IOMMU); lattice-mpirun sets NCCL_P2P_LEVEL=PXB instead"});
    return f;
}

}  // namespace lattice
