// RankWeights' float reads of a fused linear (q | k | v, gate | up): parts of one dtype are read straight into
// their rows of the fused matrix, parts of mixed dtypes are widened to f32; either way the result is the parts'
// values stacked in order. And a buffer given back with recycle() serves the next read without changing what it
// returns (tests/runtime/weights/q4_gguf.h's one-layer GGUF with f16 / f32 linears).
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <cstring>
#include <string>
#include <vector>

#include "base/convert.h"
#include "runtime/builder/build.h"
#include "runtime/model/rank_weights.h"
#include "tests/runtime/weights/q4_gguf.h"

using namespace lattice;

namespace {

const RankTensor& find(const RankWeights& rw, WeightRole role) {
    for (const RankTensor& t : rw.tensors())
        if (t.role == role) return t;
    FAIL("no tensor of role " << int(role));
    return rw.tensors().front();
}

// The GGUF tensors' values as f32, stacked by rows in the order given.
std::vector<float> stacked_values(const TensorSource& src, const std::vector<std::string>& names) {
    std::vector<float> out;
    for (const std::string& name : names) {
        const TensorInfo& info = src.info(name);
        const int64_t rows = info.shape[0], cols = info.shape[1];
        std::vector<float> part(size_t(rows * cols));
        src.read(name, 0, rows, 0, cols, DType::kF32, part.data());
        out.insert(out.end(), part.begin(), part.end());
    }
    return out;
}

std::vector<float> as_f32(const HostTensor& h) {
    std::vector<float> f(size_t(h.rows * h.cols));
    convert_elements(h.data.data(), h.dtype, f.data(), DType::kF32, h.rows * h.cols);
    return f;
}

}  // namespace

TEST_CASE("fused float linears: one dtype read in place, mixed dtypes widened, the parts' values either way") {
    const std::string layer = "model.layers.0.";
    const std::vector<std::string> qkv = {layer + "self_attn.q_proj.weight", layer + "self_attn.k_proj.weight",
                                          layer + "self_attn.v_proj.weight"};
    const std::vector<std::string> gate_up = {layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"};
    for (const bool mixed : {false, true}) {
        INFO((mixed ? "q, v f16 and k f32" : "all f16"));
        test::Q4Types ty;
        ty.q = ty.k = ty.v = ty.o = ty.gate = ty.up = ty.down = DType::kF16;
        if (mixed) ty.k = DType::kF32;
        const std::string path =
            std::string(LATTICE_BINARY_DIR) + (mixed ? "/test_fused_mixed.gguf" : "/test_fused.gguf");
        auto src = open_model(test::write_file(path, test::q4_llama_gguf(ty)));
        ModelOptions o;  // no quantization: the float tensors as the plan keeps them
        RankWeights rw(*src, o);
        // A large read first, given back: the reads after it reuse its buffer.
        HostTensor embed = rw.read(find(rw, WeightRole::kEmbed));
        std::memset(embed.data.data(), 0x7f, embed.data.size());  // stale bytes a reuse must not show
        rw.recycle(std::move(embed));
        for (int pass = 0; pass < 2; ++pass) {
            HostTensor h = rw.read(find(rw, WeightRole::kWqkv));
            CHECK(h.dtype == (mixed ? DType::kF32 : DType::kF16));
            CHECK(h.rows == 3 * test::kQ4H);
            CHECK(as_f32(h) == stacked_values(*src, qkv));
            rw.recycle(std::move(h));
            HostTensor g = rw.read(find(rw, WeightRole::kWGateUp));
            CHECK(g.dtype == DType::kF16);
            CHECK(as_f32(g) == stacked_values(*src, gate_up));
            rw.recycle(std::move(g));
        }
        // Bytes read count each part in its own encoding, once per read: the Q8_0 embedding (34 bytes per 32),
        // then twice q|k|v and gate|up.
        const int64_t H = test::kQ4H, F = test::kQ4F;
        const int64_t qkv_bytes = mixed ? 2 * H * H * 2 + H * H * 4 : 3 * H * H * 2;
        CHECK(rw.bytes_read() == test::kQ4V * H / 32 * 34 + 2 * (qkv_bytes + 2 * F * H * 2));
    }
}
