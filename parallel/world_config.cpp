// WorldConfig arithmetic and stage layer split (see world_config.h).
#include "parallel/world_config.h"

#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace lattice {

void check_layout_sizes(int tp, int pp) {
    LATTICE_CHECK(tp >= 1 && pp >= 1 && tp <= kMaxTp && pp <= kMaxPp, "tp {} x pp {}: each must be in [1, {}]", tp, pp,
                  std::max(kMaxTp, kMaxPp));
}

int64_t resolve_max_seq(int64_t requested, int64_t max_position) {
    return requested > 0 ? requested : std::min(max_position, kDefaultMaxSeq);
}

int device_of_local_rank(int local_rank, int local_size, const std::vector<int>& devices) {
    if (devices.empty()) return local_rank;
    LATTICE_CHECK(local_rank < int(devices.size()), "--devices lists {} devices but this node runs {} ranks (local rank {})",
                  devices.size(), local_size, local_rank);
    return devices[size_t(local_rank)];
}

WorldConfig WorldConfig::make(int world, int tp, int pp, int rank, int local_rank, int local_size) {
    check_layout_sizes(tp, pp);
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
    return device_of_local_rank(local_rank, local_size, devices);
}

std::string WorldConfig::describe() const {
    return fmt::format("rank {}/{} (tp {}/{}, pp {}/{})", rank, world, tp_rank(), tp, pp_rank(), pp);
}

std::vector<LayerRange> stage_layer_ranges(int64_t n_layers, int pp, const std::vector<int64_t>& override_counts) {
    check_layout_sizes(1, pp);
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
    std::vector<LayerRange> r;
    int64_t b = 0;
    for (int64_t c : counts) {
        r.emplace_back(b, b + c);
        b += c;
    }
    return r;
}

LayerRange stage_layer_range(int64_t n_layers, int pp, int pp_rank, const std::vector<int64_t>& override_counts) {
    LATTICE_CHECK(pp_rank >= 0 && pp_rank < pp, "invalid pipeline stage {} of {}", pp_rank, pp);
    return stage_layer_ranges(n_layers, pp, override_counts)[size_t(pp_rank)];
}

ShardShape shard_shape(const ModelDims& c, int tp, int r) {
    LATTICE_CHECK(tp >= 1 && r >= 0 && r < tp, "invalid tp rank {} of {}", r, tp);
    LATTICE_CHECK(c.n_heads % tp == 0, "tp {} does not divide num_attention_heads {} ({})", tp, c.n_heads, c.name);
    LATTICE_CHECK(c.intermediate % tp == 0, "tp {} does not divide intermediate_size {} ({})", tp, c.intermediate,
                  c.name);
    ShardShape s;
    s.n_heads = c.n_heads / tp;
    s.head0 = r * s.n_heads;
    if (tp <= c.n_kv_heads) {
        LATTICE_CHECK(c.n_kv_heads % tp == 0, "tp {} does not divide num_key_value_heads {} ({})", tp, c.n_kv_heads,
                      c.name);
        s.n_kv = c.n_kv_heads / tp;
        s.kv_head0 = r * s.n_kv;
    } else {
        LATTICE_CHECK(tp % c.n_kv_heads == 0,
                      "tp {} exceeds num_key_value_heads {} but is not a multiple of it, so kv heads cannot be "
                      "replicated evenly ({})",
                      tp, c.n_kv_heads, c.name);
        s.n_kv = 1;
        s.kv_head0 = s.head0 / (c.n_heads / c.n_kv_heads);
    }
    s.ffn = c.intermediate / tp;
    s.ffn0 = r * s.ffn;
    s.vocab_per_rank = (c.vocab + tp - 1) / tp;
    s.vocab0 = r * s.vocab_per_rank;
    s.vocab_rows = std::clamp<int64_t>(c.vocab - s.vocab0, 0, s.vocab_per_rank);
    LATTICE_CHECK(s.vocab_rows > 0, "vocab {} too small for tp {}: rank {} would hold no rows", c.vocab, tp, r);
    return s;
}

void check_model_layout(const ModelDims& m, int tp, int pp) {
    check_layout_sizes(tp, pp);
    for (int r = 0; r < tp; ++r) shard_shape(m, tp, r);
    stage_layer_ranges(m.n_layers, pp);
}

int ranks_per_node(int world, int nodes) {
    LATTICE_CHECK(nodes >= 1, "invalid node count {}", nodes);
    LATTICE_CHECK(nodes <= world, "{} nodes but only tp*pp = {} ranks: every node needs at least one rank", nodes,
                  world);
    LATTICE_CHECK(world % nodes == 0, "tp*pp = {} ranks cannot be spread evenly over {} nodes", world, nodes);
    return world / nodes;
}

bool node_holds_whole_tp_groups(int ranks_on_node, int tp) { return tp >= 1 && ranks_on_node % tp == 0; }

int check_placement(int tp, int pp, const Placement& p) {
    check_layout_sizes(tp, pp);
    const int np = tp * pp;
    const int k = ranks_per_node(np, p.nodes);
    LATTICE_CHECK(p.nodes == 1 || node_holds_whole_tp_groups(k, tp),
                  "{} ranks per node do not hold whole TP groups of {} (TP runs inside a node, PP across nodes): use "
                  "a tp that divides {}, or fewer nodes",
                  k, tp, k);
    if (p.slots_per_node > 0)
        LATTICE_CHECK(p.slots_per_node >= k || (p.cpu && p.oversubscribe),
                      "{} has {} slots but the layout needs {} ranks per node",
                      p.slots_host.empty() ? std::string("a host") : "host '" + p.slots_host + "'", p.slots_per_node,
                      k);
    if (p.cpu) {
        LATTICE_CHECK(p.gpus_per_node == 0, "CPU ranks and --gpus-per-node contradict each other");
        LATTICE_CHECK(p.cores_per_node >= k || p.oversubscribe,
                      "{} CPU ranks per node but only {} cores: add --oversubscribe to let ranks share cores (slow), "
                      "or use fewer ranks",
                      k, p.cores_per_node);
        return k;
    }
    LATTICE_CHECK(!p.oversubscribe, "--oversubscribe is for CPU ranks (--cpu): two ranks must never share a GPU");
    LATTICE_CHECK((tp & (tp - 1)) == 0, "tp {} is not a power of two (1, 2, 4, 8)", tp);
    const int g = p.gpus_per_node;
    LATTICE_CHECK(g > 0, "no GPUs found (nvidia-smi lists none); use --cpu for CPU ranks, or --gpus-per-node N when "
                         "launching from a node without GPUs");
    LATTICE_CHECK(g % tp == 0, "tp {} does not divide the {} GPUs per node: a TP group must sit inside one node", tp,
                  g);
    LATTICE_CHECK(k <= g,
                  "tp*pp = {} ranks on {} node(s) need {} GPUs per node but there are {}: use more nodes (--hosts), "
                  "or a smaller tp*pp",
                  np, p.nodes, k, g);
    return k;
}

}  // namespace lattice
