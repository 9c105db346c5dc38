// CpuBackend implementation (see cpu_backend.h): memory, copies, step graphs, the ops. The weights (make_linear
// and its kin): cpu_backend_weights.cpp.
#include "runtime/backend/cpu/cpu_backend.h"

#include <sys/resource.h>
#include <unistd.h>

#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "base/convert.h"
#include "base/log.h"
#include "kernels/cpu/ops.h"

#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <cstdlib>
#include <cstring>

namespace lattice {

namespace {
void check_f32(const View& v, const char* what) {
    LATTICE_CHECK(v.dtype == DType::kF32 && v.device == Device::kCpu && v.is_contiguous(),
                  "CpuBackend::{}: expected a contiguous f32 host view, got {} {}", what, dtype_name(v.dtype),
                  v.shape_str());
}
}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& opt)
    : pool_(std::make_unique<ThreadPool>(opt.threads, opt.pin)), mlock_(opt.mlock), select_tokens_(opt.select_tokens),
      step_graphs_(opt.step_graphs), fused_quant_(opt.fused_quant), bf16_(opt.bf16) {
    if (bf16_ && !gemm_bf16_dot_available())
        LOG_INFO("--dtype bf16: {}; float weights are kept in bf16 and multiplied in f32",
                 cpu_features().avx512bf16 ? "the ISA level (LATTICE_ISA) is below avx512"
                                           : "this CPU has no AVX512_BF16 (vdpbf16ps)");
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
    return "cpu (" + std::string(isa_name(detect_isa())) + (bf16_ ? ", bf16" : "") + ", " +
           std::to_string(pool_->size()) + " threads)";
}

bool CpuBackend::supports(Op op, DType dtype) const {
    switch (op) {
        case Op::kGemm:
        case Op::kEmbed: return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
        case Op::kGemmInt8: return dtype == DType::kI8;
        case Op::kKvCache:
            return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kI8;
        case Op::kGemmInt4:
            return dtype == DType::kU8;  // 4-bit weights (Linear::weight_dtype u8)
        default: return dtype == DType::kF32;
    }
}

Buffer CpuBackend::alloc_bytes(DType dtype, View v, bool huge_pages) {
    const size_t bytes = size_t(std::max<int64_t>(v.bytes(), 1));
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = nullptr;
    if (rounded >= kMapBytes) {
        // Weights and scratch: huge pages (streamed whole), faulted in now: weights are written at
        // once anyway, and a scratch buffer's first use would otherwise pay its faults inside a
        // request's first step. The KV cache: 4 KiB pages that materialize on first touch, so a
        // large cache costs resident memory only as sequences fill it (huge_pages.h says why).
        p = map_pages(rounded, huge_pages);
        LATTICE_CHECK(p != nullptr, "CpuBackend: out of memory mapping {} bytes ({} {}): {}", bytes,
                      dtype_name(dtype), v.shape_str(), std::strerror(errno));
        if (huge_pages) prefault(p, rounded);
        mapped_[p] = rounded;
    } else {
        p = std::aligned_alloc(64, rounded);
        LATTICE_CHECK(p != nullptr, "CpuBackend: out of memory allocating {} bytes ({} {})", bytes, dtype_name(dtype),
                      v.shape_str());
        std::memset(p, 0, rounded);
    }
    if (mlock_) LATTICE_CHECK(::mlock(p, rounded) == 0, "--mlock: mlock of {} bytes failed ({}); raise `ulimit -l`",
                              rounded, std::strerror(errno));
    v.data = p;
    return Buffer(this, v);
}

Buffer CpuBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
    return alloc_bytes(dtype, View::contiguous(nullptr, dtype, shape));
}

Buffer CpuBackend::alloc_lazy(DType dtype, std::initializer_list<int64_t> shape) {
    return alloc_bytes(dtype, View::contiguous(nullptr, dtype, shape), false);
}

void CpuBackend::free_memory(void* p) {
    auto it = mapped_.find(p);
    if (it == mapped_.end()) {
        std::free(p);
        return;
    }
    unmap_huge(p, it->second);
    mapped_.erase(it);
}

namespace {

// First integer of a one-line file (cgroup v2 memory.max is "max" when unlimited: -1).
int64_t read_int_file(const char* path) {
    std::ifstream f(path);
    std::string v;
    if (!(f >> v) || v.empty() || v[0] < '0' || v[0] > '9') return -1;
    return std::stoll(v);
}

}  // namespace

// The smallest of: MemAvailable, the address-space limit's headroom (ulimit -v: the KV cache is
// mapped, so it counts in full), and the cgroup's headroom (Slurm and containers limit memory so).
int64_t CpuBackend::memory_available() const {
    int64_t avail = 0;
    {
        std::ifstream f("/proc/meminfo");
        std::string key, unit;
        int64_t kb = 0;
        while (f >> key >> kb >> unit)
            if (key == "MemAvailable:") {
                avail = kb * 1024;
                break;
            }
    }
    auto lower = [&](int64_t v) {
        if (v >= 0 && (avail <= 0 || v < avail)) avail = v;
    };
    struct rlimit as {};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        std::ifstream statm("/proc/self/statm");
        int64_t pages = 0;
        statm >> pages;
        lower(std::max<int64_t>(0, int64_t(as.rlim_cur) - pages * int64_t(sysconf(_SC_PAGESIZE))));
    }
    const int64_t max = read_int_file("/sys/fs/cgroup/memory.max");
    const int64_t cur = read_int_file("/sys/fs/cgroup/memory.current");
    if (max > 0 && cur >= 0) lower(std::max<int64_t>(0, max - cur));
    return avail;
}

void CpuBackend::upload(const View& dst, const void* src) { std::memcpy(dst.data, src, size_t(dst.bytes())); }
void CpuBackend::download(void* dst, const View& src) { std::memcpy(dst, src.data, size_t(src.bytes())); }

void CpuBackend::copy(const View& dst, const View& src) {
    LATTICE_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype, "copy: {} {} into {} {}",
                  dtype_name(src.dtype), src.shape_str(), dtype_name(dst.dtype), dst.shape_str());
    std::memmove(dst.data, src.data, size_t(src.bytes()));
}

void CpuBackend::copy_columns(const View& dst, int64_t col0, const View& src) {
    check_copy_columns(dst, col0, src, Device::kCpu);
    const size_t es = size_t(dtype_size(dst.dtype)), row = size_t(src.cols()) * es;
    for (int64_t r = 0; r < src.rows(); ++r)
        std::memcpy(static_cast<char*>(dst.data) + (size_t(r * dst.cols() + col0)) * es,
                    static_cast<const char*>(src.data) + size_t(r) * row, row);
}

namespace {
struct CpuStepGraph final : StepGraph {
    std::function<void()> body;
    int64_t count = 0, num_seqs = 0, table_width = 0;
};
}  // namespace

std::unique_ptr<StepGraph> CpuBackend::capture_step(const TokenBatch& batch, const std::function<void()>& body) {
    LATTICE_CHECK(step_graphs_, "CpuBackend::capture_step: not enabled (CpuBackendOptions::step_graphs)");
    auto g = std::make_unique<CpuStepGraph>();
    g->body = body;
    g->count = batch.count;
    g->num_seqs = batch.num_seqs;
    g->table_width = batch.table_width;
    return g;
}

void CpuBackend::replay_step(StepGraph& graph, const TokenBatch& batch) {
    auto* g = dynamic_cast<CpuStepGraph*>(&graph);
    LATTICE_CHECK(g, "CpuBackend::replay_step: a graph of another backend");
    LATTICE_CHECK(batch.count == g->count && batch.num_seqs == g->num_seqs && batch.table_width == g->table_width,
                  "CpuBackend::replay_step: batch of {} tokens, {} sequences, tables {} wide; captured for {}, {}, {}",
                  batch.count, batch.num_seqs, batch.table_width, g->count, g->num_seqs, g->table_width);
    g->body();
}

void CpuBackend::select_tokens(const View& logits, std::span<const TokenSelect> rows, int32_t* ids, float* logprobs) {
    LATTICE_CHECK(select_tokens_, "CpuBackend::select_tokens: not enabled (CpuBackendOptions::select_tokens)");
    LATTICE_CHECK(logits.device == Device::kCpu && logits.dtype == DType::kF32 && logits.ndim == 2 &&
                      logits.is_contiguous() && logits.rows() == int64_t(rows.size()),
                  "CpuBackend::select_tokens: logits {} {} for {} rows", dtype_name(logits.dtype), logits.shape_str(),
                  rows.size());
    const int64_t V = logits.cols();
    std::vector<float> raw;
    for (size_t i = 0; i < rows.size(); ++i) {
        const TokenSelect& r = rows[i];
        float* row = static_cast<float*>(logits.data) + int64_t(i) * V;
        // Penalties first (the device's order), the log-probability of the raw row: the raw values of
        // the edited ids are kept to undo the pick's edit.
        const double lse = r.penalties.empty() ? 0.0 : cpu::log_sum_exp(row, V);
        raw.clear();
        for (const TokenPenalty& e : r.penalties) {
            LATTICE_CHECK(e.id >= 0 && e.id < V, "CpuBackend::select_tokens: row {}: penalty on id {} of {}", i, e.id, V);
            float& l = row[e.id];
            raw.push_back(l);
            if (e.repeat) l = l > 0 ? l / r.repeat_penalty : l * r.repeat_penalty;
            l -= e.sub;
        }
        ids[i] = cpu::select_token(row, V, r.temperature, r.top_k, r.top_p, r.min_p, r.u, r.bans.data(),
                                   int64_t(r.bans.size()), &logprobs[i]);
        if (!r.penalties.empty()) {
            float value = row[ids[i]];  // raw unless the pick was edited (bans spare the pick)
            for (size_t e = 0; e < r.penalties.size(); ++e)
                if (r.penalties[e].id == ids[i]) value = raw[e];
            logprobs[i] = float(double(value) - lse);
        }
    }
}

void CpuBackend::embed(const View& out, const View& table, const TokenBatch& b, int64_t row_offset) {
    check_f32(out, "embed");
    LATTICE_CHECK(out.rows() == b.count && out.cols() == table.cols(), "embed: out {} for {} tokens, table {}",
                  out.shape_str(), b.count, table.shape_str());
    cpu::embed(out.ptr<float>(), table.data, table.dtype, table.rows(), table.cols(), b.ids, b.count, row_offset);
}

void CpuBackend::rmsnorm(const View& out, const View& x, const View& w, float eps) {
    check_f32(out, "rmsnorm");
    check_f32(x, "rmsnorm");
    LATTICE_CHECK(out.numel() == x.numel() && w.numel() == x.cols(), "rmsnorm: shapes {} {} {}", out.shape_str(),
                  x.shape_str(), w.shape_str());
    cpu::rmsnorm(out.ptr<float>(), x.ptr<float>(), w.ptr<float>(), x.rows(), x.cols(), eps, *pool_);
}

void CpuBackend::add_rmsnorm(const View& residual, const View& x, const View& out, const View& w, float eps) {
    check_f32(residual, "add_rmsnorm");
    check_f32(x, "add_rmsnorm");
    check_f32(out, "add_rmsnorm");
    LATTICE_CHECK(residual.numel() == x.numel() && out.numel() == x.numel() && w.numel() == x.cols(),
                  "add_rmsnorm: shapes {} {} {} {}", residual.shape_str(), x.shape_str(), out.shape_str(),
                  w.shape_str());
    cpu::add_rmsnorm(residual.ptr<float>(), x.ptr<float>(), out.ptr<float>(), w.ptr<float>(), x.rows(), x.cols(), eps,
                     *pool_);
}

void CpuBackend::rope(const View& qkv, const TokenBatch& b, const AttentionShape& s, const View& inv_freq) {
    check_f32(qkv, "rope");
    LATTICE_CHECK(qkv.rows() == b.count && qkv.cols() == (s.n_heads + 2 * s.n_kv_heads) * s.head_dim &&
                      inv_freq.numel() == s.head_dim / 2,
                  "rope: qkv {} for {} tokens", qkv.shape_str(), b.count);
    cpu::rope(qkv.ptr<float>(), b.count, qkv.cols(), b.positions, s.n_heads + s.n_kv_heads, s.head_dim,
              inv_freq.ptr<float>(), *pool_);
}

void CpuBackend::attention(const View& out, const View& qkv, const View& kc, const View& vc, const TokenBatch& b,
                           const AttentionShape& s) {
    check_f32(out, "attention");
    check_f32(qkv, "attention");
    LATTICE_CHECK(supports(Op::kKvCache, kc.dtype) && vc.dtype == kc.dtype && kc.is_contiguous() &&
                      vc.is_contiguous(),
                  "attention: a KV cache of {} / {} is not supported here", dtype_name(kc.dtype), dtype_name(vc.dtype));
    LATTICE_CHECK(kc.ndim == 4 && kc.dim(0) == s.num_blocks && kc.dim(1) == s.block_size &&
                      kc.dim(2) == s.n_kv_heads && kc.dim(3) == kv_row_elems(kc.dtype, s.head_dim) &&
                      vc.numel() == kc.numel(),
                  "attention: k cache {} ({}) does not match the attention shape", kc.shape_str(),
                  dtype_name(kc.dtype));
    LATTICE_CHECK(b.table_width == s.table_width, "attention: block tables of width {}, the cache's are {}",
                  b.table_width, s.table_width);
    cpu::AttentionArgs a{s.n_heads,       s.n_kv_heads, s.head_dim,    s.block_size, s.num_blocks,
                         b.block_tables, b.num_seqs,   s.table_width, s.scale,      s.window, kc.dtype, s.softcap};
    cpu::attention(out.ptr<float>(), qkv.ptr<float>(), kc.data, vc.data, b.positions, b.seqs, b.count, a, *pool_);
}

void CpuBackend::silu_mul(const View& out, const View& gu) {
    check_f32(out, "silu_mul");
    check_f32(gu, "silu_mul");
    LATTICE_CHECK(gu.cols() == 2 * out.cols() && gu.rows() == out.rows(), "silu_mul: {} from {}", out.shape_str(),
                  gu.shape_str());
    cpu::silu_mul(out.ptr<float>(), gu.ptr<float>(), out.rows(), out.cols(), *pool_);
}

void CpuBackend::add(const View& out, const View& a, const View& b) {
    check_f32(out, "add");
    LATTICE_CHECK(a.numel() == out.numel() && b.numel() == out.numel(), "add: shapes differ");
    cpu::add(out.ptr<float>(), a.ptr<float>(), b.ptr<float>(), out.numel());
}

namespace {
// Host i32 [n] row indices (and f32 [n] weights when given): the index views of gather / scatter-add.
void check_row_index(const View& rows, const View* weights, const char* op) {
    LATTICE_CHECK(rows.dtype == DType::kI32 && rows.device == Device::kCpu && rows.ndim == 1 && rows.is_contiguous(),
                  "{}: rows must be a host i32 vector, got {} {}", op, dtype_name(rows.dtype), rows.shape_str());
    if (weights)
        LATTICE_CHECK(weights->dtype == DType::kF32 && weights->device == Device::kCpu &&
                          weights->numel() == rows.numel() && weights->is_contiguous(),
                      "{}: weights must be a host f32 vector of {}, got {} {}", op, rows.numel(),
                      dtype_name(weights->dtype), weights->shape_str());
}
}  // namespace

void CpuBackend::gather_rows(const View& dst, const View& src, const View& rows) {
    check_f32(dst, "gather_rows");
    check_f32(src, "gather_rows");
    check_row_index(rows, nullptr, "gather_rows");
    const int64_t n = rows.numel(), c = src.cols();
    LATTICE_CHECK(dst.ndim == 2 && src.ndim == 2 && dst.cols() == c && dst.rows() >= n && dst.is_contiguous() &&
                      src.is_contiguous(),
                  "gather_rows: {} rows of {} into {}", n, src.shape_str(), dst.shape_str());
    const int32_t* idx = rows.ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
        LATTICE_CHECK(idx[i] >= 0 && idx[i] < src.rows(), "gather_rows: row {} of {}", idx[i], src.shape_str());
        std::memcpy(dst.ptr<float>() + i * c, src.ptr<float>() + int64_t(idx[i]) * c, size_t(c) * sizeof(float));
    }
}

void CpuBackend::scatter_add_rows(const View& dst, const View& src, const View& rows, const View& weights) {
    check_f32(dst, "scatter_add_rows");
    check_f32(src, "scatter_add_rows");
    check_row_index(rows, &weights, "scatter_add_rows");
    const int64_t n = rows.numel(), c = dst.cols();
    LATTICE_CHECK(dst.ndim == 2 && src.ndim == 2 && src.cols() == c && src.rows() >= n && dst.is_contiguous() &&
                      src.is_contiguous(),
                  "scatter_add_rows: {} rows of {} into {}", n, src.shape_str(), dst.shape_str());
    const int32_t* idx = rows.ptr<int32_t>();
    const float* w = weights.ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
        LATTICE_CHECK(idx[i] >= 0 && idx[i] < dst.rows(), "scatter_add_rows: row {} of {}", idx[i], dst.shape_str());
        cpu::axpy(dst.ptr<float>() + int64_t(idx[i]) * c, w[i], src.ptr<float>() + i * c, c);
    }
}

void CpuBackend::fill_zero(const View& x) {
    check_f32(x, "fill_zero");
    LATTICE_CHECK(x.is_contiguous(), "fill_zero: {} is not contiguous", x.shape_str());
    std::memset(x.data, 0, size_t(x.bytes()));
}

void CpuBackend::add_bias(const View& x, const View& bias) {
    check_f32(x, "add_bias");
    check_f32(bias, "add_bias");
    LATTICE_CHECK(x.ndim == 2 && bias.numel() == x.cols() && x.is_contiguous(), "add_bias: x {} + bias {}",
                  x.shape_str(), bias.shape_str());
    cpu::add_bias_rows(x.ptr<float>(), bias.ptr<float>(), x.rows(), x.cols());
}

void CpuBackend::linear(const View& out, const View& x, const Linear& w) {
    check_f32(out, "linear");
    check_f32(x, "linear");
    LATTICE_CHECK(x.cols() == w.k && out.cols() == w.n && out.rows() == x.rows(),
                  "linear: x {} . W[{}, {}]^T into {}", x.shape_str(), w.n, w.k, out.shape_str());
    switch (w.mode) {
        case QuantMode::kNone:
            if (w.prepared) {  // --dtype bf16, packed for the bf16 pairs
                gemm_bf16_dot(x.ptr<float>(), x.rows(), *static_cast<const PackedBf16*>(w.prepared.get()),
                              out.ptr<float>(), *pool_);
                break;
            }
            gemm_f32(x.ptr<float>(), x.rows(), w.k, w.weight.data(), w.weight_dtype, w.n, out.ptr<float>(), *pool_);
            break;
        case QuantMode::kW8A8:
            gemm_w8a8(x.ptr<float>(), x.rows(), w.k, *static_cast<const PackedInt8*>(w.prepared.get()),
                      w.scales.ptr<float>(), out.ptr<float>(), *pool_);
            break;
        case QuantMode::kW8A16:
            gemm_w8a16(x.ptr<float>(), x.rows(), w.k, *static_cast<const PackedInt8*>(w.prepared.get()),
                       w.scales.ptr<float>(), out.ptr<float>(), *pool_);
            break;
        case QuantMode::kW4A8:
            gemm_w4a8(x.ptr<float>(), x.rows(), w.k, *static_cast<const PackedInt4*>(w.prepared.get()),
                      out.ptr<float>(), *pool_);
            break;
        case QuantMode::kW4A16:
            gemm_w4a16(x.ptr<float>(), x.rows(), w.k, *static_cast<const PackedInt4*>(w.prepared.get()),
                       out.ptr<float>(), *pool_);
            break;
    }
}

QuantActs CpuBackend::alloc_quant_acts(int64_t rows, int64_t k) {
    LATTICE_CHECK(fused_quant_, "CpuBackend::alloc_quant_acts: not enabled (CpuBackendOptions::fused_quant)");
    LATTICE_CHECK(rows > 0 && k > 0, "CpuBackend::alloc_quant_acts: [{}, {}]", rows, k);
    QuantActs qa;
    qa.q = alloc(DType::kI8, {rows, k});
    qa.scales = alloc(DType::kF32, {rows});
    qa.rows = rows;
    qa.k = k;
    qa.ld = k;
    return qa;
}

void CpuBackend::quantize_rows(QuantActs& qa, const View& y) {
    LATTICE_CHECK(fused_quant_, "CpuBackend: fused quantization not enabled (CpuBackendOptions::fused_quant)");
    LATTICE_CHECK(y.cols() == qa.k && y.rows() <= qa.rows, "CpuBackend: quantizing {} into activations of [{}, {}]",
                  y.shape_str(), qa.rows, qa.k);
    const float* src = y.ptr<float>();
    int8_t* q = qa.q.ptr<int8_t>();
    float* sc = qa.scales.ptr<float>();
    const int64_t k = qa.k;
    pool_->parallel_for(y.rows(), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) sc[r] = quantize_row_int8_simd(src + r * k, k, q + r * qa.ld);
    });
}

void CpuBackend::add_rmsnorm_quant(const View& residual, const View& x, const View& out, QuantActs& qa,
                                   const View& w, float eps) {
    if (x.data)
        add_rmsnorm(residual, x, out, w, eps);
    else
        rmsnorm(out, residual, w, eps);
    quantize_rows(qa, out);
}

void CpuBackend::silu_mul_quant(const View& out, QuantActs& qa, const View& gate_up) {
    silu_mul(out, gate_up);
    quantize_rows(qa, out);
}

void CpuBackend::linear_quant(const View& out, const QuantActs& qa, const Linear& w) {
    check_f32(out, "linear_quant");
    LATTICE_CHECK(w.mode == QuantMode::kW8A8 && qa.k == w.k && out.cols() == w.n && out.rows() <= qa.rows,
                  "CpuBackend::linear_quant: {} activations [{}, {}] . W[{}, {}]^T into {}", quant_mode_name(w.mode),
                  qa.rows, qa.k, w.n, w.k, out.shape_str());
    gemm_w8a8_quantized(qa.q.ptr<int8_t>(), qa.ld, qa.scales.ptr<float>(), out.rows(), w.k,
                        *static_cast<const PackedInt8*>(w.prepared.get()), w.scales.ptr<float>(), out.ptr<float>(),
                        *pool_);
}

}  // namespace lattice
