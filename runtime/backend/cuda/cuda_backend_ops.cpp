// CudaBackend ops: shape checks on the host, then one or two kernel launches on stream_; the fused W8A8
// quantization; make_cuda_backend(). The token metadata the ops read and the step graphs:
// cuda_backend_graph.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/cuda_check.h"
#include "base/log.h"
#include "kernels/cuda/gemm_lt.h"
#include "runtime/backend/cuda/cuda_backend.h"
#include "runtime/backend/make_backend.h"

namespace lattice {
namespace {

int64_t round_up(int64_t v, int64_t m) {
    return (v + m - 1) / m * m;
}

void check_rows_cols(const View& v, int64_t rows, int64_t cols, const char* op, const char* what) {
    LATTICE_CHECK(v.rows() == rows && v.cols() == cols, "CudaBackend::{}: {} is {}, expected [{}, {}]", op, what,
                  v.shape_str(), rows, cols);
}

void check_quant_acts(const QuantActs& qa, int64_t rows, int64_t k, const char* op) {
    LATTICE_CHECK(qa.q.view().device == Device::kCuda && qa.k == k && rows <= qa.rows && qa.ld == round_up(k, 16),
                  "CudaBackend::{}: {} rows of {} into quantized activations [{}, {}] (ld {})", op, rows, k, qa.rows,
                  qa.k, qa.ld);
}

}  // namespace

// ---- ops ----
void CudaBackend::embed(const View& out, const View& table, const TokenBatch& batch, int64_t row_offset) {
    const OpTimer timer(*this, "embed");
    check_act(out, "embed", "out");
    LATTICE_CHECK(batch.ids, "CudaBackend::embed: batch has no token ids");
    LATTICE_CHECK(table.device == Device::kCuda && table.ndim == 2 && table.cols() == out.cols(),
                  "CudaBackend::embed: table {} vs out {}", table.shape_str(), out.shape_str());
    check_rows_cols(out, batch.count, table.cols(), "embed", "out");
    use_batch(batch);
    cuda::embed(out.data, act_, table.data, table.dtype, table.shape[0], table.cols(), meta_dev_, batch.count,
                row_offset, stream_);
}

void CudaBackend::rmsnorm(const View& out, const View& x, const View& w, float eps) {
    const OpTimer timer(*this, "rmsnorm");
    check_act(out, "rmsnorm", "out");
    check_act(x, "rmsnorm", "x");
    check_rows_cols(out, x.rows(), x.cols(), "rmsnorm", "out");
    LATTICE_CHECK(w.dtype == DType::kF32 && w.numel() == x.cols() && w.device == Device::kCuda,
                  "CudaBackend::rmsnorm: weight must be f32 [{}] on the device", x.cols());
    cuda::rmsnorm(out.data, x.data, w.ptr<float>(), x.rows(), x.cols(), eps, act_, stream_);
}

void CudaBackend::add_rmsnorm(const View& residual, const View& x, const View& out, const View& w, float eps) {
    const OpTimer timer(*this, "add_rmsnorm");
    check_act(residual, "add_rmsnorm", "residual");
    check_act(x, "add_rmsnorm", "x");
    check_act(out, "add_rmsnorm", "out");
    check_rows_cols(x, residual.rows(), residual.cols(), "add_rmsnorm", "x");
    check_rows_cols(out, residual.rows(), residual.cols(), "add_rmsnorm", "out");
    LATTICE_CHECK(w.dtype == DType::kF32 && w.numel() == x.cols() && w.device == Device::kCuda,
                  "CudaBackend::add_rmsnorm: weight must be f32 [{}] on the device", x.cols());
    cuda::add_rmsnorm(residual.data, x.data, out.data, w.ptr<float>(), x.rows(), x.cols(), eps, act_, stream_);
}

void CudaBackend::rope(const View& qkv, const TokenBatch& batch, const AttentionShape& s, const View& inv_freq) {
    const OpTimer timer(*this, "rope");
    check_act(qkv, "rope", "qkv");
    check_rows_cols(qkv, batch.count, (s.n_heads + 2 * s.n_kv_heads) * s.head_dim, "rope", "qkv");
    LATTICE_CHECK(
        inv_freq.dtype == DType::kF32 && inv_freq.numel() == s.head_dim / 2 && inv_freq.device == Device::kCuda,
        "CudaBackend::rope: inv_freq must be f32 [{}] on the device", s.head_dim / 2);
    use_batch(batch);
    cuda::rope(qkv.data, meta_dev_ + batch.count, batch.count, s.n_heads, s.n_kv_heads, s.head_dim,
               inv_freq.ptr<float>(), act_, stream_);
}

void CudaBackend::attention(const View& out, const View& qkv, const View& k_cache, const View& v_cache,
                            const TokenBatch& batch, const AttentionShape& s) {
    const OpTimer timer(*this, "attention");
    const int64_t m = batch.count;
    check_act(out, "attention", "out");
    check_act(qkv, "attention", "qkv");
    const bool int8 = k_cache.dtype == DType::kI8;  // --kv-cache-dtype int8; otherwise the activation dtype
    if (!int8) {
        check_act(k_cache, "attention", "k_cache");
        check_act(v_cache, "attention", "v_cache");
    }
    LATTICE_CHECK(v_cache.dtype == k_cache.dtype && k_cache.device == Device::kCuda && v_cache.device == Device::kCuda,
                  "CudaBackend::attention: k cache {} and v cache {} on the device", dtype_name(k_cache.dtype),
                  dtype_name(v_cache.dtype));
    check_rows_cols(qkv, m, (s.n_heads + 2 * s.n_kv_heads) * s.head_dim, "attention", "qkv");
    check_rows_cols(out, m, s.n_heads * s.head_dim, "attention", "out");
    const int64_t row = kv_row_elems(k_cache.dtype, s.head_dim);
    LATTICE_CHECK(k_cache.ndim == 4 && k_cache.shape[0] == s.num_blocks && k_cache.shape[1] == s.block_size &&
                      k_cache.shape[2] == s.n_kv_heads && k_cache.shape[3] == row &&
                      v_cache.numel() == k_cache.numel() && batch.table_width == s.table_width,
                  "CudaBackend::attention: cache {} (tables of width {}) does not match [{}, {}, {}, {}] (width {})",
                  k_cache.shape_str(), batch.table_width, s.num_blocks, s.block_size, s.n_kv_heads, row,
                  s.table_width);
    // Every position a token touches must be in a block of the cache (the kernels also guard).
    for (int64_t i = 0; i < m; ++i) {
        const int32_t p = batch.positions[i], q = batch.seqs[i];
        LATTICE_CHECK(p >= 0 && p < s.max_seq && q >= 0 && q < batch.num_seqs,
                      "CudaBackend::attention: token {} at position {} of sequence {} is outside the context ({} "
                      "positions) or the {} block tables",
                      i, p, q, s.max_seq, batch.num_seqs);
        const int32_t* row = batch.block_tables + int64_t(q) * s.table_width;
        for (int64_t b = 0; b <= p / s.block_size; ++b)
            LATTICE_CHECK(row[b] >= 0 && row[b] < s.num_blocks,
                          "CudaBackend::attention: token {} reads block {} (entry {} of sequence {}), the cache has "
                          "{} blocks",
                          i, row[b], b, q, s.num_blocks);
    }
    use_batch(batch);
    cuda::AttnDims d;
    d.n_heads = s.n_heads;
    d.n_kv_heads = s.n_kv_heads;
    d.head_dim = s.head_dim;
    d.max_seq = s.max_seq;
    d.block_size = s.block_size;
    d.num_blocks = s.num_blocks;
    d.table_width = s.table_width;
    d.scale = s.scale;
    d.window = s.window;
    LATTICE_CHECK(s.softcap >= 0.0f && std::isfinite(s.softcap),
                  "CudaBackend::attention: soft-cap {} (expected 0, none, or a positive finite cap)", s.softcap);
    d.softcap = s.softcap;
    d.kv_int8 = int8;
    const int32_t* pos = meta_dev_ + m;
    const int32_t* seqs = meta_dev_ + 2 * m;
    const cuda::KvTables kv{meta_dev_ + 7 * m, batch.num_seqs};
    cuda::kv_store(k_cache.data, v_cache.data, qkv.data, pos, seqs, kv, m, d, act_, stream_);
    if (meta_tiles_ == m) {  // every tile is one token: decode (graph-stable grid)
        float* ws = static_cast<float*>(scratch(attn_ws_, size_t(cuda::decode_workspace_floats(m, d)) * 4, "attn"));
        cuda::attention_decode(out.data, qkv.data, k_cache.data, v_cache.data, pos, seqs, kv, m, d, ws, act_,
                               stream_);
    } else {
        const auto* tiles = reinterpret_cast<const cuda::PrefillTile*>(meta_dev_ + 3 * m);
        cuda::attention_prefill(out.data, qkv.data, k_cache.data, v_cache.data, pos, tiles, meta_tiles_, kv, d, act_,
                                stream_);
    }
}

void CudaBackend::silu_mul(const View& out, const View& gate_up) {
    const OpTimer timer(*this, "silu_mul");
    check_act(out, "silu_mul", "out");
    check_act(gate_up, "silu_mul", "gate_up");
    check_rows_cols(gate_up, out.rows(), 2 * out.cols(), "silu_mul", "gate_up");
    cuda::silu_mul(out.data, gate_up.data, out.rows(), out.cols(), act_, stream_);
}

void CudaBackend::add(const View& out, const View& a, const View& b) {
    const OpTimer timer(*this, "add");
    check_act(out, "add", "out");
    check_act(a, "add", "a");
    check_act(b, "add", "b");
    LATTICE_CHECK(a.numel() == out.numel() && b.numel() == out.numel(), "CudaBackend::add: {} + {} -> {}",
                  a.shape_str(), b.shape_str(), out.shape_str());
    cuda::add(out.data, a.data, b.data, out.numel(), act_, stream_);
}

void CudaBackend::linear(const View& out, const View& x, const Linear& w) {
    const OpTimer timer(*this, "linear", w.mode, w.n, w.k, x.rows());
    // out may be f32 (the LM head writes f32 logits); everything else is in the activation dtype.
    const DType od = out.dtype;
    if (od != DType::kF32) check_act(out, "linear", "out");
    LATTICE_CHECK(out.device == Device::kCuda && out.is_contiguous(),
                  "CudaBackend::linear: out must be a contiguous "
                  "device tensor");
    check_act(x, "linear", "x");
    const int64_t m = x.rows(), n = w.n, k = w.k;
    check_rows_cols(x, m, k, "linear", "x");
    check_rows_cols(out, m, n, "linear", "out");
    LATTICE_CHECK(w.weight.view().device == Device::kCuda, "CudaBackend::linear: weight is not on the device");
    if (m == 0) return;
    if (w.mode == QuantMode::kNone) {
        LATTICE_CHECK(w.weight_dtype == act_, "CudaBackend::linear: float weight dtype {} != activation dtype {}",
                      dtype_name(w.weight_dtype), dtype_name(act_));
        lt_->gemm_float(out.data, n, x.data, k, w.weight.data(), k, m, n, k, act_, od, stream_);
        return;
    }
    if (is_int4(w.mode)) {
        linear_int4(out, x, w);
        return;
    }
    const int64_t n_pad = w.weight.view().shape[0], k_pad = w.weight.view().shape[1];
    LATTICE_CHECK(w.weight_dtype == DType::kI8 && n_pad == round_up(n, 16) && k_pad == round_up(k, 16) &&
                      w.scales.view().numel() == n_pad,
                  "CudaBackend::linear: int8 weight {} was not made by CudaBackend::make_linear",
                  w.weight.view().shape_str());
    const auto* wq = w.weight.ptr<int8_t>();
    const auto* sw = w.scales.ptr<float>();
    // Crossover: decode batches of m <= kGemvMaxRows (16) tokens run the GEMVs (weights read once,
    // no tile padding); W8A16 above it runs the tensor-core GEMM that converts the int8 weight tile by
    // tile (no dequantized copy), W8A8 runs IMMA.
    if (w.mode == QuantMode::kW8A16) {
        if (m <= cuda::kGemvMaxRows)
            cuda::gemv_w8a16(out.data, x.data, wq, k_pad, sw, m, n, k, act_, od, stream_);
        else
            cuda::gemm_w8a16(out.data, x.data, wq, k_pad, sw, m, n, k, act_, od, stream_);
        return;
    }
    // W8A8: per-token dynamic int8 activations.
    auto* xq = static_cast<int8_t*>(scratch(xq_, size_t(m * k_pad), "quantized activations"));
    auto* sx = static_cast<float*>(scratch(sx_, size_t(m) * 4, "activation scales"));
    cuda::quantize_rows(xq, k_pad, sx, x.data, m, k, act_, stream_);
    matmul_w8a8(out, xq, sx, w, m);
}

void CudaBackend::matmul_w8a8(const View& out, const int8_t* xq, const float* sx, const Linear& w, int64_t m) {
    const int64_t n = w.n, n_pad = w.weight.view().shape[0], k_pad = w.weight.view().shape[1];
    const auto* wq = w.weight.ptr<int8_t>();
    const auto* sw = w.scales.ptr<float>();
    if (m > cuda::kGemvMaxRows) {
        auto* acc = static_cast<int32_t*>(scratch(acc_, size_t(m * n_pad) * 4, "int32 accumulators"));
        if (lt_->try_gemm_i8(acc, n_pad, xq, k_pad, wq, k_pad, m, n_pad, k_pad, stream_)) {
            cuda::dequant_i32(out.data, acc, n_pad, sx, sw, m, n, act_, out.dtype, stream_);
            return;
        }
        // cuBLASLt has no algorithm for this shape: the GEMV in chunks of kGemvMaxRows rows (each
        // chunk reads the weights once more: slower, same int32 dots, same results). Said once per shape.
        if (lt_fallbacks_.insert({n_pad, k_pad}).second)
            LOG_WARN(
                "cuda:{}: cuBLASLt has no int8 algorithm for n={} k={} (m={}): W8A8 runs the GEMV in chunks of "
                "{} rows for this shape (correct, slower)",
                device_, n_pad, k_pad, m, cuda::kGemvMaxRows);
    }
    const size_t es = size_t(dtype_size(out.dtype));
    for (int64_t r0 = 0; r0 < m; r0 += cuda::kGemvMaxRows) {
        const int64_t rows = std::min<int64_t>(cuda::kGemvMaxRows, m - r0);
        cuda::gemv_w8a8(static_cast<char*>(out.data) + size_t(r0 * n) * es, xq + r0 * k_pad, k_pad, sx + r0, wq, k_pad,
                        sw, rows, n, k_pad, act_, out.dtype, stream_);
    }
}

void CudaBackend::set_lt_options(const cuda::LtOptions& options) {
    LATTICE_CHECK(!capturing_ && graphs_ == 0, "CudaBackend::set_lt_options after a graph was captured");
    make_current();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    lt_ = std::make_unique<cuda::LtGemm>(options);
    lt_fallbacks_.clear();
}

void CudaBackend::linear_quant(const View& out, const QuantActs& qa, const Linear& w) {
    const OpTimer timer(*this, "linear", w.mode, w.n, w.k, out.rows());
    const DType od = out.dtype;
    if (od != DType::kF32) check_act(out, "linear_quant", "out");
    LATTICE_CHECK(out.device == Device::kCuda && out.is_contiguous(),
                  "CudaBackend::linear_quant: out must be a contiguous device tensor");
    const int64_t m = out.rows();
    check_rows_cols(out, m, w.n, "linear_quant", "out");
    LATTICE_CHECK(w.mode == QuantMode::kW8A8 && w.weight_dtype == DType::kI8 && w.weight.view().device == Device::kCuda &&
                      w.weight.view().shape[0] == round_up(w.n, 16) && w.weight.view().shape[1] == qa.ld,
                  "CudaBackend::linear_quant: {} weight {} for quantized activations of k = {} (ld {})",
                  quant_mode_name(w.mode), w.weight.view().shape_str(), qa.k, qa.ld);
    check_quant_acts(qa, m, w.k, "linear_quant");
    if (m == 0) return;
    matmul_w8a8(out, qa.q.ptr<int8_t>(), qa.scales.ptr<float>(), w, m);
}

void CudaBackend::argmax(const View& logits, int32_t* host_ids) {
    LATTICE_CHECK(logits.device == Device::kCuda && logits.is_contiguous(), "CudaBackend::argmax: device logits");
    const int64_t m = logits.rows();
    auto* ids = static_cast<int32_t*>(scratch(ids_out_, size_t(std::max<int64_t>(m, 1)) * 4, "sampled ids"));
    cuda::argmax(ids, logits.data, logits.dtype, m, logits.cols(), stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_ids, ids, size_t(m) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::sample(const View& logits, const cuda::SampleParams* host_params, int32_t* host_ids) {
    LATTICE_CHECK(logits.device == Device::kCuda && logits.is_contiguous(), "CudaBackend::sample: device logits");
    const int64_t m = logits.rows();
    for (int64_t i = 0; i < m; ++i)
        LATTICE_CHECK(host_params[i].temperature > 0.0f && host_params[i].top_p > 0.0f &&
                          host_params[i].top_p <= 1.0f && host_params[i].u >= 0.0f && host_params[i].u < 1.0f,
                      "CudaBackend::sample: row {}: temperature {} top_p {} u {} out of range", i,
                      host_params[i].temperature, host_params[i].top_p, host_params[i].u);
    auto* ids = static_cast<int32_t*>(scratch(ids_out_, size_t(std::max<int64_t>(m, 1)) * 4, "sampled ids"));
    auto* params = static_cast<cuda::SampleParams*>(
        scratch(params_, size_t(std::max<int64_t>(m, 1)) * sizeof(cuda::SampleParams), "sample params"));
    CUDA_CHECK(
        cudaMemcpyAsync(params, host_params, size_t(m) * sizeof(cuda::SampleParams), cudaMemcpyHostToDevice, stream_));
    cuda::sample(ids, logits.data, logits.dtype, m, logits.cols(), params, stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_ids, ids, size_t(m) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::select_tokens(const View& logits, std::span<const TokenSelect> rows, int32_t* host_ids,
                                float* host_logprobs) {
    const OpTimer timer(*this, "select_tokens");
    LATTICE_CHECK(logits.device == Device::kCuda && logits.dtype == DType::kF32 && logits.ndim == 2 &&
                      logits.is_contiguous() && logits.rows() == int64_t(rows.size()),
                  "CudaBackend::select_tokens: logits {} {} for {} rows (f32 [rows, vocab] on the device)",
                  dtype_name(logits.dtype), logits.shape_str(), rows.size());
    const int64_t m = logits.rows();
    if (m == 0) return;
    make_current();
    // One staging block: [params m | bans | (16-byte aligned) penalty edits] then, on the device,
    // [ids m | logprobs m] after it.
    std::vector<cuda::SelectParams> params(static_cast<size_t>(m));
    std::vector<int32_t> bans;
    std::vector<cuda::PenaltyEdit> edits;
    const int64_t V = logits.cols();
    for (int64_t i = 0; i < m; ++i) {
        const TokenSelect& r = rows[size_t(i)];
        LATTICE_CHECK(r.temperature >= 0.0f && r.top_p > 0.0f && r.top_p <= 1.0f && r.min_p >= 0.0f &&
                          r.min_p <= 1.0f && r.u >= 0.0f && r.u < 1.0f && r.repeat_penalty > 0.0f,
                      "CudaBackend::select_tokens: row {}: temperature {} top_p {} min_p {} u {} repeat penalty {} "
                      "out of range",
                      i, r.temperature, r.top_p, r.min_p, r.u, r.repeat_penalty);
        cuda::SelectParams& p = params[size_t(i)];
        p = {r.temperature, r.top_k > 0 ? r.top_k : 0, r.top_p, r.min_p, r.u, int32_t(bans.size()), 0};
        bans.insert(bans.end(), r.bans.begin(), r.bans.end());
        p.ban_end = int32_t(bans.size());
        p.repeat_penalty = r.repeat_penalty;
        p.pen_begin = int32_t(edits.size());
        for (const TokenPenalty& e : r.penalties) {
            LATTICE_CHECK(e.id >= 0 && e.id < V, "CudaBackend::select_tokens: row {}: penalty on id {} of {}", i, e.id,
                          V);
            edits.push_back(cuda::PenaltyEdit{e.id, e.repeat, e.sub, 0.0f});
        }
        p.pen_end = int32_t(edits.size());
    }
    const size_t pbytes = params.size() * sizeof(cuda::SelectParams), bbytes = bans.size() * 4;
    const size_t eoff = (pbytes + bbytes + 15) / 16 * 16, ebytes = edits.size() * sizeof(cuda::PenaltyEdit);
    const size_t in_bytes = (eoff + ebytes + 15) / 16 * 16;
    char* dev = static_cast<char*>(scratch(select_, in_bytes + size_t(m) * 8, "token selection"));
    select_host_.assign(in_bytes, 0);
    std::memcpy(select_host_.data(), params.data(), pbytes);
    if (bbytes) std::memcpy(select_host_.data() + pbytes, bans.data(), bbytes);
    if (ebytes) std::memcpy(select_host_.data() + eoff, edits.data(), ebytes);
    CUDA_CHECK(cudaMemcpyAsync(dev, select_host_.data(), in_bytes, cudaMemcpyHostToDevice, stream_));
    auto* ids = reinterpret_cast<int32_t*>(dev + in_bytes);
    auto* lps = reinterpret_cast<float*>(dev + in_bytes + size_t(m) * 4);
    cuda::select_tokens(ids, lps, static_cast<float*>(logits.data), m, logits.cols(),
                        reinterpret_cast<const cuda::SelectParams*>(dev), reinterpret_cast<const int32_t*>(dev + pbytes),
                        ebytes ? reinterpret_cast<cuda::PenaltyEdit*>(dev + eoff) : nullptr, stream_);
    std::vector<int32_t> out(size_t(m) * 2);
    CUDA_CHECK(cudaMemcpyAsync(out.data(), ids, size_t(m) * 8, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(host_ids, out.data(), size_t(m) * 4);
    std::memcpy(host_logprobs, out.data() + m, size_t(m) * 4);
}

// ---- fused W8A8 quantization ----
QuantActs CudaBackend::alloc_quant_acts(int64_t rows, int64_t k) {
    LATTICE_CHECK(rows > 0 && k > 0, "CudaBackend::alloc_quant_acts: [{}, {}]", rows, k);
    QuantActs qa;
    qa.rows = rows;
    qa.k = k;
    qa.ld = round_up(k, 16);  // the int8 GEMMs' padded k (make_linear pads weights the same way)
    qa.q = alloc(DType::kI8, {rows, qa.ld});
    qa.scales = alloc(DType::kF32, {rows});
    return qa;
}

void CudaBackend::add_rmsnorm_quant(const View& residual, const View& x, const View& out, QuantActs& qa, const View& w,
                                    float eps) {
    const OpTimer timer(*this, "add_rmsnorm_quant");
    check_act(residual, "add_rmsnorm_quant", "residual");
    if (x.data) {
        check_act(x, "add_rmsnorm_quant", "x");
        check_rows_cols(x, residual.rows(), residual.cols(), "add_rmsnorm_quant", "x");
    }
    check_act(out, "add_rmsnorm_quant", "out");
    check_rows_cols(out, residual.rows(), residual.cols(), "add_rmsnorm_quant", "out");
    LATTICE_CHECK(w.dtype == DType::kF32 && w.numel() == residual.cols() && w.device == Device::kCuda,
                  "CudaBackend::add_rmsnorm_quant: weight must be f32 [{}] on the device", residual.cols());
    check_quant_acts(qa, residual.rows(), residual.cols(), "add_rmsnorm_quant");
    cuda::add_rmsnorm_quant(residual.data, x.data, out.data, qa.q.ptr<int8_t>(), qa.ld, qa.scales.ptr<float>(),
                            w.ptr<float>(), residual.rows(), residual.cols(), eps, act_, stream_);
}

void CudaBackend::silu_mul_quant(const View& out, QuantActs& qa, const View& gate_up) {
    const OpTimer timer(*this, "silu_mul_quant");
    check_act(out, "silu_mul_quant", "out");
    check_act(gate_up, "silu_mul_quant", "gate_up");
    check_rows_cols(gate_up, out.rows(), 2 * out.cols(), "silu_mul_quant", "gate_up");
    check_quant_acts(qa, out.rows(), out.cols(), "silu_mul_quant");
    cuda::silu_mul_quant(out.data, qa.q.ptr<int8_t>(), qa.ld, qa.scales.ptr<float>(), gate_up.data, out.rows(),
                         out.cols(), act_, stream_);
}

// ---- factory (the CUDA half of runtime/backend/make_backend.h) ----
std::unique_ptr<Backend> make_cuda_backend(int device, DType act) {
    return std::make_unique<CudaBackend>(device, act);
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device / no driver" error
        return 0;
    }
    return n;
}

}  // namespace lattice
