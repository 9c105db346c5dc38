// The layout planner's model (what `lattice plan` prints): for a model shape, a device, a link and
// a tp x pp layout, the memory one rank needs and the prefill/decode speed a roofline predicts.
// Pure arithmetic on ModelDims, no MPI, no files: unit-tested in tests/parallel/test_plan_model.cpp
// and validated against measured runs on CPU ranks (benchmarks/validate_plan.py, checked by
// tests/launch/test_plan.py).
//
// The model, per rank (the largest: TP rank 0 of the heaviest stage):
// - weights: per-layer q/k/v/o and gate/up/down shards (world_config's shard_shape) at the quant's
//   bytes per weight (+ 8 B of scale and column sum per int8 output channel), norms, the embedding
//   rows on the first stage and the head on the last (tied: the same rows, stored once per stage);
//   a MoE layer holds every expert's gate/up/down shard and a float router [experts, hidden];
// - KV cache: batch x context positions x local kv heads x head_dim x 2 (k, v) per layer;
// - activations: one forward of max_batch_tokens (launch's `info` uses the same estimate);
// - reserved: the device's fixed overhead (CUDA context, cuBLASLt workspace, NCCL buffers).
// Step time of a stage = the linear layers' roofline max(weight bytes / achievable bandwidth, ops /
// achievable peak) (MoE: the bytes of the experts the step's tokens touch, experts_touched, and the
// ops of the k experts each token runs; experts split over TP like a dense FFN, no expert
// parallelism) (plus (1 - overlap) x the smaller of the two where the device does not overlap
// them) + attention's, max(KV bytes / bandwidth, attention FLOPs / attention's achieved rate) + 2
// all-reduces per layer (ring alpha-beta: 2(n-1) alpha + 2(n-1)/n bytes / bw; over the inter-node link
// when the TP group spans nodes) + a fixed per-layer overhead; stages hand off one activation per
// micro-batch (alpha + bytes / bw); a hop that crosses nodes carries tp copies (each rank sends its rows
// to its peer of the next stage) over the inter-node link and counts in the sending stage's step (a
// blocking send), one inside a node overlaps the next step.
// With pp > 1 the engine keeps min(batch, pp) micro-batches in flight: a decode round takes
// max(m x slowest stage, sum of stages + hand-offs), and yields one token per sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/world_config.h"

namespace lattice {

// A device class. GPUs: datasheet memory, bandwidth and dense peaks (no sparsity); the achievable
// fractions are what a device-to-device copy and a large IMMA GEMM reach (sources in plan_model.cpp).
// CPU ("cpu"): one rank per core, figures per core; node_bw_gbs caps what the ranks of one node
// read together (they share the memory controllers).
struct DeviceSpec {
    std::string name;        // "a100-pcie-40gb"
    std::string label;       // "NVIDIA A100 PCIe 40GB"
    double mem_gib = 0;      // memory per device
    double bw_gbs = 0;       // memory bandwidth per device (datasheet; CPU: one core, measured)
    double int8_tops = 0;    // dense INT8 peak (TOPS)
    double fp16_tflops = 0;  // dense FP16/BF16 peak (TFLOPS); CPU: f32
    // What the attention kernels achieve (TFLOPS of QK and PV); 0: fp16_tflops x compute_eff (GPUs,
    // an assumption). CPU: measured (bench_attention --queries 64), far below the f32 peak.
    double attn_tflops = 0;
    double bw_eff = 1.0;     // achievable fraction of bw_gbs
    double compute_eff = 1.0;  // achievable fraction of the peaks for the GEMMs of a forward
    double reserved_gib = 0;   // fixed per-device overhead (context, workspaces, communicator buffers)
    double layer_overhead_us = 0;  // per layer per step: launches / kernel gaps / thread-pool fork-join
    double node_bw_gbs = 0;        // CPU: bandwidth all ranks of a node share (0: not shared)
    double node_int8_tops = 0;     // CPU: int8 rate all ranks of a node reach together (0: not shared;
                                   // vCPUs may be hyperthreads of fewer cores)
    // How far streaming weights and computing on them overlap within a step: 1 = fully (the
    // roofline's max), 0 = not at all (their sum; what the CPU kernels measure).
    double overlap = 1.0;
    std::string link;              // default link between the devices of a node
    int per_node = 8;              // devices in a node (default)
    double price_per_hour = 0;     // USD per device-hour (0: unknown)
    bool cpu = false;
    std::string source;
};

// A link: all-reduce and send cost = alpha per hop + bytes / bw.
struct LinkSpec {
    std::string name;
    double alpha_us = 0;  // latency per ring hop / per send
    double bw_gbs = 0;    // achievable bus bandwidth per direction
    std::string source;
};

const std::vector<DeviceSpec>& device_table();
const std::vector<LinkSpec>& link_table();
// Throws Error listing the known names.
const DeviceSpec& find_device(const std::string& name);
const LinkSpec& find_link(const std::string& name);
// A table name, or "GB/s,latency-us" (e.g. "12.5,5": 12.5 GB/s, 5 us a hop). Error naming the forms.
LinkSpec parse_link(const std::string& spec);

// kW4A8 / kW4A16: 4-bit weights, counted as lattice's affine groups of 32 (5 bits a weight: nibbles, an f16 scale
// and minimum per 32; AWQ / GPTQ's groups of 128 are a little smaller) unless PlanRequest::int4_bytes says
// otherwise (a K-quant file on the CPU: 4.5 / 6.6 bits), with an 8-bit LM head, on CPUs and GPUs alike
// (a GPU runs W4A16 at its fp rate; device_plan_quant plans W4A8 on a GPU as W4A16, which is what CUDA runs).
enum class PlanQuant { kW8A8, kW8A16, kFp16, kF32, kW4A8, kW4A16 };
PlanQuant parse_plan_quant(const std::string& s);  // w8a8 | w8a16 | w4a8 | w4a16 | fp16 | bf16 | f32
const char* plan_quant_name(PlanQuant q);
// What a device runs for a --quant name: parse_plan_quant, "none" as the device's floats (f32 on a
// CPU, fp16 on a GPU), and W4A8 on a GPU as W4A16 (CUDA's 4-bit kernels take 16-bit activations).
PlanQuant device_plan_quant(const std::string& s, bool cpu);

// Parameters of a model's shape (attention, every expert's FFN and the router, norms, embedding and
// an untied head), and those one token runs (a MoE model: its n_experts_used FFNs). Doubles: the
// planner's shapes may be of any size.
double model_parameters(const ModelDims& d);
double active_parameters(const ModelDims& d);

struct PlanRequest {
    ModelDims model;              // hidden and head_dim must be set
    DeviceSpec device;            // a table entry, possibly calibrated
    LinkSpec link;                // between the devices of a node
    LinkSpec inter_node;          // between nodes (pipeline hand-offs that cross them, a TP group spanning them)
    int devices = 1;              // ranks in all
    int nodes = 1;
    PlanQuant quant = PlanQuant::kW8A8;
    bool quant_head = false;      // the LM head in int8 too (also with 4-bit weights)
    int64_t batch = 1;                 // concurrent sequences
    int64_t context = kDefaultMaxSeq;  // positions per sequence the KV cache holds
    int64_t prompt = 512;              // prompt tokens (prefill / time to first token)
    int64_t max_batch_tokens = 256;    // tokens per forward (prefill chunks)
    double kv_bytes = 0;               // per cached K/V element (kv_element_bytes); 0: the activations'
    // Bytes per weight of the 4-bit linears; 0: the group form's kInt4GroupBytesPerWeight. A GGUF K-quant file
    // on the CPU's W4A8 keeps its super-blocks (kQ4KBytesPerWeight, kQ6KBytesPerWeight; runtime/builder/estimate.h
    // int4_bytes_per_weight averages a file's mix).
    double int4_bytes = 0;
};

// 4-bit bytes per weight: lattice's group form (16 bytes of nibbles, an f16 scale and an f16 minimum per 32,
// kernels/cpu/int4_gemm.h) and the CPU's K-quant layout (Q4_K: 2304 bytes per 16 channels x 256 columns, the
// file's 144 per channel; Q6_K: 3392, the file's 210 + 2 of alignment).
inline constexpr double kInt4GroupBytesPerWeight = 20.0 / 32.0;
inline constexpr double kQ4KBytesPerWeight = 144.0 / 256.0, kQ6KBytesPerWeight = 212.0 / 256.0;

// Bytes per cached K/V element for a --kv-cache-dtype (auto: the activations', f32 on CPUs, 16-bit on
// GPUs; int8: one byte plus the row's f32 scale shared by head_dim elements). Error naming a bad name.
double kv_element_bytes(const std::string& kv_dtype, int64_t head_dim, bool cpu);

struct MemoryEstimate {
    double weights = 0, kv = 0, activations = 0, reserved = 0;  // bytes
    int heaviest_stage = 0;
    double total() const { return weights + kv + activations + reserved; }
};

struct LayoutPrediction {
    int tp = 1, pp = 1;
    bool feasible = true;  // the model allows this tp x pp on these nodes
    bool tp_crosses_nodes = false;  // feasible only by a TP group spanning nodes (lattice-mpirun refuses it)
    std::string why_not;   // when not
    MemoryEstimate memory;
    bool fits = false;
    double decode_tokens_per_s = 0;  // all sequences together
    double decode_token_latency_ms = 0;  // per sequence, between its tokens
    double prefill_tokens_per_s = 0;
    double ttft_ms = 0;              // one prompt of `prompt` tokens, alone
    double comm_share = 0;           // of a decode round: all-reduces and hand-offs
    std::string bound;               // "memory" | "compute" (decode, heaviest stage)
};

// Bytes of the KV cache of one rank's layers for `positions` cached positions (k and v).
double kv_cache_bytes(const ModelDims& m, int tp, int64_t layers, int64_t positions, double bytes_per_elem);
// One forward of `tokens` tokens on one rank: hidden states and norms, q/k/v, attention output,
// gate/up, a MoE layer's router logits and gathered rows, and (last stage) the gathered f32 logits.
double activation_bytes(const ModelDims& m, int tp, int64_t tokens, double bytes_per_elem, bool last_stage);
// MoE: the experts of a layer that a forward of `tokens` tokens runs, expected under uniform,
// independent routing (each token picks n_experts_used of n_experts): E (1 - (1 - k/E)^tokens); k for
// one token, E for many. Dense models: 1.
double experts_touched(const ModelDims& m, double tokens);

MemoryEstimate estimate_memory(const PlanRequest& r, int tp, int pp);
// Seconds one forward of `tokens` tokens, each attending to `positions` cached positions, takes on
// pipeline stage `stage` of a tp x pp layout, its TP all-reduces included, `sampled` rows through the
// head on the last stage (the simulated device's step: runtime/backend/sim/sim_device.h).
double predict_stage_seconds(const PlanRequest& r, int tp, int pp, int stage, double tokens, double positions,
                             double sampled);
LayoutPrediction predict_layout(const PlanRequest& r, int tp, int pp);
// Whether a TP group of tp ranks spans nodes (r.devices ranks evenly on r.nodes nodes).
bool tp_crosses_nodes(const PlanRequest& r, int tp);
// Every (tp, pp) with tp * pp == devices, feasible or not (why_not says), best first: fitting
// layouts by decode tokens/s (ties: fewer pipeline stages), those with TP across nodes after them,
// then the rest.
std::vector<LayoutPrediction> plan_layouts(const PlanRequest& r);

}  // namespace lattice
