// CudaBackend ops of the families beyond Llama (runtime/arch): Qwen2's q/k/v biases (add_bias), a
// mixture-of-experts block's row moves (gather_rows, scatter_add_rows, fill_zero), GeGLU (gated_act),
// QK-norm (head_rmsnorm), scale and softcap (kernels/cuda/family_ops.cu), each a shape check
// on the host and one launch on stream_ (kernels/cuda/rows.cu) or one memset. The sliding window
// (Mistral) and the attention soft-cap (Gemma 2) are AttnDims::window and AttnDims::softcap in
// CudaBackend::attention. Row indices and weights are device vectors
// the model uploaded once per layer (Backend::gather_rows says why).
#include "base/cuda_check.h"
#include "runtime/backend/cuda/cuda_backend.h"

namespace lattice {
namespace {

void check_index(const View& v, DType dt, int64_t n, const char* op, const char* what) {
    LATTICE_CHECK(v.device == Device::kCuda && v.dtype == dt && v.ndim == 1 && v.numel() == n && v.is_contiguous() &&
                      (n == 0 || v.data),
                  "CudaBackend::{}: {} must be a contiguous {} device vector of {}, got {} {} on {}", op, what,
                  dtype_name(dt), n, dtype_name(v.dtype), v.shape_str(), v.device == Device::kCuda ? "cuda" : "cpu");
}

}  // namespace

void CudaBackend::add_bias(const View& x, const View& bias) {
    check_act(x, "add_bias", "x");
    LATTICE_CHECK(x.ndim == 2 && bias.dtype == DType::kF32 && bias.device == Device::kCuda &&
                      bias.numel() == x.cols() && bias.is_contiguous(),
                  "CudaBackend::add_bias: x {} + bias {} {} (f32 [{}] on the device)", x.shape_str(),
                  dtype_name(bias.dtype), bias.shape_str(), x.cols());
    cuda::add_bias(x.data, bias.ptr<float>(), x.rows(), x.cols(), act_, stream_);
}

void CudaBackend::gather_rows(const View& dst, const View& src, const View& rows) {
    check_act(dst, "gather_rows", "dst");
    check_act(src, "gather_rows", "src");
    const int64_t n = rows.numel();
    check_index(rows, DType::kI32, n, "gather_rows", "rows");
    LATTICE_CHECK(dst.ndim == 2 && src.ndim == 2 && dst.cols() == src.cols() && dst.rows() >= n,
                  "CudaBackend::gather_rows: {} rows of {} into {}", n, src.shape_str(), dst.shape_str());
    cuda::gather_rows(dst.data, src.data, rows.ptr<int32_t>(), n, src.rows(), src.cols(), act_, stream_);
}

void CudaBackend::scatter_add_rows(const View& dst, const View& src, const View& rows, const View& weights) {
    check_act(dst, "scatter_add_rows", "dst");
    check_act(src, "scatter_add_rows", "src");
    const int64_t n = rows.numel();
    check_index(rows, DType::kI32, n, "scatter_add_rows", "rows");
    check_index(weights, DType::kF32, n, "scatter_add_rows", "weights");
    LATTICE_CHECK(dst.ndim == 2 && src.ndim == 2 && dst.cols() == src.cols() && src.rows() >= n,
                  "CudaBackend::scatter_add_rows: {} rows of {} into {}", n, src.shape_str(), dst.shape_str());
    cuda::scatter_add_rows(dst.data, src.data, rows.ptr<int32_t>(), weights.ptr<float>(), n, dst.rows(), dst.cols(),
                           act_, stream_);
}

void CudaBackend::gated_act(const View& out, const View& gate_up, Activation act) {
    if (act == Activation::kSilu) return silu_mul(out, gate_up);
    check_act(out, "gated_act", "out");
    check_act(gate_up, "gated_act", "gate_up");
    LATTICE_CHECK(gate_up.rows() == out.rows() && gate_up.cols() == 2 * out.cols(),
                  "CudaBackend::gated_act: {} from {}", out.shape_str(), gate_up.shape_str());
    cuda::gelu_tanh_mul(out.data, gate_up.data, out.rows(), out.cols(), act_, stream_);
}

void CudaBackend::head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps) {
    check_act(qkv, "head_rmsnorm", "qkv");
    const int64_t hd = s.head_dim;
    LATTICE_CHECK(qkv.cols() == (s.n_heads + 2 * s.n_kv_heads) * hd && q_w.numel() == hd && k_w.numel() == hd &&
                      q_w.dtype == DType::kF32 && k_w.dtype == DType::kF32,
                  "CudaBackend::head_rmsnorm: qkv {}, heads {} + 2 x {} of {}", qkv.shape_str(), s.n_heads,
                  s.n_kv_heads, hd);
    cuda::head_rmsnorm(qkv.data, qkv.rows(), qkv.cols(), s.n_heads, s.n_kv_heads, hd, q_w.ptr<float>(),
                       k_w.ptr<float>(), eps, act_, stream_);
}

void CudaBackend::scale(const View& x, float s) {
    LATTICE_CHECK(x.device == Device::kCuda && x.is_contiguous() && (x.dtype == act_ || x.dtype == DType::kF32),
                  "CudaBackend::scale: {} {}", dtype_name(x.dtype), x.shape_str());
    cuda::scale(x.data, x.numel(), s, x.dtype, stream_);
}

void CudaBackend::softcap(const View& x, float cap) {
    LATTICE_CHECK(x.device == Device::kCuda && x.is_contiguous() && (x.dtype == act_ || x.dtype == DType::kF32),
                  "CudaBackend::softcap: {} {}", dtype_name(x.dtype), x.shape_str());
    cuda::softcap(x.data, x.numel(), cap, x.dtype, stream_);
}

void CudaBackend::fill_zero(const View& x) {
    LATTICE_CHECK(x.device == Device::kCuda && x.is_contiguous(),
                  "CudaBackend::fill_zero: {} is not a contiguous "
                  "device tensor",
                  x.shape_str());
    if (x.bytes() > 0) CUDA_CHECK(cudaMemsetAsync(x.data, 0, size_t(x.bytes()), stream_));
}

}  // namespace lattice
