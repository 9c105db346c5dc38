// WorldConfig arithmetic and stage layer split (see world_config.h).
#include "parallel/world_config.h"

#include "runtime/base/error.h"

#include <fmt/format.h>

namespace lattice {

WorldConfig WorldConfig::make(int world, int tp, int pp, int rank, int local_rank, int local_size) {
    LATTICE_CHECK(tp >= 1 && pp >= 1, "invalid layout: tp={} pp={} (both must be >= 1)", tp, pp);
    LATTICE_CHECK(world == tp * pp, "invalid layout: world size {} != tp {} x pp {} (start {} ranks, or change --tp/--pp)",
                  world, tp, pp, tp * pp);
    LATTICE_CHECK(rank >= 0 && rank < world, "invalid rank {} for world size {}", rank, world);
    LATTICE_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "invalid local rank {} of {}",
                  local_rank, local_size);
    WorldConfig w;
    w.world = world;
    w.tp = tp;
    w.pp = pp;
    w.rank = rank;
    w.local_rank = local_rank;
    w.local_size = local_size;
    return w;
}

int WorldConfig::device(const std::vector<int>& devices) const {
    if (devices.empty()) return local_rank;
    LATTICE_CHECK(local_rank < int(devices.size()), "--devices lists {} devices but this node runs {} ranks (local rank {})",
                  devices.size(), local_size, local_rank);
    return devices[size_t(local_rank)];
}

std::string WorldConfig::describe() const {
    return fmt::format("rank {}/{} (tp {}/{}, pp {}/{})", rank, world, tp_rank(), tp, pp_rank(), pp);
}

std::vector<std::pair<int64_t, int64_t>> stage_layer_ranges(int64_t n_layers, int pp,
                                                            const std::vector<int64_t>& override_counts) {
    LATTICE_CHECK(pp >= 1, "pp must be >= 1, got {}", pp);
    std::vector<int64_t> counts;
    if (!override_counts.empty()) {
        LATTICE_CHECK(int(override_counts.size()) == pp, "--pp-layers has {} entries for {} pipeline stages",
                      override_counts.size(), pp);
        int64_t sum = 0;
        for (int64_t c : override_counts) {
            LATTICE_CHECK(c >= 1, "--pp-layers: every stage needs at least one layer (got {})", c);
            sum += c;
        }
        LATTICE_CHECK(sum == n_layers, "--pp-layers sums to {} but the model has {} layers", sum, n_layers);
        counts = override_counts;
    } else {
        LATTICE_CHECK(n_layers >= pp, "pp {} exceeds the model's {} layers", pp, n_layers);
        for (int s = 0; s < pp; ++s) counts.push_back(n_layers / pp + (s < n_layers % pp ? 1 : 0));
    }
    std::vector<std::pair<int64_t, int64_t>> r;
    int64_t b = 0;
    for (int64_t c : counts) {
        r.emplace_back(b, b + c);
        b += c;
    }
    return r;
}

}  // namespace lattice
