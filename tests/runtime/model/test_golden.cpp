// End-to-end correctness of the single-rank CPU engine against the independent float64 reference:
// every greedy token and every position's logits (relative error < 1e-4), from HF safetensors;
// incremental decode with the KV cache equals a fresh full forward of the longer sequence; a tied float head is
// the embedding's one copy; W8A8 linears beside oneDNN's copy count it (SKIP without libdnnl or AVX-512 VNNI).
#include <doctest/doctest.h>

#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/onednn_int8.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/tensor_source.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_skip.h"

using namespace lattice;
using namespace lattice::testing;


TEST_CASE("golden HF checkpoints: greedy tokens and logits match the float64 reference") {
    for (const auto& m : golden_models()) {
        auto cases = load_golden(m);
        REQUIRE(!cases.empty());
        check_golden_model(golden_dir(m), cases, 1, 256);
    }
}

TEST_CASE("golden: two threads and prompt chunks of 3 tokens give the same results") {
    for (const auto& m : golden_models()) check_golden_model(golden_dir(m), load_golden(m), 2, 3);
}

TEST_CASE("tied embeddings with a float head are held once; an int8 head keeps its own float table") {
    // The goldens' fp32 results above cover what the embedding reads; here the bytes: the loader's count
    // (RankWeights, each tensor once) against what the model holds.
    auto src = open_model(golden_dir("tiny-fp16-tied"));
    const ModelConfig& c = src->config();
    REQUIRE(c.tie_embeddings);
    const double table = double(c.vocab) * double(c.hidden) * 2;  // f16 rows
    CpuBackend be(CpuBackendOptions{1, false, false});
    {
        Model model(*src, be, ModelOptions{}, nullptr);
        CHECK(double(model.weight_bytes()) == RankWeights(*src, ModelOptions{}).resident_bytes({}));
        CHECK(model.weight_bytes() == model.streamed_weight_bytes());  // nothing held beside what a token reads
    }
    ModelOptions q;
    q.quant = QuantMode::kW8A8;
    q.quant_head = true;
    Model model(*src, be, q, nullptr);
    CHECK(double(model.weight_bytes() - model.streamed_weight_bytes()) == table);
}

TEST_CASE("incremental decode with the KV cache equals a fresh forward of the longer sequence") {
    for (const auto& m : golden_models()) {
        CAPTURE(m);
        auto src = open_model(golden_dir(m));
        CpuBackend be(CpuBackendOptions{2, false, false});
        Model model(*src, be, ModelOptions{}, nullptr);
        const AttentionShape& a = model.attention_shape();
        const int64_t per_seq = (64 + a.block_size - 1) / a.block_size;
        model.allocate_kv(2 * per_seq);
        // Sequence 0 uses the first blocks of the paged cache, sequence 1 the next ones.
        std::vector<int32_t> table0(size_t(a.table_width), -1), table1(size_t(a.table_width), -1);
        for (int64_t b = 0; b < per_seq; ++b) table0[size_t(b)] = int32_t(b), table1[size_t(b)] = int32_t(per_seq + b);
        const int64_t V = src->config().vocab;
        std::vector<int32_t> seq = load_golden(m)[0].prompt;
        std::vector<float> step_logits(static_cast<size_t>(V)), full(size_t(V) * 64);
        // Prefill sequence 0.
        {
            std::vector<int32_t> pos(seq.size()), s0(seq.size(), 0);
            for (size_t i = 0; i < seq.size(); ++i) pos[i] = int32_t(i);
            model.forward(TokenBatch{seq.data(), pos.data(), s0.data(), int64_t(seq.size()), table0.data(), 1, a.table_width},
                          {int64_t(seq.size()) - 1}, step_logits.data());
        }
        for (int step = 0; step < 8; ++step) {
            int32_t next = int32_t((step * 37 + 11) % V);
            seq.push_back(next);
            int32_t pos = int32_t(seq.size() - 1), s0 = 0;
            model.forward(TokenBatch{&next, &pos, &s0, 1, table0.data(), 1, a.table_width}, {0}, step_logits.data());
            // Fresh full forward of the whole sequence as sequence 1.
            std::vector<int32_t> fpos(seq.size()), fs(seq.size(), 0);
            for (size_t i = 0; i < seq.size(); ++i) fpos[i] = int32_t(i);
            model.forward(TokenBatch{seq.data(), fpos.data(), fs.data(), int64_t(seq.size()), table1.data(), 1, a.table_width},
                          {int64_t(seq.size()) - 1}, full.data());
            CHECK(rel_error(step_logits.data(), full.data(), size_t(V)) < 1e-5);
        }
    }
}

TEST_CASE(
    "W8A8 beside oneDNN's copy [onednn]: the model's bytes and the memory estimate count the copy, the "
    "decode floor's streamed bytes do not") {
    if (!onednn_compiled()) LATTICE_SKIP("built without oneDNN (libdnnl-dev absent at configure time)");
    if (!isa_supported(IsaLevel::kAvx512Vnni))
        LATTICE_SKIP("the CPU has no AVX-512 VNNI (oneDNN serves avx512 and amx)");
    test::ProviderGuard restore(int8_provider());  // the setting of before the case again after it
    auto src = open_model(golden_dir("tiny-llama2"));
    CpuBackend be(CpuBackendOptions{1, false, false});
    ModelOptions q;
    q.quant = QuantMode::kW8A8;
    q.quant_head = true;
    const RankWeights rw(*src, q);
    double copy = 0;  // one byte a weight of every W8A8 linear
    for (const RankTensor& t : rw.tensors())
        if (t.is_linear() && t.mode == QuantMode::kW8A8) copy += double(t.rows) * double(t.cols);
    REQUIRE(copy > 0);
    const double own_estimate = rw.resident_bytes({.cpu_kquant = cpu_keeps_kquant()});
    set_int8_provider(Int8Provider::kOwn);
    CHECK(!cpu_w8a8_keeps_onednn_copy());
    const Model own(*src, be, q, nullptr);
    CHECK(double(own.weight_bytes()) == own_estimate);
    set_int8_provider(Int8Provider::kOnednn);
    CHECK(cpu_w8a8_keeps_onednn_copy());
    const Model od(*src, be, q, nullptr);
    const double with_copy = double(od.weight_bytes()), without = double(own.weight_bytes());
    MESSAGE("W8A8 bytes " << without << ", beside oneDNN's copy " << with_copy << " (its weights: " << copy << ")");
    CHECK(with_copy >= without + copy);                                // the reordered copy holds every weight once
    CHECK(with_copy <= without + 1.25 * copy);                         // and pads the small shapes here a little
    CHECK(od.streamed_weight_bytes() == own.streamed_weight_bytes());  // decode reads the panels alone
    CHECK(rw.resident_bytes({.cpu_kquant = cpu_keeps_kquant(), .cpu_w8a8_copy = true}) == own_estimate + copy);
}
