// CudaBackend: the Backend ops on one CUDA device and one stream, forwarding to kernels/cuda.
// Activations are fp16 or bf16 (constructor), with fp32 accumulation, softmax and norms.
//
// Memory: every Buffer is device memory (cudaMalloc, zero-filled). Linear weights by mode:
//   kNone   weight [n, k] in the activation dtype (f32/f16/bf16 host weights converted once);
//           y = x . W^T through cuBLASLt (TN, fp32 accumulate).
//   kW8A16  weight [n_pad, k_pad] int8 (zero padded to multiples of 16), scales [n_pad] f32;
//           m <= 16: GEMV; m > 16: cuda::gemm_w8a16 (tensor cores, the int8 tile converted in shared
//           memory: no dequantized copy of the weight is ever written).
//   kW4A16  4-bit weights as the checkpoint holds them (kernels/cuda/int4_gemm.h: nibbles, f16 scales and zero
//           points / minimums, the act-order permutation): m <= 8: cuda::gemv_w4a16; m > 8: cuda::gemm_w4a16
//           (tensor cores, the nibble tile dequantized in shared memory). kW4A8 is made as kW4A16 here (no
//           int8-activation 4-bit kernel; the activations stay f16/bf16): cuda_backend_int4.cpp.
//   kW8A8   same storage; x is quantized per token into int8 [m, k_pad] (+ scales [m]);
//           m <= 16: dp4a GEMV; m > 16: cuBLASLt IMMA (int32 out), then one fused dequant epilogue;
//           a shape cuBLASLt has no algorithm for runs the GEMV in 16-row chunks (a warning once per
//           shape, never an error).
//           With fuses_quant() the quantization is fused into the norm / SwiGLU kernel before it
//           (add_rmsnorm_quant, silu_mul_quant) and linear_quant starts from the int8 rows.
// Token metadata (ids, positions, sequences, block tables) is staged in pinned host memory and copied with one
// cudaMemcpyAsync per new batch (skipped when the batch did not change; within begin_step ..
// end_step not even compared again), so a captured graph
// re-reads it from the same pinned addresses at replay: see CudaGraph below.
//
// Scratch (int32 accumulators, quantized activations, attention workspace, metadata) grows on
// demand and never shrinks. Growth is refused during graph capture: run one eager step of a
// batch size before capturing it. Once a graph exists, outgrown buffers are retired (kept until
// the backend dies) instead of freed, because captured graphs still point at them; each graph
// replays with the staging area it was captured with.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "runtime/backend/backend.h"

namespace lattice {

namespace cuda {
class LtGemm;
struct LtOptions;
}  // namespace cuda

class CudaBackend final : public Backend {
public:
    // device: CUDA ordinal (the launch binds local rank -> device); act: kF16 or kBF16.
    CudaBackend(int device, DType act);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string name() const override;
    Device device() const override { return Device::kCuda; }
    DType activation_dtype() const override { return act_; }
    bool supports(Op op, DType dtype) const override;
    // NCCL over the host group's ranks, on this backend's stream (null for one rank); the group
    // named "tp" is deferred (no host wait per call: its user calls wait_idle once per step).
    std::unique_ptr<Communicator> make_group_comm(Communicator& host, const std::string& name,
                                                  double timeout_s) override;
    int64_t memory_available() const override;

    Buffer alloc(DType dtype, std::initializer_list<int64_t> shape) override;
    void free_memory(void* p) override;
    void upload(const View& dst, const void* host_src) override;
    void download(void* host_dst, const View& src) override;
    void sync() override;
    void copy(const View& dst, const View& src) override;
    void copy_columns(const View& dst, int64_t col0, const View& src) override;
    void begin_step(const TokenBatch& batch) override;
    void end_step() override { step_ = {}; }
    bool selects_tokens() const override { return true; }
    // On the device: bans and selection params uploaded in one copy, one kernel, ids and logprobs
    // downloaded in one copy (the only synchronization of the step).
    void select_tokens(const View& logits, std::span<const TokenSelect> rows, int32_t* ids, float* logprobs) override;
    // CudaGraph (below) per captured shape.
    bool captures_steps() const override { return true; }
    std::unique_ptr<StepGraph> capture_step(const TokenBatch& batch, const std::function<void()>& body) override;
    void replay_step(StepGraph& graph, const TokenBatch& batch) override;

    Linear make_linear(const View& host_w, QuantMode mode) override;
    Linear make_linear_int8(const View& host_q, const View& host_scales, QuantMode mode) override;
    // 4-bit linears (cuda_backend_int4.cpp): uploaded packed; kW4A8 is made as kW4A16 (said once in the log).
    Linear make_linear_int4(const Int4Matrix& w, QuantMode mode) override;
    Buffer make_f32(const View& host) override;
    Buffer make_table(const View& host) override;

    void embed(const View& out, const View& table, const TokenBatch& batch, int64_t row_offset) override;
    void rmsnorm(const View& out, const View& x, const View& w, float eps) override;
    void add_rmsnorm(const View& residual, const View& x, const View& out, const View& w, float eps) override;
    void rope(const View& qkv, const TokenBatch& batch, const AttentionShape& s, const View& inv_freq) override;
    void attention(const View& out, const View& qkv, const View& k_cache, const View& v_cache, const TokenBatch& batch,
                   const AttentionShape& s) override;
    void silu_mul(const View& out, const View& gate_up) override;
    void add(const View& out, const View& a, const View& b) override;
    // The families' ops (cuda_backend_families.cpp): q/k/v biases, MoE row moves.
    void add_bias(const View& x, const View& bias) override;
    void gated_act(const View& out, const View& gate_up, Activation act) override;
    void head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps) override;
    void scale(const View& x, float s) override;
    void softcap(const View& x, float cap) override;
    void gather_rows(const View& dst, const View& src, const View& rows) override;
    void scatter_add_rows(const View& dst, const View& src, const View& rows, const View& weights) override;
    void fill_zero(const View& x) override;
    void linear(const View& out, const View& x, const Linear& w) override;
    // Fused W8A8 quantization: the norm and SiLU kernels quantize their output in the same pass
    // (cuda::add_rmsnorm_quant, cuda::silu_mul_quant); linear_quant skips linear's quantize launch.
    bool fuses_quant() const override { return true; }
    QuantActs alloc_quant_acts(int64_t rows, int64_t k) override;
    void add_rmsnorm_quant(const View& residual, const View& x, const View& out, QuantActs& qa, const View& w,
                           float eps) override;
    void silu_mul_quant(const View& out, QuantActs& qa, const View& gate_up) override;
    void linear_quant(const View& out, const QuantActs& qa, const Linear& w) override;

    // ---- CUDA-only extras (not in Backend yet) ----
    // A linear layer of random weights fabricated on the device from `seed` (for --random-weights
    // and benchmarks): values uniform in +-1/sqrt(k); int8 modes get matching per-channel scales.
    Linear make_random_linear(int64_t n, int64_t k, QuantMode mode, uint64_t seed);
    int device_index() const { return device_; }
    cudaStream_t stream() const { return stream_; }
    // Greedy ids of logits [m, vocab] (f32/f16/bf16 device view) into host_ids[m]; synchronizes.
    void argmax(const View& logits, int32_t* host_ids);
    // Top-k/top-p/temperature sampling, one SampleParams per row (host array); synchronizes.
    void sample(const View& logits, const cuda::SampleParams* host_params, int32_t* host_ids);

    // Replaces the cuBLASLt options (tests: LtOptions::int8_unavailable forces the W8A8 fallback).
    // Before any graph capture (graphs keep the plans they were captured with).
    void set_lt_options(const cuda::LtOptions& options);

    // Per-op timing of eager steps (benchmarks: the per-kernel breakdown of a decode step). While on,
    // every op records a CUDA event pair around its launches on the stream (about a microsecond of
    // gap per op, so the breakdown's sum exceeds a graph replay's time); op_times() waits for the
    // stream and returns (op name, microseconds) in issue order, clearing the record. Linear layers
    // are named by mode and shape ("linear w8a8 2560x2048 m=1"). Refused while capturing.
    void set_op_timing(bool on);
    std::vector<std::pair<std::string, double>> op_times();

    // Graph capture hooks used by CudaGraph.
    void begin_capture();
    void end_capture();
    void graph_captured() { ++graphs_; }
    int64_t staged_tiles() const { return meta_tiles_; }
    bool capturing() const { return capturing_; }
    // Pinned host / device staging pair that a graph captured (its memcpy node reads `host`).
    struct MetaArea {
        int32_t* host = nullptr;
        int32_t* dev = nullptr;
        int64_t cap = 0;    // tokens
        int64_t width = 0;  // block-table entries per sequence
    };
    MetaArea meta_area() const { return {meta_host_, meta_dev_, meta_cap_, meta_width_}; }
    // Writes batch metadata into `area` without enqueueing a copy (the replayed graph copies it).
    // Returns the number of prefill tiles of the batch.
    int64_t stage_batch_for_replay(const TokenBatch& batch, const MetaArea& area);
    void after_replay(const MetaArea& area);

private:
    // Records the ops' event pairs while op timing is on (see set_op_timing); a no-op otherwise.
    class OpTimer {
    public:
        OpTimer(CudaBackend& be, const char* op, QuantMode mode = QuantMode::kNone, int64_t n = 0, int64_t k = 0,
                int64_t m = -1);
        ~OpTimer();
        OpTimer(const OpTimer&) = delete;
        OpTimer& operator=(const OpTimer&) = delete;

    private:
        CudaBackend* be_ = nullptr;  // null: timing off
    };
    struct OpRecord {
        std::string name;
        cudaEvent_t start, end;
    };
    struct Scratch {
        void* p = nullptr;
        size_t bytes = 0;
    };
    void* scratch(Scratch& s, size_t bytes, const char* what);
    void ensure_batch(const TokenBatch& batch);
    // ensure_batch unless `batch` is the one begin_step staged (same arrays).
    void use_batch(const TokenBatch& batch);
    // Fills [ids | positions | seqs | tiles | tables] for batch at `host`; returns the tile count.
    static int64_t fill_staging(int32_t* host, const TokenBatch& batch);
    void write_staging(const TokenBatch& batch);
    void check_act(const View& v, const char* op, const char* what) const;
    void make_current() const;
    // out[m, n] = xq . W^T * sx * sw for int8 rows quantized per token (GEMV for small m, else IMMA).
    void matmul_w8a8(const View& out, const int8_t* xq, const float* sx, const Linear& w, int64_t m);
    // 4-bit (cuda_backend_int4.cpp): float host weights quantized to affine groups of 32 first (as the CPU does),
    // and the W4A16 dispatch of linear().
    Linear make_linear_float_int4(const View& host_w, QuantMode mode);
    void linear_int4(const View& out, const View& x, const Linear& w);

    int device_ = 0;
    DType act_;
    cudaStream_t stream_ = nullptr;
    std::unique_ptr<cuda::LtGemm> lt_;
    std::string device_name_;

    // Metadata staging for m tokens: pinned [ids m | positions m | seqs m | tiles 4m | tables m x width]
    // and its device mirror.
    int64_t meta_cap_ = 0;
    int64_t meta_width_ = 0;
    int64_t meta_seqs_ = 0;
    int32_t* meta_host_ = nullptr;
    int32_t* meta_dev_ = nullptr;
    int64_t meta_count_ = -1;
    int64_t meta_tiles_ = 0;
    bool meta_valid_ = false;
    bool meta_in_graph_ = false;
    cudaEvent_t meta_event_ = nullptr;
    bool capturing_ = false;
    int graphs_ = 0;                   // graphs captured so far: from then on, retire instead of free
    std::vector<void*> retired_dev_;   // outgrown device buffers a graph may still use
    std::vector<void*> retired_host_;  // outgrown pinned staging areas

    Scratch xq_, sx_, acc_, attn_ws_, ids_out_, params_, select_;
    Scratch xg_;                // activations gathered into a 4-bit linear's stored column order (act-order, k padding)
    bool w4a8_noted_ = false;   // "W4A8 runs as W4A16" logged once
    TokenBatch step_;                                     // the batch begin_step staged (count 0 outside a step)
    std::vector<char> select_host_;                       // pinned-free staging of select_tokens' params and bans
    std::set<std::pair<int64_t, int64_t>> lt_fallbacks_;  // (n, k) of int8 shapes cuBLASLt has no algorithm for
    bool op_timing_ = false;
    std::vector<OpRecord> op_records_;
    std::vector<cudaEvent_t> op_events_;  // created on first use, reused after op_times()
    size_t op_events_used_ = 0;
};

// Capture/replay of one decode step per batch-size bucket. How the engine uses it:
//   1. Run the step eagerly once for this bucket (sizes every scratch buffer).
//   2. graph.capture(backend, batch, [&] { model.forward(...); });  // records, runs nothing
//   3. Every step of that bucket: fill the same host-side TokenBatch (same count; pad with a dummy
//      slot if needed), then graph.replay(backend, batch); then read results (e.g. argmax/sample).
// Requirements: the forward must use the same device buffers (activations, KV cache, logits) at
// every replay, call no sync()/download() inside the capture, and all collectives must be on the
// backend's stream (NcclComm is). Attention chooses the decode kernel when every slot has one
// token, whose grid depends only on max_seq, so a captured step stays valid as sequences grow.
class CudaGraph {
public:
    CudaGraph() = default;
    ~CudaGraph();
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;

    void capture(CudaBackend& backend, const TokenBatch& batch, const std::function<void()>& body);
    void replay(CudaBackend& backend, const TokenBatch& batch);
    // Launches the graph again with the batch the last replay staged, without staging or waiting
    // (benchmarks: the graph alone, back to back, timed by events). replay() must have run once.
    void relaunch(CudaBackend& backend);
    bool ready() const { return exec_ != nullptr; }
    int64_t batch_count() const { return count_; }

private:
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
    int64_t count_ = 0;
    int64_t tiles_ = 0;
    bool replayed_ = false;
    CudaBackend::MetaArea area_;
};

}  // namespace lattice
