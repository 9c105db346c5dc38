// CudaBackend: argument checks, memory, weight preparation and metadata staging on the host;
// all compute is enqueued on stream_ through kernels/cuda (see cuda_backend.h for layouts).
#include "runtime/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "base/cuda_check.h"
#include "base/log.h"
#include "kernels/common/quantize_rows.h"
#include "kernels/cuda/gemm_lt.h"
#if defined(LATTICE_HAVE_NCCL)
#include "parallel/cuda/nccl_comm.h"
#endif

namespace lattice {
namespace {

int64_t round_up(int64_t v, int64_t m) {
    return (v + m - 1) / m * m;
}

// Row r of a contiguous host matrix [rows, k] (f32/f16/bf16) as floats.
void host_row_f32(const View& v, int64_t r, int64_t k, float* dst) {
    const char* base = static_cast<const char*>(v.data) + dtype_bytes(v.dtype, r * k);
    switch (v.dtype) {
        case DType::kF32:
            std::memcpy(dst, base, size_t(k) * 4);
            break;
        case DType::kF16:
            for (int64_t j = 0; j < k; ++j) dst[j] = f16_to_f32(reinterpret_cast<const uint16_t*>(base)[j]);
            break;
        case DType::kBF16:
            for (int64_t j = 0; j < k; ++j) dst[j] = bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[j]);
            break;
        default:
            LATTICE_FAIL("host weight dtype {} (expected f32, f16 or bf16)", dtype_name(v.dtype));
    }
}

View like(void* p, DType dt, const View& shape_src) {
    View v;
    v.data = p;
    v.dtype = dt;
    v.device = Device::kCuda;
    v.ndim = shape_src.ndim;
    int64_t s = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
        v.shape[d] = shape_src.shape[d];
        v.strides[d] = s;
        s *= v.shape[d];
    }
    return v;
}

}  // namespace

CudaBackend::CudaBackend(int device, DType act) : device_(device), act_(act) {
    LATTICE_CHECK(act == DType::kF16 || act == DType::kBF16, "CudaBackend: activation dtype {} (expected f16 or bf16)",
                  dtype_name(act));
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    LATTICE_CHECK(device >= 0 && device < count, "CudaBackend: device {} requested, {} visible", device, count);
    CUDA_CHECK(cudaSetDevice(device));
    if (process_identity().device < 0) process_identity().device = device;
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    device_name_ = prop.name;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&meta_event_, cudaEventDisableTiming));
    lt_ = std::make_unique<cuda::LtGemm>();
}

CudaBackend::~CudaBackend() {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : op_events_) cudaEventDestroy(e);
    for (Scratch* s : {&xq_, &sx_, &acc_, &attn_ws_, &ids_out_, &params_, &select_, &xg_})
        if (s->p) cudaFree(s->p);
    lt_.reset();
    for (void* p : retired_dev_) cudaFree(p);
    for (void* p : retired_host_) cudaFreeHost(p);
    if (meta_host_) cudaFreeHost(meta_host_);
    if (meta_dev_) cudaFree(meta_dev_);
    if (meta_event_) cudaEventDestroy(meta_event_);
    if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
    return fmt::format("cuda:{} ({}, {})", device_, device_name_, dtype_name(act_));
}

bool CudaBackend::supports(Op op, DType dtype) const {
    switch (op) {
        case Op::kEmbed:
            return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
        case Op::kGemm:
            return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
        case Op::kGemmInt8:
            return dtype == DType::kI8;
        case Op::kGemmInt4:  // 4-bit weights (Linear::weight_dtype u8): W4A16, W4A8 made as W4A16
            return dtype == DType::kU8;
        case Op::kRmsNorm:
        case Op::kAddRmsNorm:
        case Op::kRope:
        case Op::kKvCache:  // the activation dtype, or int8 (AttnDims::kv_int8)
            return dtype == act_ || dtype == DType::kI8;
        case Op::kAttention:
        case Op::kSiluMul:
        case Op::kAdd:
        case Op::kAddBias:        // q/k/v biases (qwen2)
        case Op::kSlidingWindow:  // AttnDims::window in both attention kernels (mistral)
        case Op::kMoe:            // gather / scatter-add rows, fill_zero (mixtral)
        case Op::kGeluTanhMul:    // GeGLU (gemma)
        case Op::kHeadNorm:       // QK-norm (qwen3, gemma3)
        case Op::kScale:          // the embedding scale (gemma)
        case Op::kSoftCap:        // the final logits' soft-cap (gemma2), f32 logits too
        case Op::kAttnSoftCap:    // AttnDims::softcap in the attention kernels (gemma2)
            return dtype == act_;
    }
    return false;
}

void CudaBackend::make_current() const {
    CUDA_CHECK(cudaSetDevice(device_));
}

Buffer CudaBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
    LATTICE_CHECK(!capturing_, "CudaBackend::alloc during graph capture");
    View v = View::contiguous(nullptr, dtype, shape, Device::kCuda);
    LATTICE_CHECK(v.numel() >= 0, "CudaBackend::alloc: negative shape {}", v.shape_str());
    const size_t bytes = size_t(std::max<int64_t>(v.bytes(), 1));
    make_current();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        LATTICE_FAIL("cudaMalloc of {} bytes for a {} {} tensor on device {}: {} ({} MiB free of {} MiB)", bytes,
                     dtype_name(dtype), v.shape_str(), device_, cudaGetErrorString(e), free_b >> 20, total_b >> 20);
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));  // ordered before any later op on stream_
    v.data = p;
    return Buffer(this, v);
}

void CudaBackend::free_memory(void* p) {
    const cudaError_t e = cudaFree(p);  // never throws: called from destructors
    if (e != cudaSuccess) LOG_ERROR("cudaFree on device {}: {}", device_, cudaGetErrorString(e));
}

void CudaBackend::upload(const View& dst, const void* host_src) {
    LATTICE_CHECK(dst.device == Device::kCuda && !capturing_, "CudaBackend::upload: destination must be a device view");
    CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, size_t(dst.bytes()), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(void* host_dst, const View& src) {
    LATTICE_CHECK(src.device == Device::kCuda, "CudaBackend::download: source must be a device view");
    LATTICE_CHECK(!capturing_, "CudaBackend::download during graph capture");
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, size_t(src.bytes()), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::sync() {
    LATTICE_CHECK(!capturing_, "CudaBackend::sync during graph capture");
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(const View& dst, const View& src) {
    LATTICE_CHECK(dst.device == Device::kCuda && src.device == Device::kCuda && dst.dtype == src.dtype &&
                      dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(),
                  "CudaBackend::copy: {} {} <- {} {} (same dtype and size, contiguous, on the device)",
                  dtype_name(dst.dtype), dst.shape_str(), dtype_name(src.dtype), src.shape_str());
    if (dst.data != src.data && dst.bytes() > 0)
        CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, size_t(dst.bytes()), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_columns(const View& dst, int64_t col0, const View& src) {
    check_copy_columns(dst, col0, src, Device::kCuda);
    const size_t es = size_t(dtype_size(dst.dtype));
    if (src.numel() == 0) return;
    make_current();
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + size_t(col0) * es, size_t(dst.cols()) * es, src.data,
                                 size_t(src.cols()) * es, size_t(src.cols()) * es, size_t(src.rows()),
                                 cudaMemcpyDeviceToDevice, stream_));
}

int64_t CudaBackend::memory_available() const {
    make_current();
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return int64_t(free_b);
}

std::unique_ptr<Communicator> CudaBackend::make_group_comm(Communicator& host, const std::string& name,
                                                           double timeout_s) {
    if (host.size() == 1) return nullptr;
#if defined(LATTICE_HAVE_NCCL)
    auto comm = std::make_unique<NcclComm>(host, stream_, device_, name, timeout_s);
    // The TP group's all-reduces queue on the compute stream with no host wait; the model waits
    // (bounded) once per step (Model::run_layers, Model::head_logits). Pipeline hand-offs keep
    // their per-call bounded wait: a stage may have no TP group to find a dead peer with.
    if (name == "tp") comm->set_wait_mode(NcclComm::WaitMode::kDeferred);
    return comm;
#else
    LATTICE_FAIL("{} group of {} ranks on CUDA needs NCCL, which this build lacks (reconfigure where nccl.h and "
                 "libnccl are found)",
                 name, host.size());
#endif
}

void* CudaBackend::scratch(Scratch& s, size_t bytes, const char* what) {
    if (bytes <= s.bytes) return s.p;
    LATTICE_CHECK(!capturing_,
                  "CudaBackend: scratch '{}' must grow to {} bytes during graph capture; run one eager step of "
                  "this batch size before capturing it",
                  what, bytes);
    const size_t want = std::max(bytes, 2 * s.bytes);  // doubling: retired buffers sum to < the live one
    if (s.p) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (graphs_ > 0)
            retired_dev_.push_back(s.p);  // a captured graph may still use it
        else
            CUDA_CHECK(cudaFree(s.p));
        s = Scratch{};
    }
    CUDA_CHECK(cudaMalloc(&s.p, want));
    s.bytes = want;
    return s.p;
}

void CudaBackend::check_act(const View& v, const char* op, const char* what) const {
    LATTICE_CHECK(v.device == Device::kCuda && v.dtype == act_ && v.is_contiguous() && v.data,
                  "CudaBackend::{}: {} must be a contiguous {} device tensor (got {} {} on {})", op, what,
                  dtype_name(act_), dtype_name(v.dtype), v.shape_str(), v.device == Device::kCuda ? "cuda" : "cpu");
}

// ---- weights ----
Linear CudaBackend::make_linear(const View& host_w, QuantMode mode) {
    LATTICE_CHECK(host_w.device == Device::kCpu && host_w.ndim == 2 && host_w.is_contiguous(),
                  "CudaBackend::make_linear: expected a contiguous host [n, k] matrix, got {}", host_w.shape_str());
    if (is_int4(mode)) return make_linear_float_int4(host_w, mode);
    const int64_t n = host_w.shape[0], k = host_w.shape[1];
    Linear lin;
    lin.n = n;
    lin.k = k;
    lin.mode = mode;
    std::vector<float> row(static_cast<size_t>(k));
    if (mode == QuantMode::kNone) {
        lin.weight_dtype = act_;
        std::vector<uint16_t> w(size_t(n * k));
        for (int64_t i = 0; i < n; ++i) {
            if (host_w.dtype == act_) {
                std::memcpy(&w[size_t(i * k)], static_cast<const uint16_t*>(host_w.data) + i * k, size_t(k) * 2);
                continue;
            }
            host_row_f32(host_w, i, k, row.data());
            for (int64_t j = 0; j < k; ++j)
                w[size_t(i * k + j)] = act_ == DType::kF16 ? f32_to_f16(row[size_t(j)]) : f32_to_bf16(row[size_t(j)]);
        }
        lin.weight = alloc(act_, {n, k});
        upload(lin.weight.view(), w.data());
        sync();
        return lin;
    }
    // int8 modes: symmetric per output channel, the rows of kernels/common/quantize_rows.h (the CPU's bits, its
    // refusal of a non-finite weight), then the pre-quantized path. The rows are spread over the host's cores:
    // a 70B-class layer holds 856 M weights (seconds on one).
    LATTICE_CHECK(host_w.dtype == DType::kF32 || host_w.dtype == DType::kF16 || host_w.dtype == DType::kBF16,
                  "CudaBackend::make_linear: host weight dtype {} (expected f32, f16 or bf16)",
                  dtype_name(host_w.dtype));
    std::vector<int8_t> q(size_t(n * k));
    std::vector<float> scales(static_cast<size_t>(n));
    const int64_t threads =
        std::clamp<int64_t>(n * k / (int64_t(1) << 22), 1, std::min<int64_t>(16, std::thread::hardware_concurrency()));
    std::vector<int64_t> first_bad(size_t(threads), n);
    auto rows = [&](int64_t t) {
        first_bad[size_t(t)] = quantize_rows_int8(host_w.data, host_w.dtype, k, n * t / threads, n * (t + 1) / threads,
                                                  q.data(), scales.data());
    };
    std::vector<std::thread> workers;
    for (int64_t t = 1; t < threads; ++t) workers.emplace_back(rows, t);
    rows(0);
    for (auto& th : workers) th.join();
    for (int64_t t = 0; t < threads; ++t)  // the ranges in order: the first bad range's first row is the matrix's
        if (first_bad[size_t(t)] < n * (t + 1) / threads)
            fail_non_finite_row(host_w.data, host_w.dtype, k, first_bad[size_t(t)], "CudaBackend::make_linear");
    return make_linear_int8(View::contiguous(q.data(), DType::kI8, {n, k}),
                            View::contiguous(scales.data(), DType::kF32, {n}), mode);
}

Linear CudaBackend::make_linear_int8(const View& host_q, const View& host_scales, QuantMode mode) {
    LATTICE_CHECK(host_q.device == Device::kCpu && host_q.ndim == 2 && host_q.is_contiguous() &&
                      host_q.dtype == DType::kI8,
                  "CudaBackend::make_linear_int8: expected contiguous host i8 [n, k] weights, got {} {}",
                  dtype_name(host_q.dtype), host_q.shape_str());
    LATTICE_CHECK(mode != QuantMode::kNone, "CudaBackend::make_linear_int8: quant mode none has no int8 weights");
    const int64_t n = host_q.shape[0], k = host_q.shape[1];
    LATTICE_CHECK(host_scales.device == Device::kCpu && host_scales.dtype == DType::kF32 &&
                      host_scales.numel() == n && host_scales.is_contiguous(),
                  "CudaBackend::make_linear_int8: scales must be host f32 [{}], got {} {}", n,
                  dtype_name(host_scales.dtype), host_scales.shape_str());
    // Zero padded to multiples of 16 (IMMA / GEMV loads); padding rows have scale 0.
    const int64_t n_pad = round_up(n, 16), k_pad = round_up(k, 16);
    std::vector<int8_t> q(size_t(n_pad * k_pad), 0);
    std::vector<float> scales(size_t(n_pad), 0.0f);
    const auto* src = static_cast<const int8_t*>(host_q.data);
    const auto* src_scales = static_cast<const float*>(host_scales.data);
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&q[size_t(i * k_pad)], src + i * k, size_t(k));
        scales[size_t(i)] = src_scales[i];
    }
    Linear lin;
    lin.n = n;
    lin.k = k;
    lin.mode = mode;
    lin.weight_dtype = DType::kI8;
    lin.weight = alloc(DType::kI8, {n_pad, k_pad});
    lin.scales = alloc(DType::kF32, {n_pad});
    upload(lin.weight.view(), q.data());
    upload(lin.scales.view(), scales.data());
    sync();
    return lin;
}

Linear CudaBackend::make_random_linear(int64_t n, int64_t k, QuantMode mode, uint64_t seed) {
    LATTICE_CHECK(n > 0 && k > 0, "CudaBackend::make_random_linear: shape [{}, {}]", n, k);
    LATTICE_CHECK(!is_int4(mode), "CudaBackend::make_random_linear: no random 4-bit weights ({} [{}, {}]); use "
                  "make_linear with host weights", quant_mode_name(mode), n, k);
    Linear lin;
    lin.n = n;
    lin.k = k;
    lin.mode = mode;
    const float wscale = 1.0f / std::sqrt(float(k));  // keeps activations O(1) through the layers
    if (mode == QuantMode::kNone) {
        lin.weight_dtype = act_;
        lin.weight = alloc(act_, {n, k});
        cuda::fill_random(lin.weight.data(), act_, n * k, seed, wscale, stream_);
    } else {
        const int64_t n_pad = round_up(n, 16), k_pad = round_up(k, 16);
        lin.weight_dtype = DType::kI8;
        lin.weight = alloc(DType::kI8, {n_pad, k_pad});
        lin.scales = alloc(DType::kF32, {n_pad});
        // Padding must stay zero: fill row by row only when k is padded.
        if (k_pad == k) {
            cuda::fill_random(lin.weight.data(), DType::kI8, n * k, seed, 0.0f, stream_);
        } else {
            for (int64_t i = 0; i < n; ++i)
                cuda::fill_random(lin.weight.ptr<int8_t>() + i * k_pad, DType::kI8, k, seed + uint64_t(i) * 7919u, 0.0f,
                                  stream_);
        }
        std::vector<float> scales(size_t(n_pad), 0.0f);
        std::fill(scales.begin(), scales.begin() + n, wscale / 127.0f);
        upload(lin.scales.view(), scales.data());
    }
    sync();
    return lin;
}

// ---- per-op timing (benchmarks) ----
void CudaBackend::set_op_timing(bool on) {
    LATTICE_CHECK(!capturing_, "CudaBackend::set_op_timing during graph capture");
    op_timing_ = on;
}

std::vector<std::pair<std::string, double>> CudaBackend::op_times() {
    std::vector<std::pair<std::string, double>> out;
    if (!op_records_.empty()) CUDA_CHECK(cudaEventSynchronize(op_records_.back().end));
    for (const OpRecord& r : op_records_) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.end));
        out.emplace_back(r.name, double(ms) * 1e3);
    }
    op_records_.clear();
    op_events_used_ = 0;
    return out;
}

CudaBackend::OpTimer::OpTimer(CudaBackend& be, const char* op, QuantMode mode, int64_t n, int64_t k, int64_t m) {
    if (!be.op_timing_ || be.capturing_) return;
    be_ = &be;
    while (be.op_events_.size() < be.op_events_used_ + 2) {
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreate(&e));
        be.op_events_.push_back(e);
    }
    OpRecord r;
    r.name = n > 0 ? fmt::format("{} {} {}x{} m={}", op, quant_mode_name(mode), n, k, m) : std::string(op);
    r.start = be.op_events_[be.op_events_used_++];
    r.end = be.op_events_[be.op_events_used_++];
    CUDA_CHECK(cudaEventRecord(r.start, be.stream_));
    be.op_records_.push_back(std::move(r));
}

CudaBackend::OpTimer::~OpTimer() {
    if (be_) cudaEventRecord(be_->op_records_.back().end, be_->stream_);  // never throws: a destructor
}

Buffer CudaBackend::make_f32(const View& host) {
    LATTICE_CHECK(host.device == Device::kCpu && host.is_contiguous(), "CudaBackend::make_f32: expected a host tensor");
    const int64_t cols = host.cols(), rows = host.rows();
    std::vector<float> f(size_t(host.numel()));
    for (int64_t r = 0; r < rows; ++r) host_row_f32(host, r, cols, &f[size_t(r * cols)]);
    make_current();
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(f.size() * 4, 1)));
    Buffer b(this, like(p, DType::kF32, host));
    upload(b.view(), f.data());
    sync();
    return b;
}

Buffer CudaBackend::make_table(const View& host) {
    LATTICE_CHECK(host.device == Device::kCpu && host.is_contiguous() && host.ndim == 2 &&
                      (host.dtype == DType::kF32 || host.dtype == DType::kF16 || host.dtype == DType::kBF16),
                  "CudaBackend::make_table: expected a host [v, h] f32/f16/bf16 table, got {} {}",
                  dtype_name(host.dtype), host.shape_str());
    make_current();
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(size_t(host.bytes()), 1)));
    Buffer b(this, like(p, host.dtype, host));
    upload(b.view(), host.data);
    sync();
    return b;
}

}  // namespace lattice
