// View: a non-owning, trivially copyable window on a tensor {data, dtype, device, shape, strides}.
// Sizes and strides are int64 elements (not bytes). Row-major: the last dimension is innermost.
// A View never frees; ownership lives in Buffer (runtime/backend/backend.h).
#pragma once

#include "base/dtype.h"
#include "base/error.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace lattice {

enum class Device : uint8_t { kCpu, kCuda };

struct View {
    static constexpr int kMaxDims = 4;

    void* data = nullptr;
    DType dtype = DType::kF32;
    Device device = Device::kCpu;
    int ndim = 0;
    std::array<int64_t, kMaxDims> shape{};
    std::array<int64_t, kMaxDims> strides{};

    static View contiguous(void* data, DType dtype, std::initializer_list<int64_t> dims, Device dev = Device::kCpu) {
        View v;
        v.data = data;
        v.dtype = dtype;
        v.device = dev;
        LATTICE_CHECK(dims.size() >= 1 && dims.size() <= kMaxDims, "View: {} dims not supported", dims.size());
        v.ndim = int(dims.size());
        int i = 0;
        for (int64_t d : dims) v.shape[i++] = d;
        int64_t s = 1;
        for (int d = v.ndim - 1; d >= 0; --d) {
            v.strides[d] = s;
            s *= v.shape[d];
        }
        return v;
    }

    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n *= shape[i];
        return n;
    }
    int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
    int64_t rows() const { return ndim <= 1 ? 1 : numel() / shape[ndim - 1]; }
    int64_t cols() const { return shape[ndim - 1]; }
    int64_t bytes() const { return dtype_bytes(dtype, numel()); }

    bool is_contiguous() const {
        int64_t s = 1;
        for (int d = ndim - 1; d >= 0; --d) {
            if (shape[d] != 1 && strides[d] != s) return false;
            s *= shape[d];
        }
        return true;
    }

    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data);
    }

    // Rows [r0, r1) of a contiguous view, viewed as [r1 - r0, cols] (leading dims flattened).
    View row_range(int64_t r0, int64_t r1) const {
        LATTICE_CHECK(is_contiguous() && r0 >= 0 && r0 <= r1 && r1 <= rows(), "View::row_range [{}, {}) of {} rows", r0,
                      r1, rows());
        View v = contiguous(static_cast<char*>(data) + dtype_bytes(dtype, r0 * cols()), dtype, {r1 - r0, cols()},
                            device);
        return v;
    }

    // Same data, new contiguous shape with the same element count.
    View reshaped(std::initializer_list<int64_t> dims) const {
        View v = contiguous(data, dtype, dims, device);
        LATTICE_CHECK(is_contiguous() && v.numel() == numel(), "View::reshaped: {} elements into {}", numel(),
                      v.numel());
        return v;
    }

    std::string shape_str() const {
        std::string s = "[";
        for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + "]";
    }
};

}  // namespace lattice
