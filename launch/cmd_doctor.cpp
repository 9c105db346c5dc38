// `lattice doctor [--tp T --pp P]`: preflight report for a launch, run under mpirun/srun like the
// real job. Every rank describes itself (host, local rank, CPU binding, the GPU it would use);
// local rank 0 of each host also describes the host (GPUs on the PCI bus, NUMA nodes, IOMMU, PCIe
// ACS, P2P matrix, free memory). Rank 0 gathers the JSON records, prints them, then prints
// warnings, each with its fix, for the traps that make multi-GPU jobs hang or crawl before the
// first token. Exit 0 when nothing blocks the layout, 1 when something does (world != tp*pp,
// two ranks on one GPU, a rank with no GPU to pick).
// This file is the front only: options, gathering through parallel/world_session.h (MPI stays
// behind it; a build without MPI reports its one process as the whole world) and printing. The
// facts are parallel/host_probe.h's (sysfs, --sysfs DIR substituting a fake tree in tests; CUDA/NCCL
// facts only with LATTICE_HAVE_CUDA / LATTICE_HAVE_NCCL), the findings parallel/launch_check.h's
// (asking WorldConfig for the layout rules: world == tp x pp, whole TP groups per node, device =
// local rank). The environment (CUDA_VISIBLE_DEVICES, NCCL_P2P_DISABLE) is read here and passed down.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/isa.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "parallel/host_probe.h"
#include "parallel/launch_check.h"
#include "parallel/world_session.h"

namespace lattice {
namespace {

using nlohmann::json;

struct DoctorOptions {
    int tp = 0;  // 0: not given
    int pp = 0;
    std::string sysfs = "/sys";
};

// This process's CPU kernels (kernels/cpu/isa.h, as LATTICE_ISA and LATTICE_INT8_GEMM leave them): the ISA level
// every family runs and the best this machine allows, AMX used or why not, who runs the W8A8 and W4A8 GEMMs at
// m >= 16,
// whether --dtype bf16 multiplies in vdpbf16ps pairs (else widened to f32).
// The ranks of a host share the CPU and the environment, so local rank 0 reports it with the host.
json cpu_kernels() {
    const IsaLevel level = detect_isa();
    const std::string amx = level == IsaLevel::kAmx ? std::string("used")
                            : amx_note().empty()
                                ? fmt::format("available, not used: the level is pinned to {}", isa_name(level))
                                : fmt::format("not used: {}", amx_note());
    return {{"level", isa_name(level)},
            {"best", isa_name(best_isa())},
            {"amx", amx},
            {"w8a8_m16", int8_prefill_kernel(level)},
            {"w4a8_m16", int4_prefill_kernel(level)},
            {"bf16_pairs", gemm_bf16_dot_available(level)}};
}

// One JSON record per rank on rank 0, in rank order (other ranks get none).
std::vector<json> gather_json(const json& mine) {
    std::vector<json> out;
    for (const std::string& text : gather_strings_to_root(mine.dump())) out.push_back(json::parse(text));
    return out;
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
        if (n.contains("cpu_kernels")) {
            const json& c = n["cpu_kernels"];
            print_stdout("  CPU {}: kernels at {} (best here {}), AMX {}, W8A8 GEMMs at m >= 16 by {}, W4A8 by {}{}\n",
                         n.value("cpu_model", "?"), c["level"].get<std::string>(), c["best"].get<std::string>(),
                         c["amx"].get<std::string>(), c["w8a8_m16"].get<std::string>(), c.value("w4a8_m16", "?"),
                         c["bf16_pairs"].get<bool>() ? ", --dtype bf16 in vdpbf16ps pairs" : "");
        }
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
    const char* p2p_off = std::getenv("NCCL_P2P_DISABLE");
    const LaunchCheckInput in{opt.tp, opt.pp, world, p2p_off && *p2p_off && std::string(p2p_off) != "0"};
    const Findings findings = check_launch(all, in);
    int blocking = 0;
    for (const Finding& x : findings) {
        const bool blocks = x.severity == Severity::kProblem;
        print_stdout("{}: {}\n  fix: {}\n", blocks ? "PROBLEM" : "warning", x.message, x.fix);
        blocking += blocks;
    }
    print_stdout("result: {}\n", blocking ? fmt::format("{} problem(s) block this launch", blocking)
                                          : fmt::format("ok ({} warning(s))", findings.size()));
    std::fflush(stdout);
    return blocking;
}

int run_doctor(const DoctorOptions& opt) {
    const WorldPlace me = join_world();  // initializes MPI (finalized by main) and knows the local ranks
    json mine = describe_rank(me.rank, me.local_rank, me.local_size, opt.sysfs, std::getenv("CUDA_VISIBLE_DEVICES"));
    if (me.local_rank == 0) {
        mine["node"] = describe_host(opt.sysfs);
        mine["node"]["cpu_kernels"] = cpu_kernels();
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
