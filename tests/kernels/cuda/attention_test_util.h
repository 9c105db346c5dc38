// Attention test helpers shared by test_cuda_attention and test_cuda_sanitize: a random paged-cache
// problem (DecodeProblem: shapes, block tables, caches and queries rounded to the activation dtype,
// one (position, sequence) per token), the device paths (kv_store + decode, kv_store + prefill tiles),
// the CPU op and a float64 reference with the device's rules for what the CPU op rejects.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/kv_layout.h"

namespace lattice::test {

inline cuda::AttnDims attn_dims(int64_t nh, int64_t nkv, int64_t hd, int64_t max_seq, int64_t bs, int64_t n_blocks,
                                int64_t table_width, float scale) {
    cuda::AttnDims d;
    d.n_heads = nh;
    d.n_kv_heads = nkv;
    d.head_dim = hd;
    d.max_seq = max_seq;
    d.block_size = bs;
    d.num_blocks = n_blocks;
    d.table_width = table_width;
    d.scale = scale;
    return d;
}

// One decode problem: shapes, block tables, fp32 caches and queries (already rounded to the activation
// dtype), and one (position, sequence) per token. kv_int8: both sides run over an INT8 cache that starts
// zeroed (kc / vc unused); softcap: the scores' soft-cap (0: none).
struct DecodeProblem {
    int64_t nh = 0, nkv = 0, hd = 0, max_seq = 0, bs = 16, n_seqs = 0, n_blocks = 0, window = 0;
    bool kv_int8 = false;
    float softcap = 0.0f;
    std::vector<int32_t> tables, pos, seqs;
    std::vector<float> kc, vc, qkv;
    int64_t width() const { return (max_seq + bs - 1) / bs; }
    int64_t row() const { return (nh + 2 * nkv) * hd; }
    int64_t m() const { return int64_t(pos.size()); }
    float scale() const { return 1.0f / std::sqrt(float(hd)); }
    cuda::AttnDims dims() const {
        cuda::AttnDims d = attn_dims(nh, nkv, hd, max_seq, bs, n_blocks, width(), scale());
        d.window = window;
        d.kv_int8 = kv_int8;
        d.softcap = softcap;
        return d;
    }
    size_t cache_bytes() const { return size_t(n_blocks * bs * nkv * (hd + 4)); }  // an INT8 cache
};

// The device caches of a problem: its rows in the activation dtype, or a zeroed INT8 cache.
inline DevBuf device_cache(const DecodeProblem& p, const std::vector<float>& rows, DType act) {
    return p.kv_int8 ? DevBuf(std::vector<uint8_t>(p.cache_bytes(), 0)) : DevBuf(to_act(rows, act));
}

// Random caches and queries. full_tables: every table entry is a block (a permutation of n_seqs *
// width blocks); otherwise each sequence gets distinct blocks (shuffled) for the positions its tokens
// reach and random valid ids past them (never read: an over-read would pull in foreign rows).
inline DecodeProblem make_problem(std::mt19937_64& rng, DType act, int64_t nh, int64_t nkv, int64_t hd, int64_t max_seq,
                                  int64_t n_seqs, std::vector<int32_t> pos, std::vector<int32_t> seqs,
                                  bool full_tables) {
    DecodeProblem p;
    p.nh = nh, p.nkv = nkv, p.hd = hd, p.max_seq = max_seq, p.n_seqs = n_seqs;
    p.pos = std::move(pos), p.seqs = std::move(seqs);
    const int64_t w = p.width();
    std::vector<int64_t> need(size_t(n_seqs), full_tables ? w : 0);
    for (int64_t t = 0; t < p.m(); ++t)
        if (p.seqs[t] >= 0 && p.seqs[t] < n_seqs && p.pos[t] >= 0 && p.pos[t] < max_seq)
            need[size_t(p.seqs[t])] = std::max<int64_t>(need[size_t(p.seqs[t])], p.pos[t] / p.bs + 1);
    for (int64_t n : need) p.n_blocks += n;
    p.n_blocks = std::max<int64_t>(p.n_blocks, 1);
    std::vector<int32_t> ids(size_t(p.n_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    p.tables.resize(size_t(n_seqs * w));
    size_t next = 0;
    for (int64_t s = 0; s < n_seqs; ++s)
        for (int64_t b = 0; b < w; ++b)
            p.tables[size_t(s * w + b)] = b < need[size_t(s)] ? ids[next++] : int32_t(rng() % uint64_t(p.n_blocks));
    const size_t cache_n = size_t(p.n_blocks * p.bs * nkv * hd);
    p.kc = random_vec(rng, cache_n);
    p.vc = random_vec(rng, cache_n);
    p.qkv = random_vec(rng, size_t(p.m() * p.row()), -2, 2);
    for (auto* v : {&p.kc, &p.vc, &p.qkv})
        for (auto& x : *v) x = round_act(x, act);
    return p;
}

// kv_store + attention_decode on the device: out [m, nh * hd]. qkv sits qkv_offset elements into its
// buffer (not a multiple of 8: unaligned, the scalar-load path). The workspace starts poisoned, so a
// split the merge reads but nobody wrote shows as NaN.
inline std::vector<float> device_decode(const DecodeProblem& p, DType act, int64_t qkv_offset = 0) {
    const int64_t m = p.m();
    std::vector<float> padded(size_t(qkv_offset), 0.0f);
    padded.insert(padded.end(), p.qkv.begin(), p.qkv.end());
    DevBuf dqkv(to_act(padded, act)), dpos(p.pos), dseqs(p.seqs), dtables(p.tables);
    DevBuf dk = device_cache(p, p.kc, act), dv = device_cache(p, p.vc, act), dout(size_t(m * p.nh * p.hd) * 2);
    const cuda::AttnDims d = p.dims();
    const cuda::KvTables kv{dtables.get<int32_t>(), p.n_seqs};
    const void* q = dqkv.get<uint16_t>() + qkv_offset;
    cuda::kv_store(dk.get(), dv.get(), q, dpos.get<int32_t>(), dseqs.get<int32_t>(), kv, m, d, act, nullptr);
    DevBuf ws(size_t(cuda::decode_workspace_floats(m, d)) * 4);
    cuda::attention_decode(dout.get(), q, dk.get(), dv.get(), dpos.get<int32_t>(), dseqs.get<int32_t>(), kv, m, d,
                           ws.get<float>(), act, nullptr);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    return from_act(dout.download<uint16_t>(size_t(m * p.nh * p.hd)), act);
}

inline std::vector<float> cpu_decode(const DecodeProblem& p, ThreadPool& pool) {
    // The CPU op keeps K transposed and V by kv head per block (tests/kernels/kv_layout.h): the same cache in
    // its layout.
    std::vector<float> out(size_t(p.m() * p.nh * p.hd)),
        k = rows_to_cpu(KvPart::kK, p.kc, p.n_blocks, p.bs, p.nkv, p.hd),
        v = rows_to_cpu(KvPart::kV, p.vc, p.n_blocks, p.bs, p.nkv, p.hd);
    cpu::AttentionArgs args{p.nh,     p.nkv,     p.hd,      p.bs,    p.n_blocks, p.tables.data(),
                            p.n_seqs, p.width(), p.scale(), p.window};
    args.softcap = p.softcap;
    if (p.kv_int8) {  // a zeroed INT8 cache, filled by the op as the device fills its own
        args.kv_dtype = DType::kI8;
        std::vector<uint8_t> k8(p.cache_bytes(), 0), v8(p.cache_bytes(), 0);
        cpu::attention(out.data(), p.qkv.data(), k8.data(), v8.data(), p.pos.data(), p.seqs.data(), p.m(), args, pool);
        return out;
    }
    cpu::attention(out.data(), p.qkv.data(), k.data(), v.data(), p.pos.data(), p.seqs.data(), p.m(), args, pool);
    return out;
}

// float64 reference with the device's rules for what the CPU op rejects: a position whose table entry
// is not a block of the cache is skipped (and not stored); a token outside the context or the tables,
// or with no position left, gets zeros.
inline std::vector<float> naive_decode(const DecodeProblem& p) {
    const int64_t m = p.m(), hd = p.hd, group = p.nh / p.nkv, w = p.width();
    std::vector<float> k = p.kc, v = p.vc, out(size_t(m * p.nh * hd), 0.0f);
    auto valid = [&](int64_t t) {
        return p.seqs[t] >= 0 && p.seqs[t] < p.n_seqs && p.pos[t] >= 0 && p.pos[t] < p.max_seq;
    };
    auto row_of = [&](int64_t t, int64_t q, int64_t g) -> int64_t {  // element offset, -1: no block
        const int32_t b = p.tables[size_t(p.seqs[t] * w + q / p.bs)];
        return b >= 0 && b < p.n_blocks ? ((b * p.bs + q % p.bs) * p.nkv + g) * hd : -1;
    };
    for (int64_t t = 0; t < m; ++t)
        for (int64_t g = 0; g < p.nkv && valid(t); ++g) {
            const int64_t off = row_of(t, p.pos[t], g);
            if (off < 0) continue;
            for (int64_t i = 0; i < hd; ++i) {
                k[size_t(off + i)] = p.qkv[size_t(t * p.row() + (p.nh + g) * hd + i)];
                v[size_t(off + i)] = p.qkv[size_t(t * p.row() + (p.nh + p.nkv + g) * hd + i)];
            }
        }
    for (int64_t t = 0; t < m; ++t) {
        if (!valid(t)) continue;
        for (int64_t h = 0; h < p.nh; ++h) {
            const float* q = p.qkv.data() + t * p.row() + h * hd;
            std::vector<double> s;
            std::vector<int64_t> offs;
            for (int64_t j = 0; j <= p.pos[t]; ++j) {
                const int64_t off = row_of(t, j, h / group);
                if (off < 0) continue;
                double dot = 0;
                for (int64_t i = 0; i < hd; ++i) dot += double(q[i]) * double(p.scale()) * double(k[size_t(off + i)]);
                s.push_back(dot);
                offs.push_back(off);
            }
            if (s.empty()) continue;
            const double mx = *std::max_element(s.begin(), s.end());
            double sum = 0;
            for (double& x : s) sum += (x = std::exp(x - mx));
            for (int64_t i = 0; i < hd; ++i) {
                double a = 0;
                for (size_t j = 0; j < s.size(); ++j) a += s[j] * double(v[size_t(offs[j] + i)]);
                out[size_t((t * p.nh + h) * hd + i)] = float(a / sum);
            }
        }
    }
    return out;
}

// kv_store + attention_prefill on the device (tokens of one sequence in runs of increasing
// positions, as build_prefill_tiles requires): out [m, nh * hd].
inline std::vector<float> device_prefill(const DecodeProblem& p, DType act) {
    const int64_t m = p.m();
    DevBuf dqkv(to_act(p.qkv, act)), dpos(p.pos), dseqs(p.seqs), dtables(p.tables);
    DevBuf dk = device_cache(p, p.kc, act), dv = device_cache(p, p.vc, act), dout(size_t(m * p.nh * p.hd) * 2);
    const cuda::AttnDims d = p.dims();
    const cuda::KvTables kv{dtables.get<int32_t>(), p.n_seqs};
    cuda::kv_store(dk.get(), dv.get(), dqkv.get(), dpos.get<int32_t>(), dseqs.get<int32_t>(), kv, m, d, act, nullptr);
    std::vector<cuda::PrefillTile> tiles(static_cast<size_t>(m));
    tiles.resize(size_t(cuda::build_prefill_tiles(tiles.data(), p.pos.data(), p.seqs.data(), m)));
    DevBuf dt(tiles);
    cuda::attention_prefill(dout.get(), dqkv.get(), dk.get(), dv.get(), dpos.get<int32_t>(),
                            dt.get<cuda::PrefillTile>(), int64_t(tiles.size()), kv, d, act, nullptr);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    return from_act(dout.download<uint16_t>(size_t(m * p.nh * p.hd)), act);
}

}  // namespace lattice::test
