// Names for Backend enums (for CLI parsing and error messages), the checks ops share, and the host
// row math of the engine's sampling path.
#include "runtime/backend/backend.h"

#include "kernels/cpu/ops.h"

namespace lattice {

double host_log_sum_exp(const float* row, int64_t n) {
    return cpu::log_sum_exp(row, n);
}

int32_t host_argmax(const float* row, int64_t n) {
    return int32_t(cpu::argmax(row, n));
}

std::string_view quant_mode_name(QuantMode q) {
    switch (q) {
        case QuantMode::kNone: return "none";
        case QuantMode::kW8A16: return "w8a16";
        case QuantMode::kW8A8: return "w8a8";
        case QuantMode::kW4A16: return "w4a16";
        case QuantMode::kW4A8: return "w4a8";
    }
    return "?";
}

QuantMode parse_quant_mode(std::string_view s) {
    if (s == "none") return QuantMode::kNone;
    if (s == "w8a16") return QuantMode::kW8A16;
    if (s == "w8a8") return QuantMode::kW8A8;
    if (s == "w4a16") return QuantMode::kW4A16;
    if (s == "w4a8") return QuantMode::kW4A8;
    LATTICE_FAIL("unknown quantization \"{}\" (expected none, w8a16, w8a8, w4a16 or w4a8)", s);
}

std::string_view kv_dtype_name(KvDtype k) {
    switch (k) {
        case KvDtype::kAuto: return "auto";
        case KvDtype::kF32: return "f32";
        case KvDtype::kF16: return "f16";
        case KvDtype::kBF16: return "bf16";
        case KvDtype::kInt8: return "int8";
    }
    return "?";
}

KvDtype parse_kv_dtype(std::string_view s) {
    for (KvDtype k : {KvDtype::kAuto, KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8})
        if (s == kv_dtype_name(k)) return k;
    LATTICE_FAIL("--kv-cache-dtype \"{}\": expected auto, f32, f16, bf16 or int8", s);
}

DType resolve_kv_dtype(KvDtype k, DType activation) {
    switch (k) {
        case KvDtype::kF32: return DType::kF32;
        case KvDtype::kF16: return DType::kF16;
        case KvDtype::kBF16: return DType::kBF16;
        case KvDtype::kInt8: return DType::kI8;
        case KvDtype::kAuto: break;
    }
    return activation;
}

std::string_view op_name(Op op) {
    switch (op) {
        case Op::kEmbed: return "embed";
        case Op::kRmsNorm: return "rmsnorm";
        case Op::kAddRmsNorm: return "add_rmsnorm";
        case Op::kRope: return "rope";
        case Op::kAttention: return "attention";
        case Op::kSiluMul: return "silu_mul";
        case Op::kAdd: return "add";
        case Op::kAddBias: return "add_bias";
        case Op::kSlidingWindow: return "sliding_window attention";
        case Op::kGemm: return "gemm";
        case Op::kGemmInt8: return "gemm_int8";
        case Op::kKvCache: return "a KV cache";
        case Op::kMoe: return "mixture-of-experts routing";
        case Op::kGemmInt4: return "gemm_int4";
        case Op::kGeluTanhMul: return "gelu_tanh gated activation";
        case Op::kHeadNorm: return "per-head rmsnorm (QK-norm)";
        case Op::kScale: return "scale";
        case Op::kSoftCap: return "soft-capping";
        case Op::kAttnSoftCap: return "soft-capped attention";
    }
    return "?";
}

std::string_view activation_name(Activation a) {
    switch (a) {
        case Activation::kSilu: return "silu";
        case Activation::kGeluTanh: return "gelu_pytorch_tanh";
    }
    return "?";
}

void Backend::head_rmsnorm(const View& qkv, const AttentionShape& s, const View& q_w, const View& k_w, float eps) {
    const int64_t hd = s.head_dim, row = (s.n_heads + 2 * s.n_kv_heads) * hd;
    LATTICE_CHECK(qkv.is_contiguous() && qkv.cols() == row && q_w.numel() == hd && k_w.numel() == hd,
                  "head_rmsnorm: qkv {} for {} + 2 x {} heads of {}, weights {} {}", qkv.shape_str(), s.n_heads,
                  s.n_kv_heads, hd, q_w.shape_str(), k_w.shape_str());
    const int64_t es = dtype_size(qkv.dtype);
    for (int64_t t = 0; t < qkv.rows(); ++t) {
        char* r = static_cast<char*>(qkv.data) + t * row * es;
        const View q = View::contiguous(r, qkv.dtype, {s.n_heads, hd}, qkv.device);
        const View k = View::contiguous(r + s.n_heads * hd * es, qkv.dtype, {s.n_kv_heads, hd}, qkv.device);
        rmsnorm(q, q, q_w, eps);
        rmsnorm(k, k, k_w, eps);
    }
}

void check_copy_columns(const View& dst, int64_t col0, const View& src, Device device) {
    LATTICE_CHECK(dst.ndim == 2 && src.ndim == 2 && dst.dtype == src.dtype && dst.is_contiguous() &&
                      src.is_contiguous() && dst.rows() == src.rows() && col0 >= 0 &&
                      col0 + src.cols() <= dst.cols() && dst.device == device && src.device == device,
                  "copy_columns: {} {} into columns [{}, {}) of {} {} (same rows and dtype, contiguous, on {})",
                  dtype_name(src.dtype), src.shape_str(), col0, col0 + (src.ndim == 2 ? src.cols() : 0),
                  dtype_name(dst.dtype), dst.shape_str(), device == Device::kCuda ? "the device" : "the host");
}

}  // namespace lattice
