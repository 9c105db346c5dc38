// AWQ and GPTQ checkpoints (runtime/weights/hf_int4.h) against their NumPy dequantization (data/tiny-awq,
// data/tiny-gptq and their -ref twins, written by data/make_awq_gptq_fixtures.py from the formats' packing
// rules): every linear's 4-bit read (and the kernels' packed layout read back) and its float read equal the
// NumPy values bit for bit, slices included; GPTQ's act-order linears carry a permutation and refuse a column
// slice; AWQ refuses a row slice that cuts a pack of 8; AutoGPTQ's all-zero biases are dropped; a config or
// checkpoint lattice cannot run is refused naming config.json's key or the tensor.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/int4_gemm.h"
#include "runtime/weights/tensor_source.h"
#include "tests/kernels/cpu/int8_test_util.h"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) {
    return std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/" + name;
}

const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

std::vector<float> read_f32(const TensorSource& src, const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                            int64_t cols) {
    std::vector<float> out(size_t(rows * cols), -1.0f);
    src.read(name, row0, rows, col0, cols, DType::kF32, out.data());
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A copy of fixture `name` in a temporary folder with config.json's quantization_config edited by `edit`.
std::string edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path dir = fs::temp_directory_path() / ("lattice_int4_hf_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::copy(fixture(name), dir);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    edit(c);
    std::ofstream(dir / "config.json") << c.dump(2);
    return dir.string();
}

}  // namespace

TEST_CASE("AWQ / GPTQ: 4-bit and float reads of every linear equal the NumPy dequantization bit for bit") {
    for (const char* model : {"tiny-awq", "tiny-gptq"}) {
        CAPTURE(model);
        const bool gptq = std::string(model) == "tiny-gptq";
        auto src = open_model(fixture(model));
        auto ref = open_model(fixture(std::string(model) + "-ref"));
        for (const char* lin : kLinears) {
            const std::string name = std::string("model.layers.0.") + lin + ".weight";
            CAPTURE(name);
            const TensorInfo& ti = src->info(name);
            REQUIRE(ti.int4_group == 32);
            CHECK(ti.int4_kind == Int4Kind::kZeroPoint);
            CHECK(ti.int4_perm == gptq);  // the GPTQ fixture is act-order
            CHECK(ti.shape == ref->info(name).shape);
            const int64_t n = ti.rows(), k = ti.cols();
            const std::vector<float> want = read_f32(*ref, name, 0, n, 0, k);
            CHECK(same_bits(read_f32(*src, name, 0, n, 0, k), want));
            const Int4Weights w = src->read_int4(name, 0, n, 0, k);
            CHECK(w.perm.empty() != gptq);
            std::vector<float> deq(size_t(n * k));
            dequantize_int4(w.matrix(), deq.data());
            CHECK(same_bits(deq, want));
            for (IsaLevel isa : test::supported_isas()) {
                CAPTURE(isa_name(isa));
                std::vector<float> packed(size_t(n * k), -1.0f);
                dequantize_packed_int4(pack_int4_weights(w.matrix(), isa), packed.data());
                CHECK(same_bits(packed, want));
            }
            // Any float slice; a 4-bit slice of whole packs and groups (AWQ: act-order has none).
            CHECK(same_bits(read_f32(*src, name, 3, 7, 5, 35), read_f32(*ref, name, 3, 7, 5, 35)));
            if (!gptq) {
                const Int4Weights part = src->read_int4(name, 8, 16, 32, k - 32);
                std::vector<float> d(size_t(16 * (k - 32)));
                dequantize_int4(part.matrix(), d.data());
                CHECK(same_bits(d, read_f32(*ref, name, 8, 16, 32, k - 32)));
            }
        }
        // AutoGPTQ writes an all-zero bias per linear; the family uses none, so the source drops them.
        for (const std::string& t : src->tensor_names()) CHECK_FALSE(t.ends_with(".bias"));
        CHECK_NOTHROW(check_tensor_set(*src));
    }
}

TEST_CASE("AWQ / GPTQ: slices that cut a pack, a group or an act-order order are refused naming the tensor") {
    auto awq = open_model(fixture("tiny-awq"));
    auto gptq = open_model(fixture("tiny-gptq"));
    const std::string o = "model.layers.0.self_attn.o_proj.weight";
    CHECK_THROWS_WITH_AS(awq->read_int4(o, 4, 8, 0, 64), doctest::Contains("8 at a time; rows [4, 12)"), Error);
    CHECK_THROWS_WITH_AS(awq->read_int4(o, 0, 8, 16, 32), doctest::Contains("columns [16, 48) cut a group"), Error);
    CHECK_THROWS_WITH_AS(gptq->read_int4(o, 0, 8, 0, 32),
                         doctest::Contains("self_attn.o_proj.weight\" is GPTQ act-order"), Error);
    CHECK_THROWS_AS(awq->read_int4("model.norm.weight", 0, 1, 0, 64), Error);
}

TEST_CASE("AWQ / GPTQ: configurations lattice cannot run are refused naming config.json's key") {
    struct Bad {
        const char* model;
        std::function<void(nlohmann::json&)> edit;
        const char* message;
    };
    const Bad cases[] = {
        {"tiny-awq", [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "bitsandbytes"; },
         "quant_method \"bitsandbytes\" is not supported"},
        {"tiny-awq", [](nlohmann::json& c) { c["quantization_config"]["bits"] = 8; }, "bits 8 is not supported"},
        {"tiny-gptq", [](nlohmann::json& c) { c["quantization_config"]["group_size"] = -1; },
         "group_size -1 is not supported"},
        {"tiny-awq", [](nlohmann::json& c) { c["quantization_config"]["version"] = "gemv"; },
         "version \"gemv\" is not supported"},
        {"tiny-gptq", [](nlohmann::json& c) { c["quantization_config"]["checkpoint_format"] = "marlin"; },
         "checkpoint_format \"marlin\""},
        // GPTQ tensors read as AWQ: the packed shapes disagree.
        {"tiny-gptq", [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; },
         "qweight\" holds a [512, 8] weight whose 8 input channels are not a multiple of group_size 32"},
        {"tiny-awq", [](nlohmann::json& c) { c.erase("quantization_config"); },
         "is packed 4-bit (AWQ / GPTQ) but config.json has no quantization_config"},
    };
    for (const Bad& b : cases) {
        CAPTURE(b.message);
        const std::string dir = edited_copy(b.model, b.edit);
        CHECK_THROWS_WITH_AS(open_model(dir), doctest::Contains(b.message), Error);
        fs::remove_all(dir);
    }
}
