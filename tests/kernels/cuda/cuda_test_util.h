// Helpers for the CUDA tests: RAII device buffers with poisoning, host rounding to the activation
// dtype, random data, and named tolerances. Without a CUDA device the tests never start: their
// main exits 77 and CTest reports them skipped (tests/doctest_main.cpp).
#pragma once

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"

namespace lattice::test {

inline int cuda_devices() {
    static const int n = [] {
        int c = 0;
        if (cudaGetDeviceCount(&c) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return c;
    }();
    return n;
}

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// Relative L2 error tolerances per activation dtype (10-bit vs 7-bit mantissa, fp32 math).
constexpr double kTolF16 = 4e-3;
constexpr double kTolBF16 = 3e-2;
inline double tol_for(DType act) {
    return act == DType::kF16 ? kTolF16 : kTolBF16;
}

inline uint16_t to_act_bits(float f, DType act) {
    return act == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
}
inline float from_act_bits(uint16_t h, DType act) {
    return act == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}
// Rounds x through the activation dtype (what the device will see).
inline float round_act(float f, DType act) {
    return from_act_bits(to_act_bits(f, act), act);
}

inline std::vector<uint16_t> to_act(const std::vector<float>& v, DType act) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = to_act_bits(v[i], act);
    return o;
}
inline std::vector<float> from_act(const std::vector<uint16_t>& v, DType act) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = from_act_bits(v[i], act);
    return o;
}

// Fresh random data each run; the seed is printed on failure through INFO by the caller.
inline uint64_t fresh_seed() {
    static std::random_device rd;
    return (uint64_t(rd()) << 32) | rd();
}

inline std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = double(got[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
        if (!std::isfinite(got[i])) return INFINITY;  // poisoned / unwritten element
    }
    return std::sqrt(num / (den > 0 ? den : 1.0));
}

// Per-row max error: max over rows of max_j |got - ref| / max_j |ref| (a row of zeros divides by 1).
// Relative L2 over a whole tensor hides one bad row among many (a wrong head, token or output
// channel); this does not. Unwritten (NaN) elements give infinity.
inline double max_row_err(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
        double diff = 0, scale = 0;
        for (int64_t j = 0; j < cols; ++j) {
            const size_t i = size_t(r * cols + j);
            if (!std::isfinite(got[i])) return INFINITY;
            diff = std::max(diff, std::fabs(double(got[i]) - double(ref[i])));
            scale = std::max(scale, std::fabs(double(ref[i])));
        }
        worst = std::max(worst, diff / (scale > 0 ? scale : 1.0));
    }
    return worst;
}

// Per-row tolerances: one rounding of the output to the activation dtype is at most 2^-11 (f16) or
// 2^-8 (bf16) of the row's largest value; the rest is fp32 summation order.
constexpr double kRowTolF16 = 4e-3;
constexpr double kRowTolBF16 = 2e-2;
inline double row_tol_for(DType act) {
    return act == DType::kF16 ? kRowTolF16 : kRowTolBF16;
}

// Both measures against the activation dtype's tolerances (got and ref are [rows, cols]).
inline void check_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols,
                        DType act) {
    REQUIRE(got.size() == size_t(rows * cols));
    REQUIRE(ref.size() == got.size());
    const double l2 = rel_err(got, ref), row = max_row_err(got, ref, rows, cols);
    INFO("rows " << rows << " cols " << cols << ": relative L2 " << l2 << ", per-row max " << row);
    CHECK(l2 < tol_for(act));
    CHECK(row < row_tol_for(act));
}

inline bool any_nonzero(const std::vector<float>& v) {
    for (float x : v)
        if (x != 0.0f) return true;
    return false;
}

// Device buffer of `bytes`, poisoned with 0xFF (NaN for f16/bf16/f32, -1 for ints) on creation.
class DevBuf {
public:
    explicit DevBuf(size_t bytes) : bytes_(bytes) {
        REQUIRE(cudaMalloc(&p_, bytes ? bytes : 1) == cudaSuccess);
        REQUIRE(cudaMemset(p_, 0xFF, bytes ? bytes : 1) == cudaSuccess);
    }
    template <typename T>
    explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size() * sizeof(T)) {
        upload(host);
    }
    ~DevBuf() { cudaFree(p_); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;

    template <typename T>
    void upload(const std::vector<T>& host) {
        REQUIRE(host.size() * sizeof(T) <= bytes_);
        REQUIRE(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    template <typename T>
    std::vector<T> download(size_t n) const {
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<T> h(n);
        REQUIRE(n * sizeof(T) <= bytes_);
        REQUIRE(cudaMemcpy(h.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return h;
    }
    void poison() { REQUIRE(cudaMemset(p_, 0xFF, bytes_ ? bytes_ : 1) == cudaSuccess); }
    template <typename T = void>
    T* get() const {
        return static_cast<T*>(p_);
    }

private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace lattice::test
