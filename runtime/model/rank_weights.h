// RankWeights: the tensors one rank of a TP x PP layout holds, in load order, and how each is read.
// The single home of how weights are sharded, fused and folded: Model::load hands each tensor to
// the backend, `lattice convert` (runtime/converter/convert.h) quantizes and writes each to the rank's
// file, so a converted checkpoint holds exactly what a load of the original would have made.
//
// Tensors (names are those of a converted checkpoint, runtime/arch/architecture.h PreparedNames;
// which ones a checkpoint holds and how they split: the architecture table; shapes are this rank's):
//   model.embed_tokens.weight            [vocab_rows, hidden]  first stage; also the float LM head of a
//                                                              tied model's last stage
//   lm_head.weight                       [vocab_rows, hidden]  last stage, untied or with an int8 head
//   model.norm.weight                    [hidden] f32          last stage
//   model.layers.L.input_layernorm.weight          [hidden] f32 (1/s of SmoothQuant folded in)
//   model.layers.L.post_attention_layernorm.weight [hidden] f32 (likewise)
//   model.layers.L.self_attn.qkv_proj.weight  [(nq + 2 nkv) * head_dim, hidden]  q | k | v rows (s folded in)
//   model.layers.L.self_attn.qkv_proj.bias    [(nq + 2 nkv) * head_dim] f32   q | k | v bias (qkv_bias families)
//   model.layers.L.self_attn.o_proj.weight    [hidden, nq * head_dim]
//   model.layers.L.mlp.gate_up_proj.weight    [2 * ffn_local, hidden]  gate | up rows (s folded in)
//   model.layers.L.mlp.down_proj.weight       [hidden, ffn_local]
// QK-norm families add model.layers.L.self_attn.{q,k}_norm.weight [head_dim] f32, sandwich-norm families
// model.layers.L.sandwich.post_{attention,feedforward}_norm.weight [hidden] f32 (architecture.h PreparedNames).
// MoE families hold instead of the two mlp tensors (per layer L, expert E):
//   model.layers.L.block_sparse_moe.gate.weight                     [experts, hidden] float (s folded in)
//   model.layers.L.block_sparse_moe.experts.E.gate_up_proj.weight   [2 * ffn_local, hidden] (s folded in)
//   model.layers.L.block_sparse_moe.experts.E.down_proj.weight      [hidden, ffn_local]
// From an original checkpoint (HF, GGUF, random) read() slices, fuses and folds; float tensors keep
// the checkpoint's precision (block-quantized GGUF and SmoothQuant-folded ones become f32), except that a
// 4-bit run (w4a8, w4a16) reads linears stored in 4 bits (GGUF Q4_0 / Q4_1 / Q4_K, AWQ, GPTQ: TensorInfo::int4_group)
// in that form (TensorSource::read_int4; fused parts only when all are alike), which the backend packs
// without rounding anything again; other linears of a 4-bit run are read as float and quantized to 4 bits
// by the backend. The LM head of a
// 4-bit run is 4-bit only when the checkpoint stores it so, else 8-bit (w8a8 / w8a16: the head is a
// fifth of a small model's bytes and the most sensitive matrix). A row-parallel split (o_proj,
// down_proj under tp) must keep whole blocks of a block-quantized tensor and whole groups of one read in
// 4 bits (an act-order one cannot be split along its columns at all); the plan refuses one that cuts a
// group, naming the tensor and the columns. From a
// converted checkpoint (TensorSource::prepared()) read() is a read: a linear stored as int8 comes
// back as int8 [n, k] with its f32 scales [n] ("<name>_scale"), one stored in 4 bits as its 4-bit form
// (every linear of a 4-bit run but an 8-bit head), which the model gives the backend without quantizing again. The constructor checks every tensor's presence and shape (and, for a
// converted checkpoint, that it was made for this rank, layers and quantization) before any read.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/view.h"
#include "parallel/world_config.h"
#include "runtime/backend/backend.h"
#include "runtime/model/model.h"
#include "runtime/model/smoothquant.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

// Linears last (RankTensor::is_linear).
enum class WeightRole : uint8_t {
    kEmbed,
    kLmHead,
    kFinalNorm,
    kAttnNorm,
    kFfnNorm,
    kQNorm,        // QK-norm: [head_dim] f32, replicated
    kKNorm,
    kPostAttnNorm, // sandwich norms: [hidden] f32
    kPostFfnNorm,
    kBqkv,
    kWqkv,
    kWo,
    kWGateUp,
    kWDown,
    kRouter,       // MoE: [experts, hidden], replicated, always float (routing must not move with INT8)
    kExpGateUp,    // MoE: one expert's [2 * ffn_local, hidden]
    kExpDown,      // MoE: one expert's [hidden, ffn_local]
};

struct RankTensor {
    WeightRole role = WeightRole::kEmbed;
    int64_t layer = -1;  // global layer index for per-layer roles, -1 otherwise
    int64_t expert = -1; // per-expert roles: the expert
    std::string name;    // name in a converted checkpoint
    int64_t rows = 1, cols = 0;
    bool vector = false;                // 1-D [cols] (norm weights, biases)
    QuantMode mode = QuantMode::kNone;  // linears: how the layer runs
    DType dtype = DType::kF32;          // what read() returns (i8: a converted int8 linear; u8: 4-bit, int4)
    bool int4 = false;                  // a 4-bit run's linear read in its stored 4-bit form (HostTensor::q4)
    int64_t int4_group = 0;             // int4: its group and kind
    Int4Kind int4_kind = Int4Kind::kAffine;
    bool int4_perm = false;             // int4: its columns carry an act-order permutation
    // int4 from GGUF K-quant parts (Q4_K, Q6_K: read_int4 keeps their super-blocks beside, Int4Weights::kq):
    // each part's type and rows in this rank's slice, in order; empty when any part has none.
    std::vector<std::pair<DType, int64_t>> kq_parts;
    bool table = false;                 // kEmbed: this rank's embedding table
    bool tied_head = false;             // kEmbed: also the float LM head (tied embeddings, last stage)
    bool is_linear() const { return role == WeightRole::kLmHead || role >= WeightRole::kWqkv || tied_head; }
};

// A tensor in host memory: float [rows, cols] of `dtype`, int8 [rows, cols] with scales [rows], or 4-bit
// weights [rows, cols] (q4, kernels/common/int4.h; dtype u8).
struct HostTensor {
    DType dtype = DType::kF32;
    int64_t rows = 0, cols = 0;
    bool vector = false;
    std::vector<uint8_t> data;
    std::vector<float> scales;  // [rows] when dtype == kI8
    Int4Weights q4;             // 4-bit weights (RankTensor::int4)
    bool int4() const { return !q4.qs.empty() || q4.kquant_only(); }
    View view() {
        return vector ? View::contiguous(data.data(), dtype, {cols})
                      : View::contiguous(data.data(), dtype, {rows, cols});
    }
    View scales_view() { return View::contiguous(scales.data(), DType::kF32, {rows}); }
};

class RankWeights {
public:
    // `opt` gives the rank (tp, tp_rank, layer range, stages), quantization and smoothing file.
    RankWeights(const TensorSource& src, const ModelOptions& opt);
    const std::vector<RankTensor>& tensors() const { return tensors_; }
    // `cpu_kquant`: the consumer is a CPU whose W4A8 packs K-quant super-blocks (as for resident_bytes): a linear
    // it will pack so (kquant_packed) is read as its super-blocks alone (TensorSource::read_kquant: a Q6_K part
    // not re-quantized to 4 bits, a Q4_K part not repacked, only for the group form to be dropped).
    HostTensor read(const RankTensor& t, bool cpu_kquant = false);
    // Whether a CPU load packs t in the K-quant layout (what resident_bytes counts for it; `cpu_kquant` as in
    // Holder).
    static bool kquant_packed(const RankTensor& t, bool cpu_kquant);
    // Takes back a tensor that read() returned once its contents are in the backend: the next read reuses its
    // buffer, so a load writes fresh memory (page faults, the kernel zeroing each page) for its largest float
    // tensor only, not for every one (the 1.1B model's W8A8 load faulted 4.4 GB of float reads; now ~0.3).
    void recycle(HostTensor&& h);
    // Bytes of checkpoint tensor data read so far (in the checkpoint's own encoding).
    int64_t bytes_read() const { return bytes_read_; }
    // Who holds the tensors, and how, for the byte counts below: a GPU (`cuda`), or a CPU and the packings it
    // makes. The CPU's own answers come from runtime/backend/cpu/cpu_backend.h (the estimate composes them).
    using Bf16LinearBytes = double (*)(int64_t n, int64_t k);
    struct Holder {
        bool cuda = false;
        // A CPU whose W4A8 keeps K-quant super-blocks (int4_kquant_isa): a W4A8 linear of Q4_K / Q6_K parts takes
        // the K-quant layout's 2304 / 3392 bytes per 16 channels and 256 columns (4.5 / 6.6 bits a weight).
        bool cpu_kquant = true;
        // The CPU under --dtype bf16 (cpu_bf16_linear_bytes): a float linear takes what it says, a float head
        // tied to the embedding a bf16 copy beside the table unless the table is bf16 already (Model::load shares
        // it).
        Bf16LinearBytes cpu_bf16 = nullptr;
        // oneDNN runs the CPU's W8A8 GEMMs at m >= 16 (cpu_w8a8_keeps_onednn_copy): a W8A8 linear takes n x k
        // bytes more, oneDNN's reordered copy of its weights.
        bool cpu_w8a8_copy = false;
    };
    // Bytes these tensors take once loaded: int8 linears one byte per weight plus an f32 scale and
    // column sum per output channel; 4-bit linears 18 (q4_0) or 20 bytes per 32 weights, channels padded to
    // 16 on the CPU (kernels/cpu/int4_gemm.h), unpadded with `cuda` (kernels/cuda/int4_gemm.h), except as
    // Holder says; float tensors in the checkpoint's precision on the CPU, 16-bit matrices with `cuda` (launch's
    // `info` prints it; the planner's estimate is checked against it).
    double resident_bytes(const Holder& h) const;
    static double tensor_bytes(const RankTensor& t, const Holder& h);

private:
    HostTensor read_rows(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType dtype);
    HostTensor read_int4(const RankTensor& t, bool kquant_only);
    // A buffer of `bytes` for a read: the recycled one when there is one (its contents are overwritten).
    std::vector<uint8_t> take_buffer(size_t bytes);
    void plan_original();
    void plan_prepared();
    const std::vector<float>* smooth_of(int64_t layer, int which) const;

    const TensorSource& src_;
    ModelOptions opt_;
    ShardShape shard_;
    SmoothFactors smooth_;
    std::vector<RankTensor> tensors_;
    int64_t bytes_read_ = 0;
    std::vector<uint8_t> spare_;  // recycle()'s buffer (the largest given back)
};

// Symmetric per-output-channel int8 of float host weights, the formula every backend's make_linear
// uses (kernels/common/quantize.h): s = max|w_row| / 127, q = round(w / s). Non-finite weights are
// an Error naming `name`, the row and column.
HostTensor quantize_per_channel(const HostTensor& w, const std::string& name);

// 4-bit of float host weights, what every backend's make_linear does for a 4-bit mode (kernels/common/
// int4_quantize.h: affine groups of 32); a tensor already 4-bit is returned as it is. Errors name `name`.
HostTensor quantize_int4(const HostTensor& w, const std::string& name);

// `base` with the rank fields of world rank `world.rank` filled in: its TP shard (tp, tp_rank) and
// pipeline stage (layer range of parallel/world_config.h's stage_layer_ranges over n_layers, with
// pp_layer_counts when given; first / last stage). The one mapping from a rank to what it holds:
// the builder asks it for its own rank, `lattice convert` for every rank file it writes.
ModelOptions rank_model_options(ModelOptions base, const WorldConfig& world, int64_t n_layers,
                                const std::vector<int64_t>& pp_layer_counts = {});

}  // namespace lattice
