// The pure parts of `lattice doctor`'s probes and rules, without MPI, CUDA or a real /sys: CPU
// lists parsed and formatted, the ACS control word found in a config-space byte string (direct,
// chained, absent, broken chain, short), read_sysfs_text's trimming and size limit, and the
// findings from hand-made rank records (layout, ranks sharing a GPU, shared cores, IOMMU/ACS/P2P,
// mixed GPU types, NCCL_P2P_DISABLE) with their severity and order.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parallel/host_probe.h"
#include "parallel/launch_check.h"

using namespace lattice;
using nlohmann::json;

namespace {

// 4096 bytes of config space with extended capabilities {offset, id, next, control}.
std::string config_space(const std::vector<std::vector<uint32_t>>& caps, size_t size = 4096) {
    std::string b(size, '\0');
    for (const auto& c : caps) {
        const uint32_t h = c[1] | 1u << 16 | c[2] << 20;
        for (int i = 0; i < 4; ++i) b[c[0] + size_t(i)] = char(h >> (8 * i) & 0xff);
        b[c[0] + 6] = char(c[3] & 0xff);
        b[c[0] + 7] = char(c[3] >> 8 & 0xff);
    }
    return b;
}

json rank_record(int rank, const std::string& host, int local_rank, int local_size, const std::string& cpus,
                 int device = -1, int visible = 0) {
    return json{{"rank", rank}, {"host", host}, {"local_rank", local_rank}, {"local_size", local_size},
                {"cpus", cpus}, {"cuda_visible_devices", "(unset)"}, {"device", device}, {"visible_gpus", visible}};
}

}  // namespace

TEST_CASE("host_probe: cpulist parse and format") {
    CHECK(parse_cpulist("0-3,8,10-11") == std::set<int>{0, 1, 2, 3, 8, 10, 11});
    CHECK(parse_cpulist("") == std::set<int>{});
    CHECK(parse_cpulist("x,5,-2,7") == std::set<int>{5, 7});  // malformed pieces ignored
    CHECK(format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
    CHECK(format_cpulist({}) == "none");
    CHECK(format_cpulist({4}) == "4");
    CHECK(format_cpulist(parse_cpulist("0-63")) == "0-63");
}

TEST_CASE("host_probe: PCIe ACS control word from config space") {
    CHECK(pcie_acs_control(config_space({{0x100, 0x000d, 0, 0x001d}})) == 0x001d);
    // AER first, ACS second in the chain.
    CHECK(pcie_acs_control(config_space({{0x100, 0x0001, 0x140, 0xffff}, {0x140, 0x000d, 0, 0x0001}})) == 0x0001);
    CHECK(pcie_acs_control(config_space({{0x100, 0x0001, 0, 0}})) == -1);  // no ACS
    CHECK(pcie_acs_control(std::string(4096, '\0')) == -1);                // empty header
    CHECK(pcie_acs_control(std::string(64, '\0')) == -1);                  // non-root: 64 bytes only
    CHECK(pcie_acs_control(config_space({{0x100, 0x0001, 0x100, 0}})) == -1);  // a loop ends
}

TEST_CASE("host_probe: read_sysfs_text trims and limits") {
    const auto dir = std::filesystem::temp_directory_path() / "lattice_test_launch_check";
    std::filesystem::create_directories(dir);
    { std::ofstream(dir / "a") << "0x10de \n"; }
    { std::ofstream(dir / "big") << std::string(5000, 'x'); }
    CHECK(read_sysfs_text(dir / "a") == "0x10de");
    CHECK(read_sysfs_text(dir / "big").size() == 4096);
    CHECK(read_sysfs_text(dir / "big", 10) == "xxxxxxxxxx");
    CHECK(read_sysfs_text(dir / "missing").empty());
    std::filesystem::remove_all(dir);
}

TEST_CASE("launch_check: layout, shared cores, shared GPU, mixed types, NCCL_P2P_DISABLE") {
    std::vector<json> ranks{rank_record(0, "h", 0, 2, "0-1"), rank_record(1, "h", 1, 2, "1-2")};
    Findings f = check_launch(ranks, LaunchCheckInput{2, 2, 2, false});
    REQUIRE(f.size() == 2);
    CHECK(f[0].severity == Severity::kProblem);
    CHECK(f[0].message.find("world size 2 != tp 2 x pp 2") != std::string::npos);
    CHECK(f[0].fix == "launch with lattice-mpirun --tp 2 --pp 2 (it sets -np 4)");
    CHECK(f[1].severity == Severity::kWarning);
    CHECK(f[1].message == "CPU ranks 0 and 1 on h share CPUs 1 (their thread pools compete)");

    CHECK(check_launch(ranks, LaunchCheckInput{2, 1, 2, false}).size() == 1);  // layout fits
    ranks[1]["cpus"] = "2-3";
    CHECK(check_launch(ranks, LaunchCheckInput{}).empty());  // nothing asked, own cores
    f = check_launch(ranks, LaunchCheckInput{0, 0, 2, true});
    REQUIRE(f.size() == 1);
    CHECK(f[0].message.rfind("NCCL_P2P_DISABLE is set", 0) == 0);

    // Three ranks, two visible GPUs: they would share one; the third has none; two GPU types.
    std::vector<json> gpu{rank_record(0, "g", 0, 3, "0", 0, 2), rank_record(1, "g", 1, 3, "1", 1, 2),
                          rank_record(2, "g", 2, 3, "2", -1, 2)};
    gpu[0]["device_name"] = "A";
    gpu[1]["device_name"] = "B";
    f = check_launch(gpu, LaunchCheckInput{3, 1, 3, false});
    REQUIRE(f.size() == 3);
    CHECK(f[0].severity == Severity::kProblem);
    CHECK(f[0].message == "3 ranks on g but only 2 GPUs visible: ranks would share a GPU");
    CHECK(f[1].message == "rank 2 (local 2) on g has no GPU to pick (2 visible)");
    CHECK(f[2].severity == Severity::kWarning);
    CHECK(f[2].message == "mixed GPU types across ranks: A, B");
}

TEST_CASE("launch_check: IOMMU, ACS and P2P from host facts") {
    const json node{{"pci_gpus", json::array({json{{"bus", "0000:01:00.0"}, {"numa", 0}, {"iommu", "DMA"},
                                                   {"acs_redirect", json::array({"0000:00:01.0 (ACSCtl 0x001d)"})}},
                                              json{{"bus", "0000:02:00.0"}, {"numa", 1}, {"iommu", "identity"},
                                                   {"acs_redirect", json::array()}}})},
                    {"numa_nodes", 2},
                    {"p2p", json::array({json::array({1, 0}), json::array({0, 1})})}};
    Findings f;
    check_peer_to_peer("h", node, f);
    REQUIRE(f.size() == 3);
    CHECK(f[0].message == "IOMMU translates DMA for GPU 0000:01:00.0 on h (domain DMA)");
    CHECK(f[1].message == "PCIe ACS redirects P2P at bridge 0000:00:01.0 (ACSCtl 0x001d) above GPU 0000:01:00.0 on h");
    CHECK(f[2].message == "no CUDA P2P between GPU 0 and 1 on h");
    for (const Finding& x : f) CHECK(x.severity == Severity::kWarning);

    // One GPU: nothing to say about peer-to-peer.
    json one = node;
    one["pci_gpus"].erase(1);
    f.clear();
    check_peer_to_peer("h", one, f);
    CHECK(f.empty());

    // The host facts ride on local rank 0's record; check_launch finds them there (and, with no GPU
    // visible to the rank, says the PCI bus has some first).
    std::vector<json> ranks{rank_record(0, "h", 0, 1, "0")};
    ranks[0]["node"] = node;
    f = check_launch(ranks, LaunchCheckInput{});
    REQUIRE(f.size() == 4);
    CHECK(f[0].message == "2 NVIDIA GPUs on the PCI bus of h but none usable here");
    CHECK(f[3].message == "no CUDA P2P between GPU 0 and 1 on h");
}
