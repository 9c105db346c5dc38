// CudaBackend's 4-bit linears: make_linear_int4 uploads an Int4Matrix as it is (kernels/cuda/int4_gemm.h's
// device layout), and linear() sends 4-bit layers here.
//
// Storage of a 4-bit Linear:
//   weight   u8  [n, kp / 2]          the nibbles, byte for byte as the host Int4Weights holds them
//   aux      f16 [planes, n, groups]  plane 0 the scales; plane 1 the zero points as f16 (kZeroPoint) or the
//                                     minimums (kAffine); kOffset8 has one plane
//   prepared CudaInt4Layout           group, kp, kind and the act-order permutation (device i32 [k]), if any
// Bytes per weight: 0.5 + 2 (or 4) / G, the file's own size (Q4_0 / Q4_1 / AWQ / GPTQ): nothing is widened.
//
// W4A8 on CUDA runs as W4A16: the layer is made with mode kW4A16 (said once in the log). The 4-bit kernels here
// dequantize in registers against f16/bf16 activations; an int8-activation variant (dp4a per group) would read
// the same bytes, so decode, which is weight-bandwidth bound, would not get faster, only less accurate.
//
// Dispatch (m rows): m <= kInt4GemvMaxRows: the GEMV over activations in stored column order, zero-padded to kp
// (gathered into xg_ when the layer has a permutation, k is not a multiple of the group or x is misaligned);
// else the tensor-core GEMM, reading x directly, or xg_ when the layer has a permutation.
#include <cstring>
#include <memory>
#include <vector>

#include "base/convert.h"
#include "base/log.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/cuda/int4_gemm.h"
#include "runtime/backend/cuda/cuda_backend.h"

namespace lattice {
namespace {

struct CudaInt4Layout {
    int64_t kp = 0, group = 32;
    Int4Kind kind = Int4Kind::kAffine;
    Buffer perm;  // i32 [k] on the device, or empty
};

}  // namespace

Linear CudaBackend::make_linear_float_int4(const View& host_w, QuantMode mode) {
    LATTICE_CHECK(host_w.dtype == DType::kF32 || host_w.dtype == DType::kF16 || host_w.dtype == DType::kBF16,
                  "CudaBackend::make_linear: {} weights cannot be quantized to {} (f32, f16 or bf16)",
                  dtype_name(host_w.dtype), quant_mode_name(mode));
    const int64_t n = host_w.shape[0], k = host_w.shape[1];
    // the CPU backend's quantizer, a row widened at a time
    return make_linear_int4(quantize_weights_int4(host_w.data, host_w.dtype, n, k, kInt4Block).matrix(), mode);
}

Linear CudaBackend::make_linear_int4(const Int4Matrix& w, QuantMode mode) {
    LATTICE_CHECK(is_int4(mode), "CudaBackend::make_linear_int4: quant mode {} has no 4-bit weights",
                  quant_mode_name(mode));
    check_int4_matrix(w, "CudaBackend::make_linear_int4");
    LATTICE_CHECK(w.n > 0 && w.k > 0, "CudaBackend::make_linear_int4: empty 4-bit weight [{}, {}]", w.n, w.k);
    if (mode == QuantMode::kW4A8 && !w4a8_noted_) {
        LOG_INFO(
            "cuda:{}: w4a8 runs as w4a16 on CUDA (4-bit weights dequantized against {} activations; no "
            "int8-activation 4-bit kernel)",
            device_, dtype_name(act_));
        w4a8_noted_ = true;
    }
    make_current();
    const int64_t n = w.n, kp = w.k_padded(), groups = w.groups(), planes = w.kind == Int4Kind::kOffset8 ? 1 : 2;
    Linear lin;
    lin.n = n;
    lin.k = w.k;
    lin.mode = QuantMode::kW4A16;
    lin.weight_dtype = DType::kU8;
    lin.weight = alloc(DType::kU8, {n, kp / 2});
    upload(lin.weight.view(), w.qs);
    std::vector<uint16_t> meta(size_t(planes * n * groups));
    const size_t plane = size_t(n * groups);
    std::memcpy(meta.data(), w.d, plane * 2);
    if (w.kind == Int4Kind::kAffine) std::memcpy(meta.data() + plane, w.m, plane * 2);
    if (w.kind == Int4Kind::kZeroPoint)
        for (size_t i = 0; i < plane; ++i) meta[plane + i] = f32_to_f16(float(w.z[i]));  // 0..16: exact
    lin.aux = alloc(DType::kF16, {planes, n, groups});
    upload(lin.aux.view(), meta.data());
    auto layout = std::make_shared<CudaInt4Layout>();
    layout->kp = kp;
    layout->group = w.group;
    layout->kind = w.kind;
    if (w.perm) {
        layout->perm = alloc(DType::kI32, {w.k});
        upload(layout->perm.view(), w.perm);
    }
    lin.prepared_bytes = layout->perm.bytes();
    lin.prepared = std::move(layout);
    sync();  // the host vectors go out of scope
    return lin;
}

void CudaBackend::linear_int4(const View& out, const View& x, const Linear& w) {
    const auto* lay = static_cast<const CudaInt4Layout*>(w.prepared.get());
    LATTICE_CHECK(lay && w.weight_dtype == DType::kU8 && w.weight.view().ndim == 2 && w.weight.view().shape[0] == w.n &&
                      w.weight.view().shape[1] * 2 == lay->kp,
                  "CudaBackend::linear: 4-bit weight {} [{}, {}] was not made by CudaBackend::make_linear_int4",
                  w.weight.view().shape_str(), w.n, w.k);
    cuda::Int4Dev d;
    d.qs = w.weight.ptr<uint8_t>();
    d.d = w.aux.ptr<uint16_t>();
    d.a = lay->kind == Int4Kind::kOffset8 ? nullptr : d.d + w.n * (lay->kp / lay->group);
    d.affine = lay->kind == Int4Kind::kAffine;
    d.n = w.n;
    d.k = w.k;
    d.kp = lay->kp;
    d.group = lay->group;
    const int32_t* perm = lay->perm.empty() ? nullptr : lay->perm.ptr<int32_t>();
    const int64_t m = x.rows();
    const size_t es = size_t(dtype_size(act_));
    auto gathered = [&] {
        void* xg = scratch(xg_, size_t(m * d.kp) * es, "gathered 4-bit activations");
        cuda::int4_gather_rows(xg, x.data, perm, m, d.k, d.kp, act_, stream_);
        return xg;
    };
    if (m <= cuda::kInt4GemvMaxRows) {
        const bool direct = !perm && d.kp == d.k && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
        cuda::gemv_w4a16(out.data, direct ? x.data : gathered(), d, m, act_, out.dtype, stream_);
        return;
    }
    if (perm)
        cuda::gemm_w4a16(out.data, gathered(), d.kp, d, m, act_, out.dtype, stream_);
    else
        cuda::gemm_w4a16(out.data, x.data, d.k, d, m, act_, out.dtype, stream_);
}

}  // namespace lattice
