// The rules a launch is checked against before its first token (`lattice doctor`): layout (world ==
// tp x pp, WorldConfig's rule and message), whole TP groups per node, one GPU per rank, consistent
// CUDA_VISIBLE_DEVICES, NUMA binding, CPU ranks sharing cores, IOMMU/ACS/P2P between GPUs, mixed
// GPU types, NCCL_P2P_DISABLE.
// Invariants: pure functions of the gathered records (parallel/host_probe.h's describe_rank, with
// local rank 0's carrying describe_host under "node") and the inputs below; nothing here probes the
// machine or reads the environment. Findings come in a fixed order (layout; then per host, in host
// name order: GPUs, shared cores, peer-to-peer; then the job-wide ones), so the report is stable.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace lattice {

enum class Severity { kWarning, kProblem };  // a problem blocks the launch

struct Finding {
    Severity severity;
    std::string message, fix;
};
using Findings = std::vector<Finding>;

struct LaunchCheckInput {
    int tp = 0;  // 0: not given (with pp 0 as well: the layout is not checked)
    int pp = 0;
    int world = 1;
    bool nccl_p2p_disabled = false;  // NCCL_P2P_DISABLE set and not "0"
};

// The asked layout against the world (WorldConfig::make's rule and message).
void check_layout(const LaunchCheckInput& in, Findings& f);
// Per host: whole TP groups, enough GPUs, one GPU per rank, consistent CUDA_VISIBLE_DEVICES, NUMA.
void check_host_gpus(const std::string& host, const std::vector<const nlohmann::json*>& ranks,
                     const nlohmann::json& host_facts, const LaunchCheckInput& in, size_t hosts, Findings& f);
// CPU ranks (no device) on one host with overlapping affinity; one finding per host at most.
void check_shared_cores(const std::string& host, const std::vector<const nlohmann::json*>& ranks, Findings& f);
// Several GPUs on a host: IOMMU translation, ACS redirection, missing CUDA P2P.
void check_peer_to_peer(const std::string& host, const nlohmann::json& host_facts, Findings& f);
// All of the above over every rank's record, then mixed GPU types and NCCL_P2P_DISABLE.
Findings check_launch(const std::vector<nlohmann::json>& ranks, const LaunchCheckInput& in);

}  // namespace lattice
