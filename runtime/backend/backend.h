// Backend: the one interface the model forward runs on. One virtual call per op; CpuBackend
// forwards to kernels/cpu, CudaBackend (kernels/cuda) owns a stream. There is ONE model forward
// (runtime/model/model.cpp); a device only implements these ops.
//
// Conventions for every op:
// - Activations are [rows, cols] row-major Views in the backend's activation dtype
//   (fp32 on CPU; fp16/bf16 on CUDA), rows = tokens of the flattened batch.
// - Token metadata (ids, positions, KV slots) is passed as host arrays; a device backend uploads it.
// - `supports(op, dtype)` is asked when the model loads so an unsupported combination fails then,
//   with a message naming the op and dtype, never mid-run.
#pragma once

#include "base/dtype.h"
#include "kernels/common/int4.h"
#include "parallel/communicator.h"
#include "base/error.h"
#include "base/view.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace lattice {

class Backend;

// Owning, move-only storage allocated through (and freed by) its backend.
class Buffer {
public:
    Buffer() = default;
    Buffer(Backend* owner, View view) : owner_(owner), view_(view) {}
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    Buffer(Buffer&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), view_(std::exchange(o.view_, View{})) {}
    Buffer& operator=(Buffer&& o) noexcept {
        if (this != &o) {
            reset();
            owner_ = std::exchange(o.owner_, nullptr);
            view_ = std::exchange(o.view_, View{});
        }
        return *this;
    }
    ~Buffer() { reset(); }

    void reset();
    const View& view() const { return view_; }
    bool empty() const { return view_.data == nullptr; }
    void* data() const { return view_.data; }
    int64_t bytes() const { return empty() ? 0 : view_.bytes(); }  // (an empty view is a 0-d one: 1 element)
    template <typename T>
    T* ptr() const {
        return static_cast<T*>(view_.data);
    }

private:
    Backend* owner_ = nullptr;
    View view_;
};

// How a linear layer's weights are stored and multiplied.
enum class QuantMode : uint8_t {
    kNone,   // float weights (checkpoint precision: f32/f16/bf16), float GEMM
    kW8A16,  // int8 weights, per-output-channel scale; activations stay float
    kW8A8,   // int8 weights and per-token dynamically quantized int8 activations, int32 accumulate
    kW4A16,  // 4-bit weights in groups along k (f16 scales, offsets), dequantized in registers; float activations
    kW4A8,   // 4-bit weights x per-token int8 activations, int32 per group then the group's scale
};
inline bool is_int4(QuantMode q) { return q == QuantMode::kW4A16 || q == QuantMode::kW4A8; }
// The 8-bit mode with the same activations (W4A8 -> W8A8, W4A16 -> W8A16); itself otherwise. A 4-bit run's
// LM head runs so unless the checkpoint holds the head in 4 bits (runtime/model/rank_weights.h).
inline QuantMode int8_counterpart(QuantMode q) {
    return q == QuantMode::kW4A8 ? QuantMode::kW8A8 : q == QuantMode::kW4A16 ? QuantMode::kW8A16 : q;
}

std::string_view quant_mode_name(QuantMode q);
QuantMode parse_quant_mode(std::string_view s);  // throws Error naming the bad value

// The KV cache's element type (--kv-cache-dtype); auto: the backend's activation dtype. INT8 rows are
// symmetric with one f32 scale per token and KV head (kv_row_elems counts 4 bytes per row for it): a
// block holds its block_size * n_kv * head_dim int8 values, then their [block_size, n_kv] f32 scales
// (rows stay 16-byte aligned for vector loads); quantized as each token is written, read through the
// attention kernels. How a block orders its values is the backend's: CUDA keeps [block_size, n_kv,
// head_dim] rows for K and V, the CPU keeps V as [n_kv, block_size, head_dim] rows and K transposed,
// [n_kv, head_dim, block_size] (kernels/cpu/attention.cpp: tiles read in place).
enum class KvDtype : uint8_t { kAuto, kF32, kF16, kBF16, kInt8 };
std::string_view kv_dtype_name(KvDtype k);
KvDtype parse_kv_dtype(std::string_view s);  // throws Error naming the bad value
DType resolve_kv_dtype(KvDtype k, DType activation);
// Elements of the KV cache's last dimension for one token and KV head: head_dim, and for i8 four more
// bytes for the row's f32 scale (stored at the end of its block, above).
inline int64_t kv_row_elems(DType kv, int64_t head_dim) { return kv == DType::kI8 ? head_dim + 4 : head_dim; }

// A linear layer y[m, n] = x[m, k] . W[n, k]^T, prepared once at load by Backend::make_linear.
// The storage layout of `weight` is private to the backend that made it (it may be packed).
struct Linear {
    int64_t n = 0;  // output features
    int64_t k = 0;  // input features
    QuantMode mode = QuantMode::kNone;
    DType weight_dtype = DType::kF32;  // logical element type: f32/f16/bf16, i8 for W8A16/W8A8, u8 for the
                                       // 4-bit W4A16/W4A8 (the packed form is backend-private)
    Buffer weight;                     // backend-specific layout of the [n, k] matrix
    Buffer scales;                     // [n] f32 per-output-channel scales (int8 modes)
    Buffer aux;                        // backend-specific extra (e.g. per-channel weight sums)
    std::shared_ptr<void> prepared;    // backend-private prepared form (e.g. CPU packed int8 panels)
    int64_t prepared_bytes = 0;
    int64_t aside_bytes = 0;  // of prepared_bytes, held beside what a decode step reads (oneDNN's copy for m >= 16)
    int64_t weight_bytes() const { return weight.bytes() + scales.bytes() + aux.bytes() + prepared_bytes; }
    int64_t streamed_bytes() const { return weight_bytes() - aside_bytes; }  // what a decode step reads
};

enum class Op : uint8_t {
    kEmbed,
    kRmsNorm,
    kAddRmsNorm,
    kRope,
    kAttention,
    kSiluMul,
    kAdd,
    kAddBias,   // a row vector added to every row (q/k/v biases)
    kSlidingWindow,  // attention honours AttentionShape::window
    kGemm,      // float weights
    kGemmInt8,  // W8A16 / W8A8
    kKvCache,   // attention over a KV cache of this dtype (kv_row_elems)
    kMoe,       // the row moves of a mixture-of-experts block: gather_rows, scatter_add_rows, fill_zero
    kGemmInt4,  // W4A16 / W4A8
    kGeluTanhMul,  // gated_act with Activation::kGeluTanh (GeGLU)
    kHeadNorm,     // head_rmsnorm (QK-norm)
    kScale,        // scale (an embedding scale)
    kSoftCap,      // softcap of rows (final logits)
    kAttnSoftCap,  // attention honours AttentionShape::softcap
};

// The activation of a gated MLP: out = act(gate) * up. kSilu is SwiGLU (Llama, Qwen, Mistral), kGeluTanh
// GeGLU with the tanh approximation of GELU (Gemma's gelu_pytorch_tanh).
enum class Activation : uint8_t { kSilu, kGeluTanh };
std::string_view activation_name(Activation a);
std::string_view op_name(Op op);
// Throws unless copy_columns(dst, col0, src) is in bounds on `device` (Backend::copy_columns).
void check_copy_columns(const View& dst, int64_t col0, const View& src, Device device);

// Token metadata of a flattened batch. Token i belongs to sequence seqs[i] (a row of block_tables)
// and sits at positions[i]; its K/V live in the paged cache at block
// block_tables[seqs[i] * table_width + positions[i] / block_size], row positions[i] % block_size.
// Tokens of one sequence appear in increasing position order.
struct TokenBatch {
    const int32_t* ids = nullptr;
    const int32_t* positions = nullptr;
    const int32_t* seqs = nullptr;
    int64_t count = 0;
    const int32_t* block_tables = nullptr;  // [num_seqs, table_width], -1: unused
    int64_t num_seqs = 0;
    int64_t table_width = 0;                // == AttentionShape::table_width
    const int32_t* seq_loras = nullptr;     // [num_seqs] LoRA slot of each sequence (Model::set_lora), 0: the
                                            // base; null: every sequence the base (host memory)
};

// A penalty on one id of a row (the sampler's repetition / presence / frequency penalties, made by
// Sampler::penalty_list): l = repeat ? (l > 0 ? l / repeat_penalty : l * repeat_penalty) : l; then
// l -= sub. Each id at most once per row.
struct TokenPenalty {
    int32_t id = 0;
    int32_t repeat = 0;  // 1: the repetition penalty applies (the id is in the recent window)
    float sub = 0.0f;    // frequency_penalty * count + presence_penalty (0: none)
};

// One row of a step's token selection on the backend (Backend::select_tokens). The penalties are
// applied to the row first, then the bans, then the selection; the returned log-probability is that
// of the raw row (before any of them), as on the host path.
struct TokenSelect {
    float temperature = 0.0f;  // 0: greedy (lowest id on ties)
    int32_t top_k = 0;         // 0: all
    float top_p = 1.0f;        // (0, 1]
    float min_p = 0.0f;        // [0, 1]
    float u = 0.0f;            // the sequence's uniform [0, 1) draw (its sampler owns the RNG)
    std::span<const int32_t> bans;  // ids that may not be picked (stop tokens before min_tokens)
    float repeat_penalty = 1.0f;    // for the penalties with repeat set
    std::span<const TokenPenalty> penalties;
};

// Activations quantized per token for the W8A8 linears that read them: made by
// Backend::alloc_quant_acts, written by the fused ops (add_rmsnorm_quant, silu_mul_quant), read by
// linear_quant. Layout private to the backend that allocated it; holds up to `rows` tokens of `k`.
struct QuantActs {
    Buffer q;       // int8 [rows, ld]
    Buffer scales;  // f32 [rows]
    int64_t rows = 0, k = 0, ld = 0;
};

struct AttentionShape {
    int64_t n_heads = 0;     // query heads on this rank
    int64_t n_kv_heads = 0;  // kv heads on this rank
    int64_t head_dim = 0;
    int64_t block_size = 16;  // positions per KV block
    int64_t num_blocks = 0;   // blocks of each layer's cache
    int64_t table_width = 0;  // entries per block-table row: ceil(max_seq / block_size)
    int64_t max_seq = 0;      // positions per sequence
    float scale = 1.0f;       // softmax scale, 1/sqrt(head_dim)
    int64_t window = 0;       // sliding window: query at i attends keys i - window < j <= i; 0: all
    float softcap = 0.0f;     // scores (after scale) become softcap * tanh(score / softcap); 0: none
};

// A captured step (Backend::capture_step): the backend's work of one step body, replayed for later
// batches of the same shape. Opaque; owned by the caller, valid while its backend lives.
class StepGraph {
public:
    virtual ~StepGraph() = default;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual Device device() const = 0;
    virtual DType activation_dtype() const = 0;
    // The KV cache's element type for --kv-cache-dtype auto (the activation type; CPU --dtype bf16: bf16).
    virtual DType kv_auto_dtype() const { return activation_dtype(); }
    virtual bool supports(Op op, DType dtype) const = 0;
    // Host threads this backend computes with (CPU: its pool; devices: 1).
    virtual int threads() const { return 1; }
    // Bytes this backend could still allocate (CPU: MemAvailable; CUDA: free device memory); 0: unknown.
    virtual int64_t memory_available() const { return 0; }
    // A communicator over the same ranks as the host group `host` that moves this backend's
    // memory (CUDA: NCCL on the backend's stream), or null when the host group itself is right
    // (CPU, or a group of one rank). Collective over `host`.
    virtual std::unique_ptr<Communicator> make_group_comm(Communicator& host, const std::string& name,
                                                          double timeout_s) {
        return nullptr;
    }

    // Memory. alloc returns zero-filled memory.
    virtual Buffer alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
    // Zero-filled like alloc, for memory that is written a part at a time over the engine's life (the
    // KV cache a block at a time, the logits a few rows per step): a backend may materialize it only
    // as it is touched (CPU: 4 KiB pages on first write, where alloc's are huge and made resident at
    // once; see huge_pages.h).
    virtual Buffer alloc_lazy(DType dtype, std::initializer_list<int64_t> shape) { return alloc(dtype, shape); }
    virtual void free_memory(void* p) = 0;
    virtual void upload(const View& dst, const void* host_src) = 0;  // dst.bytes() bytes
    virtual void download(void* host_dst, const View& src) = 0;      // src.bytes() bytes
    virtual void sync() = 0;
    // Device-to-device copy of src into dst (same dtype and element count, both contiguous).
    virtual void copy(const View& dst, const View& src) = 0;
    // dst[:, col0 : col0 + c] = src: dst [R, C] and src [R, c], same dtype, both contiguous here.
    virtual void copy_columns(const View& dst, int64_t col0, const View& src) = 0;

    // ---- the step API ----
    // A step's batch: begin_step uploads its token metadata once (a device backend), and every op
    // until end_step that is given the same TokenBatch arrays reuses it instead of checking them
    // again. The arrays must not change in between. Optional: ops work without it.
    virtual void begin_step(const TokenBatch& batch) {}
    virtual void end_step() {}
    // Whether select_tokens runs here (CUDA: on the device, so only ids leave it). Backends without
    // it hand the engine host logits and the engine's Sampler picks (CPU: the logits are host memory).
    virtual bool selects_tokens() const { return false; }
    // Step graphs (CUDA graphs): capture_step records the work of body() for batches shaped like
    // `batch` (the same count, sequences and table width) and runs nothing; replay_step runs it for
    // `batch`, whose arrays hold the new step's metadata. Before capturing a shape, run one eager
    // step of it (that sizes every scratch buffer). body() must enqueue the same work every time
    // (no host reads of device results) and use the same buffers: the model's scratch and caches.
    virtual bool captures_steps() const { return false; }
    virtual std::unique_ptr<StepGraph> capture_step(const TokenBatch& batch, const std::function<void()>& body) {
        LATTICE_FAIL("{}: step graphs are not implemented on this backend", name());
    }
    virtual void replay_step(StepGraph& graph, const TokenBatch& batch) {
        LATTICE_FAIL("{}: step graphs are not implemented on this backend", name());
    }
    // One token per row of f32 logits [R, V] on this backend (modified: banned ids become -inf):
    // ids[i], and logprobs[i] = log softmax(raw row i)[ids[i]]. Rows with penalties are not for this
    // op (they need the sequence's history on the host).
    virtual void select_tokens(const View& logits, std::span<const TokenSelect> rows, int32_t* ids, float* logprobs) {
        LATTICE_FAIL("{}: select_tokens is not implemented on this backend", name());
    }

    // Prepares a linear layer from host weights w [n, k] (f32/f16/bf16, row-major).
    // kNone keeps f16/bf16 as they are (exact) or converts to the backend's preferred dtype;
    // int8 modes quantize symmetrically per output channel; 4-bit modes (supports(Op::kGemmInt4)) quantize
    // in affine groups of 32 (kernels/cpu/int4_gemm.h quantize_weights_int4), then make_linear_int4.
    virtual Linear make_linear(const View& host_w, QuantMode mode) = 0;
    // The same for an LM head tied to the embedding (which may then read its rows: Model::embed_rows).
    virtual Linear make_tied_head(const View& host_w, QuantMode mode) { return make_linear(host_w, mode); }
    // Prepares a 4-bit linear (kW4A16 / kW4A8) from weights already in 4 bits (kernels/common/int4.h: a GGUF
    // Q4 file's blocks, an AWQ / GPTQ checkpoint's groups), nothing rounded again; the default refuses.
    virtual Linear make_linear_int4(const Int4Matrix& w, QuantMode mode) {
        LATTICE_FAIL("backend {} has no 4-bit weights ({} [{}, {}])", name(), quant_mode_name(mode), w.n, w.k);
    }
    // Whether make_linear_int4 in W4A8 packs GGUF K-quant super-blocks as they are (Int4Matrix::kq) where a
    // linear's parts allow (RankWeights::kquant_packed), so a load may read those linears as super-blocks alone
    // (Int4Matrix::kquant_only). The CPU on its scalar and AVX-512 kernels; never CUDA.
    virtual bool packs_kquant() const { return false; }
    // Prepares an int8 linear layer (kW8A16 / kW8A8) from weights already quantized symmetrically per
    // output channel: host_q i8 [n, k] row-major, host_scales f32 [n] (w ~= q * scale). Nothing is
    // quantized again: the layer equals make_linear of the float weights those came from (a converted
    // checkpoint, runtime/weights/converted_source.h). CPU packs its panels, CUDA pads and uploads.
    virtual Linear make_linear_int8(const View& host_q, const View& host_scales, QuantMode mode) = 0;
    // Uploads a small float tensor (norm weights, rope tables) converting to f32.
    virtual Buffer make_f32(const View& host) = 0;
    // Embedding table [v, h] kept in the checkpoint's float dtype.
    virtual Buffer make_table(const View& host) = 0;

    // out[i, :] = table[ids[i] - row_offset, :] when that row is local, else 0 (vocab-parallel).
    virtual void embed(const View& out, const View& table, const TokenBatch& batch, int64_t row_offset) = 0;
    // out = x / rms(x) * w, per row.
    virtual void rmsnorm(const View& out, const View& x, const View& w, float eps) = 0;
    // residual += x; out = rmsnorm(residual) * w (fused: one read of each activation).
    virtual void add_rmsnorm(const View& residual, const View& x, const View& out, const View& w, float eps) = 0;
    // Rotates the q heads and the k heads of qkv [m, (nh + 2 nkv) * hd] in place (half-split
    // "rotate_half" pairing, i and i + hd/2); inv_freq [hd/2] f32.
    virtual void rope(const View& qkv, const TokenBatch& batch, const AttentionShape& s, const View& inv_freq) = 0;
    // Stores k, v of every token into the paged caches ([num_blocks, block_size, nkv, hd] each), then
    // out[i] = softmax(q_i . K[seq_i, 0..pos_i] * scale) . V (causal by position, GQA), K/V read
    // through the sequence's block table.
    virtual void attention(const View& out, const View& qkv, const View& k_cache, const View& v_cache,
                           const TokenBatch& batch, const AttentionShape& s) = 0;
    // out[m, f] = silu(gu[m, f]) * gu[m, F + f] where gu = [gate | up] is [m, 2F].
    virtual void silu_mul(const View& out, const View& gate_up) = 0;
    // The generic gated activation: out[m, f] = act(gu[m, f]) * gu[m, F + f]. kSilu is silu_mul (the
    // fast path every backend has); others need supports(Op::kGeluTanhMul) and an override.
    virtual void gated_act(const View& out, const View& gate_up, Activation act) {
        LATTICE_CHECK(act == Activation::kSilu, "backend {} does not support the {} gated activation", name(),
                      activation_name(act));
        silu_mul(out, gate_up);
    }
    // QK-norm: every q head and every k head of qkv [m, (nq + 2 nkv) * hd] (s's local heads) in place,
    // x = rmsnorm(x) * w per head with q_w / k_w [hd] f32 (v untouched). The default runs rmsnorm on each
    // token's q and k rows (one call each per token); a backend may override it with one launch.
    virtual void head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps);
    // x *= s, in f32 (supports(Op::kScale); the default refuses).
    virtual void scale(const View& x, float s) {
        LATTICE_FAIL("backend {} does not support scale ({})", name(), x.shape_str());
    }
    // x = cap * tanh(x / cap) elementwise, in f32 (supports(Op::kSoftCap); the default refuses).
    virtual void softcap(const View& x, float cap) {
        LATTICE_FAIL("backend {} does not support softcap ({})", name(), x.shape_str());
    }
    virtual void add(const View& out, const View& a, const View& b) = 0;
    // x[r, :] += bias (f32 [cols]) for every row, in f32 (supports(Op::kAddBias); the default refuses).
    virtual void add_bias(const View& x, const View& bias) {
        LATTICE_FAIL("backend {} does not support add_bias ({} {} + bias {})", name(), dtype_name(x.dtype),
                     x.shape_str(), bias.shape_str());
    }
    // out[m, n] = x[m, k] . W^T
    virtual void linear(const View& out, const View& x, const Linear& w) = 0;

    // The moves of a mixture-of-experts block (supports(Op::kMoe); the defaults refuse): an expert's
    // tokens gathered into contiguous rows, its outputs added back weighted by their router weights.
    // `rows` (i32 [n]) and `weights` (f32 [n]) are on this backend's device (Model uploads a layer's
    // routes in one copy); activations are in the activation dtype, contiguous [rows, cols].
    // dst[i, :] = src[rows[i], :] for i < n (dst has at least n rows); a row outside src is an Error
    // on the CPU, a zero row on a device (whose kernels cannot throw).
    virtual void gather_rows(const View& dst, const View& src, const View& rows) {
        LATTICE_FAIL("backend {} does not support gather_rows ({} rows of {})", name(), rows.numel(), src.shape_str());
    }
    // dst[rows[i], :] += weights[i] * src[i, :], in f32 (rounded once per row into dst's dtype). The
    // rows of one call are distinct (a token meets an expert at most once).
    virtual void scatter_add_rows(const View& dst, const View& src, const View& rows, const View& weights) {
        LATTICE_FAIL("backend {} does not support scatter_add_rows ({} rows into {})", name(), rows.numel(),
                     dst.shape_str());
    }
    // x = 0.
    virtual void fill_zero(const View& x) {
        LATTICE_FAIL("backend {} does not support fill_zero ({})", name(), x.shape_str());
    }

    // Fused quantization for W8A8 (the model uses these when fuses_quant()): the norm and the SiLU
    // also quantize their output per token in the same pass, and the W8A8 linears that read it skip
    // their own quantization. Each equals its unfused sequence exactly: add_rmsnorm_quant ==
    // add_rmsnorm (x empty: rmsnorm of residual, residual unchanged) then the quantization linear()
    // would do; silu_mul_quant == silu_mul then that quantization; linear_quant(out, qa, w) ==
    // linear(out, x, w) for the x that qa was quantized from. out is always written.
    virtual bool fuses_quant() const { return false; }
    virtual QuantActs alloc_quant_acts(int64_t rows, int64_t k) {
        LATTICE_FAIL("{}: fused quantization is not implemented on this backend", name());
    }
    virtual void add_rmsnorm_quant(const View& residual, const View& x, const View& out, QuantActs& qa, const View& w,
                                   float eps) {
        LATTICE_FAIL("{}: add_rmsnorm_quant is not implemented on this backend", name());
    }
    virtual void silu_mul_quant(const View& out, QuantActs& qa, const View& gate_up) {
        LATTICE_FAIL("{}: silu_mul_quant is not implemented on this backend", name());
    }
    virtual void linear_quant(const View& out, const QuantActs& qa, const Linear& w) {
        LATTICE_FAIL("{}: linear_quant is not implemented on this backend", name());
    }
};

// log(sum_j exp(row[j])) of a host row (NaN counts as -inf): the log-softmax denominator of the
// engine's host sampling path: kernels/cpu/ops.h log_sum_exp, which select_token uses too.
double host_log_sum_exp(const float* row, int64_t n);
// The lowest id of the largest logit of a host row (NaN never; 0 when none exceeds -inf): greedy sampling.
int32_t host_argmax(const float* row, int64_t n);

// begin_step ... end_step for one scope (end_step also when the step throws).
class StepScope {
public:
    StepScope(Backend& be, const TokenBatch& batch) : be_(be) { be_.begin_step(batch); }
    ~StepScope() { be_.end_step(); }
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;

private:
    Backend& be_;
};

inline void Buffer::reset() {
    if (owner_ && view_.data) owner_->free_memory(view_.data);
    owner_ = nullptr;
    view_ = View{};
}

}  // namespace lattice
