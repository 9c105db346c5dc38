// The facts of this rank and its host, as `lattice doctor` reports them: who this rank is (host,
// local rank, CPU binding, the CUDA device it would use), what the host has (NVIDIA GPUs on the PCI
// bus, their NUMA node, IOMMU domain, ACS-redirecting bridges above them; NUMA nodes, IOMMU groups,
// online CPUs; CUDA devices, free memory and the P2P matrix) and the versions built in.
// Invariants: probes only read, never change, the machine (except cudaSetDevice to ask free
// memory); sysfs is always a parameter (tests pass a fake tree), never assumed to be /sys; nothing
// here reads argv or the environment (the caller passes CUDA_VISIBLE_DEVICES in). CUDA facts are
// compiled in only with LATTICE_HAVE_CUDA, the NCCL version only with LATTICE_HAVE_NCCL; without
// them the records simply lack those keys. Records are JSON objects whose keys the report and
// parallel/launch_check.h read (see describe_rank / describe_host).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <set>
#include <string>

namespace lattice {

// A small text file (sysfs attribute), at most `limit` bytes, trailing newlines/spaces removed;
// empty when it cannot be read.
std::string read_sysfs_text(const std::filesystem::path& p, size_t limit = 4096);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; malformed pieces are ignored (sysfs is trusted but terse).
std::set<int> parse_cpulist(const std::string& text);
// The inverse, with runs folded ("0-3,8,10-11"); "none" for the empty set.
std::string format_cpulist(const std::set<int>& cpus);

// PCIe ACS control word of a device from its config space bytes (extended capability 0x000D), or
// -1 (no extended config space readable, no ACS capability, a broken chain).
int pcie_acs_control(const std::string& config);

// This rank: {rank, host, local_rank, local_size, cpus, cuda_visible_devices, device (-1: none),
// visible_gpus}, plus with CUDA and a device to pick {device_name, device_bus, device_numa and,
// when the NUMA node is known, cpus_on_device_numa, device_numa_cpus}. `cuda_visible_devices` is
// the environment's value or nullptr when unset.
nlohmann::json describe_rank(int rank, int local_rank, int local_size, const std::filesystem::path& sysfs,
                             const char* cuda_visible_devices);

// Host facts from sysfs: {pci_gpus: [{bus, numa, iommu, acs_redirect: [...]}], numa_nodes (>= 1),
// iommu_groups}.
nlohmann::json describe_pci(const std::filesystem::path& sysfs);
// Host facts from the CUDA runtime: {cuda_driver, cuda_runtime, [cuda_error], cuda_devices, p2p};
// an empty object without CUDA.
nlohmann::json describe_cuda_host();
// Everything about the host: describe_pci + describe_cuda_host + {cpus_online, cpu_model (/proc/cpuinfo's model
// name, "" where it has none)}.
nlohmann::json describe_host(const std::filesystem::path& sysfs);

// "lattice 0.1.0, CUDA backend: built|not built (CPU only), NCCL x.y.z|NCCL: not built".
std::string versions_line();

}  // namespace lattice
