// The only home of layout rules: pure arithmetic, no MPI (exhaustively unit-tested).
// - WorldConfig: rank arithmetic for a TP x PP grid. Rank order puts a tensor-parallel group on
//   consecutive ranks (one node) and pipeline stages across groups: rank = pp_rank * tp + tp_rank.
// - stage_layer_ranges: layers split into pp contiguous stages.
// - shard_shape: which heads, FFN columns and vocab rows a TP rank holds (Megatron sharding, see
//   runtime/model/model.h), and the model's constraints on tp.
// - check_placement: whether tp x pp ranks fit the nodes they are launched on (launch/lattice-mpirun
//   asks `lattice layout`, which calls this, instead of keeping its own copy of the rules), with
//   ranks_per_node and node_holds_whole_tp_groups, which `lattice doctor` asks too.
// - The named limits (kMaxTp, kMaxPp, kDefaultMaxSeq) and the one check of tp and pp
//   (check_layout_sizes): every flag, manifest and builder bound comes from here.
// - Device per rank: local rank i uses device i (or the i-th of a --devices list).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

// Largest --tp and --pp (and a converted checkpoint's layout): far above any real job, small enough
// that tp * pp and per-rank arrays cannot overflow.
inline constexpr int kMaxTp = 4096;
inline constexpr int kMaxPp = 4096;
// KV cache positions per sequence when none is asked for: min(max_position_embeddings, this).
inline constexpr int64_t kDefaultMaxSeq = 4096;

// The one check of layout sizes: throws Error "tp T x pp P: each must be in [1, 4096]" otherwise.
void check_layout_sizes(int tp, int pp);
// KV cache positions per sequence: `requested` when > 0, else min(max_position, kDefaultMaxSeq).
int64_t resolve_max_seq(int64_t requested, int64_t max_position);
// Device of the rank with `local_rank` among `local_size` on its node: devices[local_rank] when a
// list is given, else local_rank. Throws Error when the list is too short for the node's ranks.
int device_of_local_rank(int local_rank, int local_size, const std::vector<int>& devices = {});

struct WorldConfig {
    int world = 1;
    int tp = 1;
    int pp = 1;
    int rank = 0;
    int local_rank = 0;  // rank among the processes of this node
    int local_size = 1;

    // Throws Error (same message on every rank) when world != tp * pp or a value is out of range
    // (tp and pp: check_layout_sizes).
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

// The model dimensions the layout rules depend on (from ModelConfig; `name` labels errors).
struct ModelDims {
    int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, intermediate = 0, vocab = 0;
    std::string name;
    // What the planner (plan_model.h) needs besides; the layout rules ignore them.
    int64_t hidden = 0, head_dim = 0;
    bool tie_embeddings = false;
    // Mixture of experts: experts per layer and per token (0: dense); each expert's FFN of
    // `intermediate` channels splits over TP like a dense FFN.
    int64_t n_experts = 0, n_experts_used = 0;
};

// The tensor-parallel shard of one rank.
struct ShardShape {
    int64_t n_heads = 0;         // local query heads
    int64_t n_kv = 0;            // local kv heads
    int64_t head0 = 0;           // first global query head
    int64_t kv_head0 = 0;        // first global kv head
    int64_t ffn = 0;             // local intermediate size
    int64_t ffn0 = 0;
    int64_t vocab_rows = 0;      // rows of the embedding / head on this rank (<= vocab_per_rank)
    int64_t vocab0 = 0;
    int64_t vocab_per_rank = 0;  // ceil(vocab / tp): the padded stride of gathered logits
};
// Heads and FFN columns split evenly; kv heads split when tp <= n_kv_heads, replicated (one per
// rank) when tp is a multiple of n_kv_heads; vocab split in ceil(vocab / tp) rows. Throws Error
// naming the dimension when the model does not allow this tp.
ShardShape shard_shape(const ModelDims& m, int tp, int tp_rank);
// Throws Error when the model cannot run on tp x pp (every TP rank's shard and the stage split).
void check_model_layout(const ModelDims& m, int tp, int pp);

// Where the ranks of a job go: what a launcher knows about its nodes.
struct Placement {
    int nodes = 1;
    bool cpu = false;             // CPU ranks; otherwise one GPU per rank
    int gpus_per_node = 0;        // GPU mode
    int cores_per_node = 0;       // CPU mode (physical cores)
    int slots_per_node = 0;       // fewest slots any host offers (hostfile); 0: not limited
    std::string slots_host;       // the host offering them (for the message)
    bool oversubscribe = false;   // CPU mode: more ranks than cores (or slots) allowed
};
// Ranks per node when tp x pp fits `p`; throws Error saying why not (and what to change) otherwise.
// A TP group never spans nodes; GPU ranks never share a GPU.
int check_placement(int tp, int pp, const Placement& p);
// Ranks on each of `nodes` nodes when `world` ranks spread evenly; throws Error saying why not.
int ranks_per_node(int world, int nodes);
// Whether the ranks of one node form whole TP groups (a TP group never spans nodes).
bool node_holds_whole_tp_groups(int ranks_on_node, int tp);

// Contiguous layer ranges per stage: [begin_s, end_s). Balanced (earlier stages get the extra
// layers) unless `override_counts` is given (--pp-layers, a converted checkpoint's stages), which
// must have pp entries, each >= 1, summing to n_layers.
using LayerRange = std::pair<int64_t, int64_t>;
std::vector<LayerRange> stage_layer_ranges(int64_t n_layers, int pp, const std::vector<int64_t>& override_counts = {});
// The layers of stage `pp_rank` (same rules).
LayerRange stage_layer_range(int64_t n_layers, int pp, int pp_rank, const std::vector<int64_t>& override_counts = {});

}  // namespace lattice
