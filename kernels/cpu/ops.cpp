// CPU kernels for the non-GEMM ops (see ops.h). Shared per-element math from kernels/common.
#include "kernels/cpu/ops.h"
#include "kernels/common/multiversion.h"

#include "kernels/common/llama_math.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>


namespace lattice::cpu {

// 16 independent partial sums: vectorizes without -ffast-math and keeps a fixed summation order.
LATTICE_MULTIVERSION float dot(const float* a, const float* b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) acc[0] += a[i] * b[i];
    float s = 0;
    for (int j = 0; j < 16; ++j) s += acc[j];
    return s;
}

LATTICE_MULTIVERSION void axpy(float* y, float a, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

LATTICE_MULTIVERSION float sum_squares(const float* x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
    for (; i < n; ++i) acc[0] += x[i] * x[i];
    float s = 0;
    for (int j = 0; j < 16; ++j) s += acc[j];
    return s;
}

namespace {
LATTICE_MULTIVERSION void scale_mul(float* out, const float* x, const float* w, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
}
LATTICE_MULTIVERSION void add_inplace(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
}  // namespace

void rmsnorm(float* out, const float* x, const float* w, int64_t m, int64_t n, float eps, ThreadPool& pool) {
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            float inv = math::rms_inv(sum_squares(x + r * n, n), n, eps);
            scale_mul(out + r * n, x + r * n, w, inv, n);
        }
    });
}

void add_rmsnorm(float* residual, const float* x, float* out, const float* w, int64_t m, int64_t n, float eps,
                 ThreadPool& pool) {
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            float* res = residual + r * n;
            add_inplace(res, x + r * n, n);
            float inv = math::rms_inv(sum_squares(res, n), n, eps);
            scale_mul(out + r * n, res, w, inv, n);
        }
    });
}

void embed(float* out, const void* table, DType dt, int64_t table_rows, int64_t n, const int32_t* ids, int64_t m,
           int64_t row_offset) {
    for (int64_t i = 0; i < m; ++i) {
        const int64_t r = int64_t(ids[i]) - row_offset;
        float* o = out + i * n;
        if (r < 0 || r >= table_rows) {
            std::memset(o, 0, size_t(n) * sizeof(float));
            continue;
        }
        switch (dt) {
            case DType::kF32: std::memcpy(o, static_cast<const float*>(table) + r * n, size_t(n) * 4); break;
            case DType::kF16: {
                const uint16_t* t = static_cast<const uint16_t*>(table) + r * n;
                for (int64_t j = 0; j < n; ++j) o[j] = f16_to_f32(t[j]);
                break;
            }
            case DType::kBF16: {
                const uint16_t* t = static_cast<const uint16_t*>(table) + r * n;
                for (int64_t j = 0; j < n; ++j) o[j] = bf16_to_f32(t[j]);
                break;
            }
            default: LATTICE_FAIL("embed: table dtype {} unsupported", dtype_name(dt));
        }
    }
}

void rope(float* qkv, int64_t m, int64_t row_stride, const int32_t* positions, int64_t n_rot_heads, int64_t hd,
          const float* inv_freq, ThreadPool& pool) {
    const int64_t half = hd / 2;
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        std::vector<math::RopeCs> cs(static_cast<size_t>(half));
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t i = 0; i < half; ++i) cs[size_t(i)] = math::rope_cos_sin(positions[r], inv_freq[i]);
            float* row = qkv + r * row_stride;
            for (int64_t h = 0; h < n_rot_heads; ++h) {
                float* v = row + h * hd;
                for (int64_t i = 0; i < half; ++i) math::rope_pair(v[i], v[i + half], cs[size_t(i)]);
            }
        }
    });
}

void silu_mul(float* out, const float* gu, int64_t m, int64_t f, ThreadPool& pool) {
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* g = gu + r * 2 * f;
            const float* u = g + f;
            float* o = out + r * f;
            for (int64_t i = 0; i < f; ++i) o[i] = math::silu(g[i]) * u[i];
        }
    });
}

void add(float* out, const float* a, const float* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * cols;
        for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    }
}

double log_sum_exp(const float* x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
        if (x[j] > mx) mx = x[j];  // NaN > mx is false: skipped
    if (mx == -INFINITY) return -INFINITY;
    double z = 0;
    for (int64_t j = 0; j < n; ++j)
        if (x[j] == x[j]) z += std::exp(double(x[j]) - double(mx));
    return double(mx) + std::log(z);
}

int32_t select_token(float* row, int64_t vocab, float temperature, int64_t top_k, float top_p, float min_p, float u,
                     const int32_t* bans, int64_t n_bans, float* logprob) {
    LATTICE_CHECK(vocab > 0, "select_token: empty row");
    auto clean = [](float v) { return v != v ? -INFINITY : v; };
    const double lse = log_sum_exp(row, vocab);
    for (int64_t b = 0; b < n_bans; ++b)
        if (bans[b] >= 0 && bans[b] < vocab) row[bans[b]] = -INFINITY;
    int64_t choice = 0;
    if (temperature == 0.0f) {
        for (int64_t j = 1; j < vocab; ++j)
            if (clean(row[j]) > clean(row[choice])) choice = j;
    } else {
        std::vector<float> x(static_cast<size_t>(vocab));
        float top = -INFINITY;
        for (int64_t j = 0; j < vocab; ++j) top = std::max(top, x[size_t(j)] = clean(row[j]) / temperature);
        float kth = -INFINITY;
        if (top_k > 0 && top_k < vocab) {
            std::vector<float> s = x;
            std::nth_element(s.begin(), s.begin() + (top_k - 1), s.end(), std::greater<float>());
            kth = s[size_t(top_k - 1)];
        }
        std::vector<double> w(size_t(vocab), 0.0);
        double mass = 0;
        for (int64_t j = 0; j < vocab; ++j) {
            if (x[size_t(j)] < kth || x[size_t(j)] == -INFINITY) continue;
            const double e = std::exp(double(x[size_t(j)]) - double(top));
            if (e >= double(min_p)) mass += (w[size_t(j)] = e);
        }
        if (top_p < 1.0f) {
            std::vector<double> s;
            for (double e : w)
                if (e > 0) s.push_back(e);
            std::sort(s.begin(), s.end(), std::greater<double>());
            double cum = 0, thr = 0;
            for (double e : s) {
                cum += e;
                thr = e;
                if (cum >= double(top_p) * mass) break;
            }
            mass = 0;
            for (double& e : w) mass += (e = e >= thr ? e : 0.0);
        }
        const double target = double(u) * mass;
        double cum = 0;
        choice = -1;
        int64_t last = 0;
        for (int64_t j = 0; j < vocab; ++j) {
            if (w[size_t(j)] <= 0) continue;
            last = j;
            cum += w[size_t(j)];
            if (cum > target) {
                choice = j;
                break;
            }
        }
        if (choice < 0) choice = last;  // rounding put the target at the very end
    }
    *logprob = float(double(row[choice]) - lse);
    return int32_t(choice);
}

}  // namespace lattice::cpu
