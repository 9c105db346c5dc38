// CUDA attention (kv_store + split-KV decode, kv_store + tiled prefill) against cpu::attention on
// random paged caches (block tables a random permutation of the blocks) and queries: GQA, head_dim
// 16 (the golden models) and 128, a sequence whose run of rows spans two prefill tiles (41 rows),
// positions crossing the 256-position decode chunk, the last position, and m = 1. Both device paths
// must give the CPU result for the same batch.
#include <algorithm>
#include <numeric>
#include <tuple>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;
using namespace lattice::test;

namespace {

struct Batch {
    std::vector<int32_t> pos, slots;
};

Batch make_batch(bool single) {
    Batch b;
    if (single) {
        b.pos = {299};
        b.slots = {2};
        return b;
    }
    for (int32_t p = 0; p < 3; ++p) b.pos.push_back(p), b.slots.push_back(0);
    for (int32_t p = 100; p <= 140; ++p) b.pos.push_back(p), b.slots.push_back(1);
    b.pos.push_back(299), b.slots.push_back(2);
    b.pos.push_back(257), b.slots.push_back(0);  // slot 0 again, not contiguous with its first run
    return b;
}

}  // namespace

TEST_CASE("cuda attention: decode and prefill paths equal the CPU op" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    ThreadPool pool(1, false);
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (auto [nh, nkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{6, 2, 16}, {8, 2, 128}}) {
            for (bool single : {true, false}) {
                INFO(dtype_name(act) << " nh=" << nh << " nkv=" << nkv << " hd=" << hd << " single=" << single);
                const int64_t n_seqs = 3, max_seq = 300, row = (nh + 2 * nkv) * hd, bs = 16;
                const int64_t width = (max_seq + bs - 1) / bs, n_blocks = n_seqs * width;
                std::vector<int32_t> tables(static_cast<size_t>(n_blocks));
                std::iota(tables.begin(), tables.end(), 0);
                std::shuffle(tables.begin(), tables.end(), rng);
                const Batch b = make_batch(single);
                const int64_t m = int64_t(b.pos.size());
                const size_t cache_n = size_t(n_blocks * bs * nkv * hd);
                std::vector<float> kc = random_vec(rng, cache_n), vc = random_vec(rng, cache_n);
                std::vector<float> qkv = random_vec(rng, size_t(m * row), -2, 2);
                for (auto* v : {&kc, &vc, &qkv})
                    for (auto& x : *v) x = round_act(x, act);
                const float scale = 1.0f / std::sqrt(float(hd));

                std::vector<float> ref(static_cast<size_t>(m * nh * hd));
                std::vector<float> kref = kc, vref = vc;
                cpu::AttentionArgs args{nh, nkv, hd, bs, n_blocks, tables.data(), n_seqs, width, scale};
                cpu::attention(ref.data(), qkv.data(), kref.data(), vref.data(), b.pos.data(), b.slots.data(), m, args,
                               pool);
                REQUIRE(any_nonzero(ref));

                cuda::AttnDims d;
                d.n_heads = nh;
                d.n_kv_heads = nkv;
                d.head_dim = hd;
                d.max_seq = max_seq;
                d.block_size = bs;
                d.num_blocks = n_blocks;
                d.table_width = width;
                d.scale = scale;
                DevBuf dqkv(to_act(qkv, act)), dpos(b.pos), dslots(b.slots), dtables(tables);
                const cuda::KvTables kv{dtables.get<int32_t>(), n_seqs};
                for (int path = 0; path < 2; ++path) {
                    INFO((path == 0 ? "decode" : "prefill"));
                    DevBuf dk(to_act(kc, act)), dv(to_act(vc, act)), dout(size_t(m * nh * hd) * 2);
                    cuda::kv_store(dk.get(), dv.get(), dqkv.get(), dpos.get<int32_t>(), dslots.get<int32_t>(), kv, m,
                                   d, act, nullptr);
                    if (path == 0) {
                        DevBuf ws(size_t(cuda::decode_workspace_floats(m, d)) * 4);
                        cuda::attention_decode(dout.get(), dqkv.get(), dk.get(), dv.get(), dpos.get<int32_t>(),
                                               dslots.get<int32_t>(), kv, m, d, ws.get<float>(), act, nullptr);
                        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
                    } else {
                        std::vector<cuda::PrefillTile> tiles(static_cast<size_t>(m));
                        const int64_t nt = cuda::build_prefill_tiles(tiles.data(), b.pos.data(), b.slots.data(), m);
                        CHECK(nt == (single ? 1 : 5));  // slot0 x3 | slot1 32 + 9 | slot2 | slot0
                        tiles.resize(size_t(nt));
                        DevBuf dt(tiles);
                        cuda::attention_prefill(dout.get(), dqkv.get(), dk.get(), dv.get(), dpos.get<int32_t>(),
                                                dt.get<cuda::PrefillTile>(), nt, kv, d, act, nullptr);
                    }
                    std::vector<float> got = from_act(dout.download<uint16_t>(size_t(m * nh * hd)), act);
                    CHECK(rel_err(got, ref) < tol_for(act));
                    // The caches hold exactly what the CPU stored.
                    CHECK(from_act(dk.download<uint16_t>(cache_n), act) == kref);
                    CHECK(from_act(dv.download<uint16_t>(cache_n), act) == vref);
                }
            }
        }
    }
}

TEST_CASE("cuda build_prefill_tiles rejects positions that do not increase within a slot" *
          doctest::test_suite("cuda")) {
    // Host-only logic, but part of the CUDA library: runs with or without a device.
    std::vector<int32_t> pos = {5, 4}, slots = {1, 1};
    std::vector<cuda::PrefillTile> tiles(2);
    CHECK_THROWS(cuda::build_prefill_tiles(tiles.data(), pos.data(), slots.data(), 2));
    pos = {5, 6};
    CHECK(cuda::build_prefill_tiles(tiles.data(), pos.data(), slots.data(), 2) == 1);
    CHECK(tiles[0].kv_len == 7);
    CHECK(tiles[0].count == 2);
}
