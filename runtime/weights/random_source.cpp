// RandomSource implementation (see random_source.h).
#include "runtime/weights/random_source.h"

#include "base/error.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace lattice {

namespace {

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

class RandomSource final : public TensorSource {
public:
    RandomSource(const ModelConfig& cfg, uint64_t seed, DType dt) : cfg_(cfg), seed_(seed), dtype_(dt) {
        cfg_.validate();
        const int64_t H = cfg.hidden;
        for (ExpectedTensor& t : expected_tensors(cfg)) {
            double scale = 1.0 / std::sqrt(double(H));  // q, k, v, gate, up, the LM head
            switch (t.role) {
                case TensorRole::kEmbed: scale = 1.0; break;
                case TensorRole::kFinalNorm:
                case TensorRole::kAttnNorm:
                case TensorRole::kFfnNorm: scale = 0.0; break;  // 1 + 0.1 u
                case TensorRole::kBq:
                case TensorRole::kBk:
                case TensorRole::kBv: scale = 0.1; break;
                case TensorRole::kWo: scale = 1.0 / std::sqrt(double(cfg.q_dim())); break;
                case TensorRole::kWDown:
                case TensorRole::kExpDown: scale = 1.0 / std::sqrt(double(cfg.intermediate)); break;
                default: break;
            }
            add(t.name, std::move(t.shape), scale);
        }
    }

    const ModelConfig& config() const override { return cfg_; }
    bool has(const std::string& name) const override { return tensors_.count(name) != 0; }
    const TensorInfo& info(const std::string& name) const override { return at(name).info; }
    std::string describe() const override { return "random weights (seed " + std::to_string(seed_) + ")"; }
    int64_t total_bytes() const override {
        int64_t b = 0;
        for (auto& [n, t] : tensors_) {
            int64_t e = 1;
            for (int64_t d : t.info.shape) e *= d;
            b += e * dtype_size(dtype_);
        }
        return b;
    }

    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out,
              void* dst) const override {
        const Tensor& t = at(name);
        LATTICE_CHECK(row0 >= 0 && row0 + rows <= t.info.rows() && col0 >= 0 && col0 + cols <= t.info.cols(),
                      "random source: slice out of range for {}", name);
        const uint64_t base = splitmix64(seed_ ^ t.key);
        auto fill_rows = [&](int64_t r_lo, int64_t r_hi) {
            std::vector<float> row(static_cast<size_t>(cols));
            for (int64_t r = r_lo; r < r_hi; ++r) {
                const uint64_t rk = splitmix64(base + uint64_t(row0 + r));
                for (int64_t c = 0; c < cols; ++c) {
                    const uint64_t h = splitmix64(rk + uint64_t(col0 + c));
                    const float u = float(int64_t(h >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));  // [-1, 1)
                    float v = t.scale == 0.0 ? 1.0f + 0.1f * u : float(t.scale) * u;
                    // Round through the storage dtype so every reader sees the stored value.
                    if (dtype_ == DType::kBF16) v = bf16_to_f32(f32_to_bf16(v));
                    if (dtype_ == DType::kF16) v = f16_to_f32(f32_to_f16(v));
                    row[size_t(c)] = v;
                }
                convert_elements(row.data(), DType::kF32, static_cast<uint8_t*>(dst) + r * cols * dtype_size(out),
                                 out, cols);
            }
        };
        // Large slices (the 70B shapes of the GPU benchmarks: seconds per layer on one thread) are
        // split by rows over the machine's cores (>= 1 Mi elements each); every element is still the
        // same pure function, so the result does not depend on the split.
        const int64_t min_rows = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(cols, 1));
        const int64_t n_threads = std::min<int64_t>(
            {int64_t(std::max(1u, std::thread::hardware_concurrency())), 32, rows / min_rows});
        if (n_threads <= 1) {
            fill_rows(0, rows);
            return;
        }
        std::vector<std::thread> pool;
        std::vector<std::exception_ptr> errors(static_cast<size_t>(n_threads));
        for (int64_t i = 0; i < n_threads; ++i)
            pool.emplace_back([&, i] {
                try {
                    fill_rows(rows * i / n_threads, rows * (i + 1) / n_threads);
                } catch (...) {
                    errors[size_t(i)] = std::current_exception();
                }
            });
        for (auto& th : pool) th.join();
        for (auto& e : errors)
            if (e) std::rethrow_exception(e);
    }

private:
    struct Tensor {
        TensorInfo info;
        uint64_t key = 0;
        double scale = 0;
    };
    void add(const std::string& name, std::vector<int64_t> shape, double scale) {
        Tensor t;
        t.info.name = name;
        t.info.dtype = dtype_;
        t.info.shape = std::move(shape);
        t.info.file = "<random>";
        t.key = hash_name(name);
        t.scale = scale;
        tensors_[name] = std::move(t);
    }
    const Tensor& at(const std::string& name) const {
        auto it = tensors_.find(name);
        LATTICE_CHECK(it != tensors_.end(), "random source: no tensor \"{}\"", name);
        return it->second;
    }

    ModelConfig cfg_;
    uint64_t seed_;
    DType dtype_;
    std::map<std::string, Tensor> tensors_;
};

}  // namespace

std::unique_ptr<TensorSource> make_random_source(const ModelConfig& cfg, uint64_t seed, DType dtype) {
    LATTICE_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                  "random weights: dtype {} unsupported", dtype_name(dtype));
    return std::make_unique<RandomSource>(cfg, seed, dtype);
}

}  // namespace lattice
