// WorldConfig: pure rank arithmetic for a TP x PP grid (no MPI here; exhaustively unit-tested).
// Rank order puts a tensor-parallel group on consecutive ranks (one node) and pipeline stages
// across groups: rank = pp_rank * tp + tp_rank. Layers are split into pp contiguous stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

struct WorldConfig {
    int world = 1;
    int tp = 1;
    int pp = 1;
    int rank = 0;
    int local_rank = 0;  // rank among the processes of this node
    int local_size = 1;

    // Throws Error (same message on every rank) when world != tp * pp or a value is out of range.
    static WorldConfig make(int world, int tp, int pp, int rank, int local_rank = 0, int local_size = 1);

    int tp_rank() const { return rank % tp; }
    int pp_rank() const { return rank / tp; }
    int rank_of(int tp_rank, int pp_rank) const { return pp_rank * tp + tp_rank; }
    bool is_first_stage() const { return pp_rank() == 0; }
    bool is_last_stage() const { return pp_rank() == pp - 1; }
    // The rank that samples: last stage, TP rank 0.
    int sampler_rank() const { return rank_of(0, pp - 1); }
    // Device for this rank: devices[local_rank] when a list is given, else local_rank.
    int device(const std::vector<int>& devices = {}) const;
    std::string describe() const;  // "rank 3/8 (tp 1/2, pp 1/4)"
};

// Contiguous layer ranges per stage: [begin_s, end_s). Balanced (earlier stages get the extra
// layers) unless `override_counts` is given, which must have pp entries summing to n_layers.
std::vector<std::pair<int64_t, int64_t>> stage_layer_ranges(int64_t n_layers, int pp,
                                                            const std::vector<int64_t>& override_counts = {});

}  // namespace lattice
