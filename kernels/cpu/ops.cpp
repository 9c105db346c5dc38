// CPU kernels for the non-GEMM ops (see ops.h). Shared per-element math from kernels/common.
// The vector loops are always-inline bodies (*_body) compiled for each ISA variant by LATTICE_ISA_VARIANTS
// (isa_variants.h); each op picks its variant once per call from detect_isa() and records it
// (KernelFamily::kElementwise).
#include "kernels/cpu/ops.h"
#include "kernels/cpu/isa_variants.h"

#include "kernels/common/fast_exp.h"
#include "kernels/common/llama_math.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

namespace lattice::cpu {

namespace {

// 16 independent partial sums: vectorizes without -ffast-math and keeps a fixed summation order.
[[gnu::always_inline]] inline float dot_body(const float* a, const float* b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) acc[0] += a[i] * b[i];
    float s = 0;
    for (int j = 0; j < 16; ++j) s += acc[j];
    return s;
}

[[gnu::always_inline]] inline void axpy_body(float* y, float a, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

[[gnu::always_inline]] inline float sum_squares_body(const float* x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
    for (; i < n; ++i) acc[0] += x[i] * x[i];
    float s = 0;
    for (int j = 0; j < 16; ++j) s += acc[j];
    return s;
}

[[gnu::always_inline]] inline void scale_mul_body(float* out, const float* x, const float* w, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
}
[[gnu::always_inline]] inline void add_inplace_body(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Row loops of the decode step that GCC does not vectorize as scalar code: silu_mul's libm exp and the
// sampling's passes over the whole vocabulary row (49152 logits for the built-in model). They run on 16-float
// vector values (GCC vector extensions: one zmm, two ymm or four xmm registers, the same operations per
// lane on every ISA variant; without -ffast-math GCC vectorizes no float reduction written as a scalar
// loop). Loaded with memcpy (no alignment assumed).
using F16x = float __attribute__((vector_size(64)));
using I16x = int32_t __attribute__((vector_size(64)));
[[gnu::always_inline]] inline F16x load16(const float* p) {
    F16x v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
// silu(g) * u = g * sigmoid(g) * u, sigmoid from t = e^-|g| by exp_neg (never overflows): 1 / (1 + t) for
// g >= 0, t / (1 + t) below; relative error a few 1e-7 against the libm form (math::silu), which costs a
// libm call per element: 30 of these rows per decoded token of the built-in model took 4% of its time.
// The same template on 16 lanes and on the tail's one-lane vectors.
template <class F, class I>
[[gnu::always_inline]] inline F silu_lanes(F g, F u) {
    const F t = exp_neg_lanes<F, I>(g < 0.0f ? g : -g);
    const F s = g >= 0.0f ? 1.0f / (1.0f + t) : t / (1.0f + t);
    return g * s * u;
}
using F1x = float __attribute__((vector_size(4)));
using I1x = int32_t __attribute__((vector_size(4)));
[[gnu::always_inline]] inline void silu_mul_row_body(float* o, const float* g, const float* u, int64_t f) {
    int64_t i = 0;
    for (; i + 16 <= f; i += 16) {
        const F16x r = silu_lanes<F16x, I16x>(load16(g + i), load16(u + i));
        std::memcpy(o + i, &r, sizeof r);
    }
    for (; i < f; ++i) o[i] = silu_lanes<F1x, I1x>(F1x{g[i]}, F1x{u[i]})[0];
}

// The lanes' maxima (NaN skipped: NaN > m is false), then the sum of exp(x - max) by exp_neg
// (kernels/common/fast_exp.h, relative error < 2e-7; NaN and -inf add 0), each lane's partial sums in float
// over 1024 entries at most, folded into a double.
[[gnu::always_inline]] inline double log_sum_exp_body(const float* x, int64_t n) {
    F16x m = F16x{} - INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const F16x v = load16(x + i);
        m = v > m ? v : m;
    }
    float mx = -INFINITY;
    for (int l = 0; l < 16; ++l) mx = m[l] > mx ? m[l] : mx;
    for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY || mx == INFINITY) return mx;
    double z = 0;
    for (int64_t c = 0; c < n; c += 1024) {
        const int64_t end = std::min(n, c + 1024);
        F16x acc = F16x{};
        int64_t j = c;
        for (; j + 16 <= end; j += 16) {
            const F16x v = load16(x + j);
            const F16x e = exp_neg_lanes<F16x, I16x>(v - mx);
            acc += v > -INFINITY ? e : F16x{};  // NaN > -inf is false too
        }
        float tail = 0.0f;
        for (; j < end; ++j) tail += x[j] > -INFINITY ? exp_neg(x[j] - mx) : 0.0f;
        for (int l = 0; l < 16; ++l) z += double(acc[l]);
        z += double(tail);
    }
    return double(mx) + std::log(z);
}

// One pass on 16 lanes: each lane's largest entry and where it first occurs (strict >, so NaN never
// wins), then the lanes' largest value at its lowest index.
[[gnu::always_inline]] inline int64_t argmax_body(const float* x, int64_t n) {
    F16x m = F16x{} - INFINITY;
    I16x at = I16x{} + INT32_MAX;
    I16x idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16, idx += 16) {
        const F16x v = load16(x + i);
        const I16x more = v > m;
        m = more ? v : m;
        at = more ? idx : at;
    }
    float best = -INFINITY;
    int64_t where = INT64_MAX;
    for (int l = 0; l < 16; ++l)
        if (m[l] > best || (m[l] == best && at[l] < where)) {
            best = m[l];
            where = at[l];
        }
    for (; i < n; ++i)
        if (x[i] > best) {
            best = x[i];
            where = i;
        }
    return where == INT64_MAX || best == -INFINITY ? 0 : where;
}

LATTICE_ISA_VARIANTS(float, dot_body, (const float* a, const float* b, int64_t n), (a, b, n))
LATTICE_ISA_VARIANTS(void, axpy_body, (float* y, float a, const float* x, int64_t n), (y, a, x, n))
LATTICE_ISA_VARIANTS(float, sum_squares_body, (const float* x, int64_t n), (x, n))
LATTICE_ISA_VARIANTS(void, scale_mul_body, (float* out, const float* x, const float* w, float s, int64_t n),
                     (out, x, w, s, n))
LATTICE_ISA_VARIANTS(void, add_inplace_body, (float* y, const float* x, int64_t n), (y, x, n))
LATTICE_ISA_VARIANTS(void, silu_mul_row_body, (float* o, const float* g, const float* u, int64_t f), (o, g, u, f))
LATTICE_ISA_VARIANTS(double, log_sum_exp_body, (const float* x, int64_t n), (x, n))
LATTICE_ISA_VARIANTS(int64_t, argmax_body, (const float* x, int64_t n), (x, n))

// The level of this call's vector loops, recorded.
IsaLevel vec_level() {
    const IsaLevel l = vector_level(detect_isa());
    note_path(KernelFamily::kElementwise, l);
    return l;
}

}  // namespace

float dot(const float* a, const float* b, int64_t n) { return dot_body_variants.at(vec_level())(a, b, n); }
void axpy(float* y, float a, const float* x, int64_t n) { axpy_body_variants.at(vec_level())(y, a, x, n); }
float sum_squares(const float* x, int64_t n) { return sum_squares_body_variants.at(vec_level())(x, n); }
double log_sum_exp(const float* x, int64_t n) { return log_sum_exp_body_variants.at(vec_level())(x, n); }
int64_t argmax(const float* x, int64_t n) { return argmax_body_variants.at(vec_level())(x, n); }

void rmsnorm(float* out, const float* x, const float* w, int64_t m, int64_t n, float eps, ThreadPool& pool) {
    const IsaLevel l = vec_level();
    const auto sum_squares = sum_squares_body_variants.at(l);
    const auto scale_mul = scale_mul_body_variants.at(l);
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            float inv = math::rms_inv(sum_squares(x + r * n, n), n, eps);
            scale_mul(out + r * n, x + r * n, w, inv, n);
        }
    });
}

void add_rmsnorm(float* residual, const float* x, float* out, const float* w, int64_t m, int64_t n, float eps,
                 ThreadPool& pool) {
    const IsaLevel l = vec_level();
    const auto sum_squares = sum_squares_body_variants.at(l);
    const auto scale_mul = scale_mul_body_variants.at(l);
    const auto add_inplace = add_inplace_body_variants.at(l);
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
    const auto silu_mul_row = silu_mul_row_body_variants.at(vec_level());
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) silu_mul_row(out + r * f, gu + r * 2 * f, gu + r * 2 * f + f, f);
    });
}

void gelu_tanh_mul(float* out, const float* gu, int64_t m, int64_t f, ThreadPool& pool) {
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float *g = gu + r * 2 * f, *u = g + f;
            float* o = out + r * f;
            for (int64_t j = 0; j < f; ++j) o[j] = math::gelu_tanh(g[j]) * u[j];
        }
    });
}

void head_rmsnorm(float* qkv, int64_t m, int64_t row_stride, int64_t nq, int64_t nkv, int64_t hd, const float* q_w,
                  const float* k_w, float eps, ThreadPool& pool) {
    const IsaLevel l = vec_level();
    const auto sum_squares = sum_squares_body_variants.at(l);
    const auto scale_mul = scale_mul_body_variants.at(l);
    const int64_t heads = nq + nkv;
    pool.parallel_for(m * heads, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t h = i % heads;
            float* x = qkv + (i / heads) * row_stride + h * hd;
            const float inv = math::rms_inv(sum_squares(x, hd), hd, eps);
            scale_mul(x, x, h < nq ? q_w : k_w, inv, hd);
        }
    });
}

void scale(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void softcap(float* x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; ++i) x[i] = math::softcap(x[i], cap);
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

int32_t select_token(float* row, int64_t vocab, float temperature, int64_t top_k, float top_p, float min_p, float u,
                     const int32_t* bans, int64_t n_bans, float* logprob) {
    LATTICE_CHECK(vocab > 0, "select_token: empty row");
    auto clean = [](float v) { return v != v ? -INFINITY : v; };
    const double lse = log_sum_exp(row, vocab);
    for (int64_t b = 0; b < n_bans; ++b)
        if (bans[b] >= 0 && bans[b] < vocab) row[bans[b]] = -INFINITY;
    int64_t choice = 0;
    if (temperature == 0.0f) {
        choice = argmax(row, vocab);  // NaN as -inf, lowest id on ties
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
