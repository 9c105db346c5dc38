// The CPU attention's K and V cache layouts against the row layout of the CUDA kernels, for tests that
// hand one cache to both (test_cuda_attention, test_cuda_sanitize) and for the CPU test that checks the
// mapping itself (test_ops.cpp). A block of `row_elems`-element rows (head_dim, or head_dim + 4 bytes for
// int8: values first, then [block_size, n_kv] f32 scales, which both layouts keep as they are) holds
//   rows (CUDA):               element d of position p, kv head g at (p * n_kv + g) * head_dim + d
//   CPU K (kernels/cpu/ops.h): at (g * head_dim + d) * block_size + p
//   CPU V:                     at (g * block_size + p) * head_dim + d
// T: the cache's element (float for f32 / rounded test caches, uint8_t for int8 bytes).
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::test {

enum class KvPart { kK, kV };

template <class T>
std::vector<T> cache_layout(KvPart part, const std::vector<T>& in, int64_t blocks, int64_t block_size, int64_t n_kv,
                            int64_t head_dim, int64_t row_elems, bool to_cpu) {
    std::vector<T> out = in;  // the scales (int8) are where they were
    const int64_t block_elems = block_size * n_kv * row_elems;
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t p = 0; p < block_size; ++p)
            for (int64_t g = 0; g < n_kv; ++g)
                for (int64_t d = 0; d < head_dim; ++d) {
                    const int64_t row = b * block_elems + (p * n_kv + g) * head_dim + d;
                    const int64_t cpu = b * block_elems + (part == KvPart::kV ? (g * block_size + p) * head_dim + d
                                                                              : (g * head_dim + d) * block_size + p);
                    if (to_cpu)
                        out[size_t(cpu)] = in[size_t(row)];
                    else
                        out[size_t(row)] = in[size_t(cpu)];
                }
    return out;
}

// Convenience: float caches of head_dim-element rows.
inline std::vector<float> rows_to_cpu(KvPart part, const std::vector<float>& c, int64_t blocks, int64_t bs, int64_t nkv,
                                      int64_t hd) {
    return cache_layout(part, c, blocks, bs, nkv, hd, hd, true);
}
inline std::vector<float> cpu_to_rows(KvPart part, const std::vector<float>& c, int64_t blocks, int64_t bs, int64_t nkv,
                                      int64_t hd) {
    return cache_layout(part, c, blocks, bs, nkv, hd, hd, false);
}

}  // namespace lattice::test
