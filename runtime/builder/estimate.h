// What a checkpoint holds and what one rank needs to run it, from the loader's own rules, without
// loading (`lattice info` asks here): the parameter count once the tensors were checked against
// the config, and the memory of the largest rank of a tp x pp layout.
// The weight plan is the loader's (RankWeights over rank_model_options: which tensors a rank
// holds, their shapes, the quantization each gets; --quant auto is auto_quant with the device's
// 4-bit mode), so the estimate follows the code that loads. Bytes per element follow the backend:
// on the CPU float weights keep the checkpoint's precision and int8 linears hold one byte per
// weight plus f32 scales and column sums, f32 activations; on CUDA 16-bit floats. The KV cache and
// the activations of one forward: parallel/plan_model.h.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/backend/make_backend.h"
#include "runtime/model/model.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

// The config's parameter count, after checking that the checkpoint holds it: every tensor present
// with its shape and nothing unexplained (check_tensor_set; a converted folder is checked when a
// rank loads its file), and a source that lists its tensors holds at least as many elements as
// the config describes. Error naming the checkpoint.
int64_t checked_parameter_count(const TensorSource& src);

struct MemoryQuery {
    bool quant_auto = true;              // --quant auto (auto_quant); else quant / quant_head as given
    QuantMode quant = QuantMode::kNone;
    bool quant_head = false;
    int tp = 1, pp = 1;
    int64_t max_seq = 0;                 // positions per sequence; 0: resolve_max_seq's default
    int64_t max_batch_tokens = 256;      // tokens of the forward whose activations are counted
    BackendKind device = BackendKind::kCpu;  // kCpu or kCuda
    std::string kv_cache_dtype = "auto";
    bool cpu_bf16 = false;  // --dtype bf16 on the CPU: float linears in bf16 (cpu_bf16_linear_bytes), KV auto bf16
};

// The largest rank of the layout (TP rank 0 of its stage: the TP ranks of a stage differ by at most
// a vocabulary row). Bytes.
struct RankMemory {
    QuantMode quant = QuantMode::kNone;       // the linears' mode
    QuantMode head = QuantMode::kNone;        // the LM head's, when quantized (4-bit runs keep an 8-bit one)
    int64_t max_seq = 0;                      // the context resolved
    int stage = 0;                            // the pipeline stage of that rank
    std::string kv_dtype;                     // the KV cache's elements, "auto" resolved as the backend does
    double weights = 0, kv = 0, activations = 0;
    double total() const { return weights + kv + activations; }
};

// Errors: the layout the model cannot take (check_model_layout), a context beyond the model's
// max_position_embeddings.
RankMemory largest_rank_memory(const TensorSource& src, const MemoryQuery& q);

// Bytes per weight of the layers' linears in a 4-bit run of one rank (the planner's PlanRequest::int4_bytes):
// the loader's bytes over their weights, the K-quant layout where `cpu_kquant` (cpu_keeps_kquant, W4A8 on the
// CPU) and the file has it, else the group form. 0 when no layer has a linear.
double int4_bytes_per_weight(const TensorSource& src, bool cpu_kquant);

}  // namespace lattice
