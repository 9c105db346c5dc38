// Token selection on the device, one block per row of logits [m, vocab] (f32/f16/bf16):
//   argmax: lowest index among the maxima (NaN counts as -inf).
//   sample: softmax(logits / T) restricted to the top-k, then to the smallest top-p mass, then an
//           inverse-CDF pick in index order with the caller's uniform draw u. No sort: the k-th
//           largest logit and the top-p probability threshold are found by a 32-step bitwise
//           search over the order-preserving integer image of the floats (counting / summing
//           the elements at or above each candidate), so elements tied with a threshold are kept.
// The CPU reference in tests/cuda mirrors this algorithm step by step.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

constexpr int kThreads = 512;

// Monotone map float -> uint32 (larger float, larger key); NaN maps below -inf.
__device__ __forceinline__ uint32_t order_key(float f) {
    if (f != f) return 0u;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Lowest index among the maxima of `row` (NaN as -inf), every thread of the block calling it;
// the result is valid in thread 0. sv / si: shared arrays of blockDim.x entries.
template <typename U>
__device__ int64_t argmax_row(const U* row, int64_t vocab, float* sv, int64_t* si) {
    float best = -INFINITY;
    int64_t bi = vocab;  // sentinel larger than any index
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        float v = to_f32(row[j]);
        if (v != v) v = -INFINITY;
        if (v > best || (bi == vocab && v == best)) {
            best = v;
            bi = j;
        }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (int(threadIdx.x) < s) {
            const float ov = sv[threadIdx.x + s];
            const int64_t oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    return si[0] == vocab ? 0 : si[0];
}

template <typename U>
__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t* out, const U* logits, int64_t vocab) {
    __shared__ float sv[kThreads];
    __shared__ int64_t si[kThreads];
    const int64_t c = argmax_row(logits + int64_t(blockIdx.x) * vocab, vocab, sv, si);
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(c);
}

// The shared memory one row's selection works in.
struct RowShared {
    float scratch[32];
    float chunk_sum[kThreads];
    int picked_thread;
};

// Samples one index of `row` (every thread of the block calls it): softmax(x / T) over the top-k,
// then the top-p mass, then p >= min_p * p_max; inverse CDF in index order with the draw u.
// Returns the pick in the thread that found it and -1 in every other thread.
template <typename U>
__device__ int64_t sample_row(const U* row, int64_t vocab, float temperature, int32_t top_k, float top_p, float min_p,
                              float u, RowShared& sh) {
    const float inv_t = 1.0f / temperature;
    auto x_at = [&](int64_t j) {
        const float v = to_f32(row[j]) * inv_t;
        return v != v ? -INFINITY : v;
    };
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, x_at(j));
    mx = block_max(mx, sh.scratch);

    // Top-k: largest key K with count(key >= K) >= k.
    uint32_t kmin = 0;
    if (top_k > 0 && top_k < vocab) {
        for (int bit = 31; bit >= 0; --bit) {
            const uint32_t cand = kmin | (1u << bit);
            float cnt = 0.0f;
            for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) cnt += order_key(x_at(j)) >= cand ? 1.0f : 0.0f;
            if (block_sum(cnt, sh.scratch) >= float(top_k)) kmin = cand;
        }
    }
    // min_p: the most likely token has weight exp(0) = 1, so p >= min_p * p_max is w >= min_p.
    auto weight = [&](int64_t j) {  // unnormalized probability of j after top-k and min_p (0 if cut)
        const float x = x_at(j);
        const float w = order_key(x) >= kmin ? math::exp_f32(x - mx) : 0.0f;
        return w >= min_p ? w : 0.0f;
    };
    float z = 0.0f;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) z += weight(j);
    z = block_sum(z, sh.scratch);

    // Top-p: largest probability threshold P (as bits of a positive float) whose kept mass >= top_p * z.
    uint32_t pmin = 0;
    if (top_p < 1.0f) {
        const float need = top_p * z;
        for (int bit = 30; bit >= 0; --bit) {
            const uint32_t cand = pmin | (1u << bit);
            float mass = 0.0f;
            for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
                const float w = weight(j);
                mass += __float_as_uint(w) >= cand ? w : 0.0f;
            }
            if (block_sum(mass, sh.scratch) >= need) pmin = cand;
        }
    }
    auto kept = [&](int64_t j) {
        const float w = weight(j);
        return (w > 0.0f && __float_as_uint(w) >= pmin) ? w : 0.0f;
    };
    // Inverse CDF in index order over contiguous per-thread chunks.
    const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int64_t j0 = int64_t(threadIdx.x) * chunk, j1 = min(j0 + chunk, vocab);
    float s = 0.0f;
    for (int64_t j = j0; j < j1; ++j) s += kept(j);
    sh.chunk_sum[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < int(blockDim.x); ++t) total += sh.chunk_sum[t];
        const float target = u * total;
        float cum = 0.0f;
        int pick = -1, last = -1;
        for (int t = 0; t < int(blockDim.x); ++t) {
            if (sh.chunk_sum[t] > 0.0f) last = t;
            if (pick < 0 && sh.chunk_sum[t] > 0.0f && cum + sh.chunk_sum[t] > target) pick = t;
            if (pick < 0) cum += sh.chunk_sum[t];
        }
        if (pick < 0) {  // rounding put target at the very end: take the last kept element
            pick = last;
            cum = 0.0f;
            for (int t = 0; t < last; ++t) cum += sh.chunk_sum[t];
        }
        sh.picked_thread = pick < 0 ? 0 : pick;
        sh.chunk_sum[0] = target - cum;  // remaining mass inside the picked chunk
    }
    __syncthreads();
    if (int(threadIdx.x) != sh.picked_thread) return -1;
    const float rem = sh.chunk_sum[0];
    float cum = 0.0f;
    int64_t choice = -1;
    for (int64_t j = j0; j < j1; ++j) {
        const float w = kept(j);
        if (w <= 0.0f) continue;
        choice = j;
        cum += w;
        if (cum > rem) break;
    }
    return choice < 0 ? 0 : choice;
}

template <typename U>
__global__ void __launch_bounds__(kThreads)
    sample_kernel(int32_t* out, const U* logits, int64_t vocab, const SampleParams* params) {
    __shared__ RowShared sh;
    const SampleParams p = params[blockIdx.x];
    const int64_t c = sample_row(logits + int64_t(blockIdx.x) * vocab, vocab, p.temperature, p.top_k, p.top_p, 0.0f,
                                 p.u, sh);
    if (c >= 0) out[blockIdx.x] = int32_t(c);
}

// One row per block: log-sum-exp of the raw row, the penalty edits (raw values kept in the edits),
// bans set to -inf in place, then argmax (temperature 0) or sample_row; the pick's log-probability is
// of the raw row.
__global__ void __launch_bounds__(kThreads) select_kernel(int32_t* ids, float* logprobs, float* logits, int64_t vocab,
                                                          const SelectParams* params, const int32_t* bans,
                                                          PenaltyEdit* edits) {
    __shared__ RowShared sh;
    __shared__ float sv[kThreads];
    __shared__ int64_t si[kThreads];
    const SelectParams p = params[blockIdx.x];
    float* row = logits + int64_t(blockIdx.x) * vocab;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = row[j];
        if (v == v) mx = fmaxf(mx, v);
    }
    mx = block_max(mx, sh.scratch);
    float z = 0.0f;
    if (mx > -INFINITY)
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = row[j];
            if (v == v) z += math::exp_f32(v - mx);
        }
    z = block_sum(z, sh.scratch);
    const float lse = mx + logf(z);
    // Each id is edited by one thread (an id appears once per row); the barrier below publishes both
    // the edited row and the raw values.
    for (int32_t e = p.pen_begin + int32_t(threadIdx.x); e < p.pen_end; e += int32_t(blockDim.x)) {
        const int32_t id = edits[e].id;
        if (id < 0 || id >= vocab) continue;
        float l = row[id];
        edits[e].raw = l;
        if (edits[e].repeat) l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
        row[id] = l - edits[e].sub;
    }
    __syncthreads();  // the edits land before the bans (a banned id stays -inf whatever its penalty)
    for (int32_t b = p.ban_begin + int32_t(threadIdx.x); b < p.ban_end; b += int32_t(blockDim.x)) {
        const int32_t id = bans[b];
        if (id >= 0 && id < vocab) row[id] = -INFINITY;
    }
    __syncthreads();  // the bans are visible to the whole block
    int64_t choice = -1;
    if (p.temperature == 0.0f) {
        const int64_t c = argmax_row(row, vocab, sv, si);
        if (threadIdx.x == 0) choice = c;
    } else {
        choice = sample_row(row, vocab, p.temperature, p.top_k, p.top_p, p.min_p, p.u, sh);
    }
    if (choice < 0) return;
    float value = row[choice];  // never banned unless every token is: then -inf
    for (int32_t e = p.pen_begin; e < p.pen_end; ++e)
        if (edits[e].id == choice) value = edits[e].raw;  // edited: its raw logit
    ids[blockIdx.x] = int32_t(choice);
    logprobs[blockIdx.x] = value - lse;
}

}  // namespace

void argmax(int32_t* out, const void* logits, DType dtype, int64_t m, int64_t vocab, cudaStream_t stream) {
    KERNEL_CHECK(vocab > 0 && vocab < (int64_t(1) << 31) && m >= 0 && m <= 0x7fffffff, "cuda::argmax: bad shape");
    if (m == 0) return;
    LATTICE_DISPATCH_FLOAT(
        dtype, argmax_kernel<U><<<unsigned(m), kThreads, 0, stream>>>(out, static_cast<const U*>(logits), vocab));
    CUDA_CHECK_LAUNCH();
}

void sample(int32_t* out, const void* logits, DType dtype, int64_t m, int64_t vocab, const SampleParams* params,
            cudaStream_t stream) {
    KERNEL_CHECK(vocab > 0 && vocab < (int64_t(1) << 24) && m >= 0 && m <= 0x7fffffff,
                 "cuda::sample: vocab " + std::to_string(vocab) + " out of range (< 2^24)");
    if (m == 0) return;
    LATTICE_DISPATCH_FLOAT(dtype, sample_kernel<U>
                           <<<unsigned(m), kThreads, 0, stream>>>(out, static_cast<const U*>(logits), vocab, params));
    CUDA_CHECK_LAUNCH();
}

void select_tokens(int32_t* ids, float* logprobs, float* logits, int64_t m, int64_t vocab, const SelectParams* params,
                   const int32_t* bans, PenaltyEdit* edits, cudaStream_t stream) {
    KERNEL_CHECK(vocab > 0 && vocab < (int64_t(1) << 24) && m >= 0 && m <= 0x7fffffff,
                 "cuda::select_tokens: vocab " + std::to_string(vocab) + " out of range (< 2^24)");
    if (m == 0) return;
    select_kernel<<<unsigned(m), kThreads, 0, stream>>>(ids, logprobs, logits, vocab, params, bans, edits);
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
