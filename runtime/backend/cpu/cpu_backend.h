// CpuBackend: the Backend on host memory, fp32 activations, forwarding to kernels/cpu.
// Float weights keep their checkpoint precision (f32/f16/bf16: widening is exact, bandwidth is
// what decode pays for), or with --dtype bf16 are rounded to bf16 and packed for the bf16-pair GEMM
// (kernels/cpu/gemm_bf16.h); int8 and 4-bit weights are packed once at load for the SIMD kernels
// (kernels/cpu/int8_gemm.h, int4_gemm.h).
// Memory is 64-byte aligned anonymous memory (never a file mapping), optionally mlock'ed.
#pragma once

#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/backend/backend.h"

#include <memory>
#include <unordered_map>

namespace lattice {

struct CpuBackendOptions {
    int threads = 0;    // <= 0: one per available core
    bool pin = false;   // pin the pool's workers to cores (BackendOptions::pin says why it is off)
    bool mlock = false; // lock weight memory (fails loudly if the limit is too low)
    // Select tokens as a device backend does (Backend::select_tokens, with the device's algorithm,
    // cpu::select_token), instead of handing the logits to the engine's host Sampler: the engine's
    // device-sampling side runs on CPU (tests).
    bool select_tokens = false;
    // Step graphs as a device backend has them, replay re-running the captured body on the new
    // batch: the engine's graph side (bucketing, padding) runs on CPU (tests).
    bool step_graphs = false;
    // Fused W8A8 quantization as a device backend has it (Backend::fuses_quant: the norms and the
    // SiLU quantize their output, linear_quant reads it): the model's fused path runs on CPU
    // (tests; bit-identical to the unfused path).
    bool fused_quant = false;
    // `--dtype bf16`: float linears (but a tied head: make_tied_head) rounded to bf16 at load and run as bf16 pairs
    // (kernels/cpu/gemm_bf16.h: packed for vdpbf16ps where the CPU has AVX512_BF16 at the avx512 level; elsewhere kept
    // bf16 row-major for the widened math, said once in the log), and the KV cache bf16 under --kv-cache-dtype auto.
    // Activations between ops stay f32.
    bool bf16 = false;
};

// Whether this CPU's W4A8 keeps a GGUF K-quant linear's super-blocks (Q4_K at 4.5 bits, Q6_K at 6.6: the
// K-quant layout of kernels/cpu/int4_gemm.h) rather than the group form (5 bits): the memory estimates ask.
bool cpu_keeps_kquant();
// The bytes a float linear of [n, k] takes on this CPU under --dtype bf16 (CpuBackendOptions::bf16): the bf16
// pairs' panels (padded to 16 channels and an even k) plus, where the provider policy gives the GEMMs to oneDNN
// (the amx level by default), its copy, counted as n x k bf16; without the pairs n x k bf16 rows. The memory
// estimates ask (RankWeights::resident_bytes).
double cpu_bf16_linear_bytes(int64_t n, int64_t k);
// Whether this CPU's W8A8 linears keep oneDNN's reordered copy beside the packed panels (int8_uses_onednn at the
// level they are packed for: the amx level by default, LATTICE_INT8_GEMM otherwise), n x k bytes more each: the
// memory estimates ask (RankWeights::resident_bytes).
bool cpu_w8a8_keeps_onednn_copy();

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const CpuBackendOptions& opt = {});
    ~CpuBackend() override;

    std::string name() const override;
    Device device() const override { return Device::kCpu; }
    DType activation_dtype() const override { return DType::kF32; }
    DType kv_auto_dtype() const override { return bf16_ ? DType::kBF16 : DType::kF32; }
    bool supports(Op op, DType dtype) const override;
    int threads() const override { return pool_->size(); }

    Buffer alloc(DType dtype, std::initializer_list<int64_t> shape) override;
    Buffer alloc_lazy(DType dtype, std::initializer_list<int64_t> shape) override;
    void free_memory(void* p) override;
    void upload(const View& dst, const void* host_src) override;
    void download(void* host_dst, const View& src) override;
    void sync() override {}
    void copy(const View& dst, const View& src) override;
    void copy_columns(const View& dst, int64_t col0, const View& src) override;
    bool selects_tokens() const override { return select_tokens_; }
    bool captures_steps() const override { return step_graphs_; }
    std::unique_ptr<StepGraph> capture_step(const TokenBatch& batch, const std::function<void()>& body) override;
    void replay_step(StepGraph& graph, const TokenBatch& batch) override;
    void select_tokens(const View& logits, std::span<const TokenSelect> rows, int32_t* ids, float* logprobs) override;

    Linear make_linear(const View& host_w, QuantMode mode) override;
    // --dtype bf16: a tied float head stays row-major in bf16 (the widened math), so that a bf16 one remains the
    // embedding's one copy of the rows.
    Linear make_tied_head(const View& host_w, QuantMode mode) override;
    Linear make_linear_int8(const View& host_q, const View& host_scales, QuantMode mode) override;
    Linear make_linear_int4(const Int4Matrix& w, QuantMode mode) override;
    bool packs_kquant() const override { return cpu_keeps_kquant(); }
    Buffer make_f32(const View& host) override;
    Buffer make_table(const View& host) override;

    void embed(const View& out, const View& table, const TokenBatch& batch, int64_t row_offset) override;
    void rmsnorm(const View& out, const View& x, const View& w, float eps) override;
    void add_rmsnorm(const View& residual, const View& x, const View& out, const View& w, float eps) override;
    void rope(const View& qkv, const TokenBatch& batch, const AttentionShape& s, const View& inv_freq) override;
    void attention(const View& out, const View& qkv, const View& k_cache, const View& v_cache, const TokenBatch& batch,
                   const AttentionShape& s) override;
    void silu_mul(const View& out, const View& gate_up) override;
    void gated_act(const View& out, const View& gate_up, Activation act) override;
    void head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps) override;
    void scale(const View& x, float s) override;
    void softcap(const View& x, float cap) override;
    void add(const View& out, const View& a, const View& b) override;
    void add_bias(const View& x, const View& bias) override;
    void gather_rows(const View& dst, const View& src, const View& rows) override;
    void scatter_add_rows(const View& dst, const View& src, const View& rows, const View& weights) override;
    void fill_zero(const View& x) override;
    void linear(const View& out, const View& x, const Linear& w) override;
    bool fuses_quant() const override { return fused_quant_; }
    QuantActs alloc_quant_acts(int64_t rows, int64_t k) override;
    void add_rmsnorm_quant(const View& residual, const View& x, const View& out, QuantActs& qa, const View& w,
                           float eps) override;
    void silu_mul_quant(const View& out, QuantActs& qa, const View& gate_up) override;
    void linear_quant(const View& out, const QuantActs& qa, const Linear& w) override;

    int64_t memory_available() const override;
    ThreadPool& pool() { return *pool_; }

private:
    static constexpr size_t kMapBytes = kHugePageBytes;  // allocations from here on are mapped (map_huge)
    Buffer alloc_bytes(DType dtype, View view_shape, bool huge_pages = true);
    Linear make_linear_float_int4(const View& w, QuantMode mode);
    Linear make_linear_rows(const View& w, DType dtype);
    std::unique_ptr<ThreadPool> pool_;
    bool mlock_ = false;
    bool select_tokens_ = false;
    bool step_graphs_ = false;
    bool fused_quant_ = false;
    bool bf16_ = false;
    void quantize_rows(QuantActs& qa, const View& y);
    std::unordered_map<void*, size_t> mapped_;  // mmap'ed allocations and their sizes
};

}  // namespace lattice
