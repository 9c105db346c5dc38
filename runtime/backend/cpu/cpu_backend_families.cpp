// The CPU backend's ops of the families beyond Llama's skeleton (runtime/backend/backend.h): the gated
// activations besides SiLU (GeGLU), QK-norm, scaling and soft-capping; kernels/cpu/ops.h does the math.
// Activations f32 [rows, cols] row-major, like every CPU op.
#include "kernels/cpu/ops.h"
#include "runtime/backend/cpu/cpu_backend.h"

namespace lattice {

namespace {
void check_f32_(const View& v, const char* what) {
    LATTICE_CHECK(v.dtype == DType::kF32 && v.device == Device::kCpu, "{}: the CPU backend expects f32 host views, got {}",
                  what, dtype_name(v.dtype));
}
}  // namespace

void CpuBackend::gated_act(const View& out, const View& gu, Activation act) {
    if (act == Activation::kSilu) return silu_mul(out, gu);
    check_f32_(out, "gated_act");
    check_f32_(gu, "gated_act");
    LATTICE_CHECK(act == Activation::kGeluTanh && gu.cols() == 2 * out.cols() && gu.rows() == out.rows(),
                  "gated_act {}: {} from {}", activation_name(act), out.shape_str(), gu.shape_str());
    cpu::gelu_tanh_mul(out.ptr<float>(), gu.ptr<float>(), out.rows(), out.cols(), *pool_);
}

void CpuBackend::head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps) {
    check_f32_(qkv, "head_rmsnorm");
    const int64_t hd = s.head_dim;
    LATTICE_CHECK(qkv.is_contiguous() && qkv.cols() == (s.n_heads + 2 * s.n_kv_heads) * hd && q_w.numel() == hd &&
                      k_w.numel() == hd,
                  "head_rmsnorm: qkv {}, heads {} + 2 x {} of {}", qkv.shape_str(), s.n_heads, s.n_kv_heads, hd);
    cpu::head_rmsnorm(qkv.ptr<float>(), qkv.rows(), qkv.cols(), s.n_heads, s.n_kv_heads, hd, q_w.ptr<float>(),
                      k_w.ptr<float>(), eps, *pool_);
}

void CpuBackend::scale(const View& x, float s) {
    check_f32_(x, "scale");
    cpu::scale(x.ptr<float>(), x.numel(), s);
}

void CpuBackend::softcap(const View& x, float cap) {
    check_f32_(x, "softcap");
    cpu::softcap(x.ptr<float>(), x.numel(), cap);
}

}  // namespace lattice
