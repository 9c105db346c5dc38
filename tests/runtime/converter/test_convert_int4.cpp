// lattice convert in 4 bits (w4a8 / w4a16), single process: a converted folder holds each 4-bit linear as its
// parts (runtime/weights/manifest.h) and runs bit-identically to the source run directly: a GGUF whose linears are
// Q4_0 / Q4_1 blocks (kept as stored; a q|k|v of mixed types quantized from float as a load does; the Q8_0 tied
// head 8-bit), AWQ and GPTQ act-order checkpoints (zero points, the permutation), float golden checkpoints (dense
// and Mixtral's experts) quantized at conversion; `--quant auto` of a 4-bit GGUF writes w4a8. A 4-bit tensor
// damaged in the file (a scale flipped to infinity, a part cut short with the manifest updated to match) is
// refused naming the tensor. Multi-rank layouts: test_convert_int4_layouts.cpp.
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/weights/converted_source.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/sha256.h"
#include "tests/runtime/converter/convert_test_util.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/weights/q4_gguf.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_convert_int4 {

using namespace lattice;
using namespace lattice::testing;

namespace {

const std::string kQkv = "model.layers.0.self_attn.qkv_proj.weight";
const std::string kDown = "model.layers.0.mlp.down_proj.weight";

void convert_to(const TensorSource& src, const std::string& out, QuantMode q, bool quant_head = false) {
    ConvertOptions opt;
    opt.out = out;
    opt.quant = q;
    opt.quant_head = quant_head;
    LocalComm world;
    convert_checkpoint(src, opt, world);
}

BuildOptions options(QuantMode q, bool quant_head) {
    BuildOptions o = cpu_options(1, 1, false, q);
    o.model.quant_head = quant_head;
    return o;
}

// The converted folder's run equals the source's, bit for bit; returns the converted run.
RunResult check_round_trip(const TensorSource& src, const std::string& out, QuantMode q, bool quant_head,
                           const std::vector<int32_t>& prompt) {
    convert_to(src, out, q, quant_head);
    RunResult want = run_built(build(options(q, quant_head), src), prompt, 8);
    RunResult got = run_built(build(options(q, quant_head), spec_of(out, true)), prompt, 8);
    REQUIRE(got.logits.size() == want.logits.size());
    CHECK(same_bits(got.logits, want.logits));
    CHECK(got.tokens == want.tokens);
    CHECK(got.weight_bytes == want.weight_bytes);
    // The load read its file's tensors once each, and nothing else (the rope factors are read at open).
    auto file = open_converted_model(out, {1, 1, 0});
    CHECK(got.bytes_read[0] == file->total_bytes() - int64_t(file->rope_freq_factors().size() * sizeof(float)));
    return got;
}

std::string q4_gguf(const test::Q4Types& ty, const char* name) {
    return test::write_file(std::string(LATTICE_BINARY_DIR) + "/" + name, test::q4_llama_gguf(ty));
}

std::string load_error(const std::string& dir, QuantMode q, bool quant_head) {
    try {
        RankRuntime rt = build(options(q, quant_head), spec_of(dir));
    } catch (const Error& e) {
        return e.what();
    }
    return "(loaded)";
}

bool contains(const std::string& s, const std::string& part) {
    if (s.find(part) != std::string::npos) return true;
    MESSAGE("\"" << part << "\" not in: " << s);
    return false;
}

}  // namespace

TEST_CASE("4-bit GGUF converted: Q4 blocks kept, mixed q|k|v quantized as a load does, 8-bit head; bit-identical") {
    TempDir tmp;
    test::Q4Types ty;
    ty.k = DType::kQ4_0;  // q|k|v parts differ: read as float and quantized (affine, 32) by the load and the converter
    auto src = open_model(q4_gguf(ty, "test_convert_int4.gguf"));
    const std::vector<int32_t> prompt = random_ids(12, src->config().vocab, 3);
    for (QuantMode q : {QuantMode::kW4A8, QuantMode::kW4A16}) {
        CAPTURE(quant_mode_name(q));
        const std::string out = tmp / std::string(quant_mode_name(q));
        check_round_trip(*src, out, q, true, prompt);
        auto conv = open_converted_model(out, {1, 1, 0});
        CHECK(conv->prepared()->quant == quant_mode_name(q));
        const TensorInfo& qkv = conv->info(kQkv);
        CHECK(qkv.dtype == DType::kU8);
        CHECK(qkv.int4_group == 32);
        CHECK(qkv.int4_kind == Int4Kind::kAffine);  // quantized from float
        const TensorInfo& down = conv->info(kDown);
        CHECK(down.int4_kind == Int4Kind::kOffset8);  // the file's Q4_0 blocks as they are
        CHECK(down.shape == std::vector<int64_t>{test::kQ4H, test::kQ4F});
        CHECK(conv->info("model.layers.0.mlp.gate_up_proj.weight").int4_kind == Int4Kind::kAffine);  // Q4_1
        CHECK(conv->info("lm_head.weight").dtype == DType::kI8);  // the Q8_0 tied head runs at 8 bits
        // The blocks read back are the source's, byte for byte.
        const Int4Weights a = conv->read_int4(kDown, 0, test::kQ4H, 0, test::kQ4F);
        const Int4Weights b = src->read_int4("model.layers.0.mlp.down_proj.weight", 0, test::kQ4H, 0, test::kQ4F);
        CHECK(a.qs == b.qs);
        CHECK(a.d == b.d);
        CHECK_THROWS_WITH_AS(conv->read_int4(kDown, 0, 1, 0, test::kQ4F), doctest::Contains("is read whole"), Error);
    }
}

TEST_CASE("lattice convert --quant auto of a 4-bit GGUF writes w4a8 with an 8-bit head") {
    TempDir tmp;
    const std::string gguf = q4_gguf(test::Q4Types{}, "test_convert_int4_auto.gguf");
    const std::string out = tmp / "auto";
    const std::string cmd = std::string(LATTICE_BINARY_DIR) + "/launch/lattice convert --model " + gguf + " --out " +
                            out + " --progress none > " + tmp / "log" + " 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const Manifest m = read_manifest(out);
    CHECK(m.quant == "w4a8");
    CHECK(m.quant_head);
    auto src = open_model(gguf);
    BuildOptions b = test::cpu_options();
    b.quant_auto = true;
    const std::vector<int32_t> prompt = random_ids(10, src->config().vocab, 5);
    RunResult want = run_built(build(b, *src), prompt, 6);
    RunResult got = run_built(build(b, spec_of(out)), prompt, 6);
    CHECK(same_bits(got.logits, want.logits));
    CHECK(got.tokens == want.tokens);
}

TEST_CASE("AWQ and GPTQ act-order converted: zero points and the permutation kept; bit-identical") {
    TempDir tmp;
    const std::string data = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/";
    for (const char* name : {"tiny-awq", "tiny-gptq"}) {
        CAPTURE(name);
        auto src = open_model(data + name);
        const std::vector<int32_t> prompt = random_ids(12, src->config().vocab, 7);
        for (QuantMode q : {QuantMode::kW4A16, QuantMode::kW4A8}) {
            CAPTURE(quant_mode_name(q));
            const std::string out = tmp / (std::string(name) + std::string(quant_mode_name(q)));
            check_round_trip(*src, out, q, false, prompt);
            auto conv = open_converted_model(out, {1, 1, 0});
            const TensorInfo& qkv = conv->info(kQkv);
            CHECK(qkv.int4_kind == Int4Kind::kZeroPoint);
            CHECK(qkv.int4_perm == (std::string(name) == "tiny-gptq"));
        }
    }
}

TEST_CASE("float golden checkpoints quantized to 4 bits at conversion (dense, Mixtral's experts): bit-identical") {
    TempDir tmp;
    int n = 0;
    for (const std::string name : {"tiny-gqa-llama3", "tiny-fp16-tied", "families/mixtral"}) {
        auto src = open_model(golden_dir(name));
        const std::vector<int32_t> prompt = load_golden(name)[0].prompt;
        for (QuantMode q : {QuantMode::kW4A8, QuantMode::kW4A16}) {
            for (bool head : {false, true}) {
                CAPTURE(name);
                CAPTURE(quant_mode_name(q));
                CAPTURE(head);
                const RunResult got = check_round_trip(*src, tmp / std::to_string(n++), q, head, prompt);
                CHECK(got.tokens.size() == 8);
            }
        }
    }
}

TEST_CASE("a damaged 4-bit tensor is refused naming it") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-llama2"));
    const std::string dir = tmp / "c";
    convert_to(*src, dir, QuantMode::kW4A8);
    const std::string path = dir + "/" + rank_file_name(0, 1);
    REQUIRE(load_error(dir, QuantMode::kW4A8, false) == "(loaded)");

    SUBCASE("a scale flipped to infinity (a load without --verify, which hashes nothing)") {
        int64_t at = 0;
        {
            SafetensorsFile f(path);
            at = f.entries().at(kQkv + kInt4ScaleSuffix).begin;  // channel 0, group 0
        }
        {
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            const uint16_t inf = 0x7c00;
            f.seekp(std::streamoff(at));
            f.write(reinterpret_cast<const char*>(&inf), 2);
        }
        const std::string e = load_error(dir, QuantMode::kW4A8, false);
        CHECK(contains(e, path));
        CHECK(contains(e, "\"" + kQkv + "\""));
        CHECK(contains(e, "not finite"));
    }
    SUBCASE("a part cut short, the manifest rewritten to match (unsealed): the shape check names the tensor") {
        std::string rewritten = path + ".new";
        {
            SafetensorsFile f(path);
            std::vector<SafetensorsSpec> specs;
            std::vector<const SafetensorsEntry*> order;
            for (const auto& [name, e] : f.entries()) order.push_back(&e);
            std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
            for (const SafetensorsEntry* e : order) {
                std::vector<int64_t> shape = e->shape;
                if (e->name == kDown + kInt4MinSuffix) shape[0] -= 1;  // one channel's minimums gone
                specs.push_back({e->name, e->dtype, shape});
            }
            SafetensorsWriter w(rewritten, specs, f.metadata());
            for (const SafetensorsSpec& s : specs) w.write(s.name, f.bytes(f.entries().at(s.name)), s.bytes());
            w.finish();
        }
        fs::rename(rewritten, path);
        nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
        j.erase("manifest_sha256");
        j["files"][0]["bytes"] = int64_t(fs::file_size(path));
        j["files"][0]["sha256"] = sha256_file(path);
        std::ofstream(dir + "/manifest.json") << j.dump(2);
        const std::string e = load_error(dir, QuantMode::kW4A8, false);
        CHECK(contains(e, path));
        CHECK(contains(e, "\"" + kDown + "\""));
        CHECK(contains(e, "\"" + kDown + kInt4MinSuffix + "\""));
        CHECK(contains(e, "expected f16"));
    }
    SUBCASE("a folder converted in 4 bits asked to run in 8") {
        const std::string e = load_error(dir, QuantMode::kW8A8, false);
        CHECK(contains(e, "converted with --quant w4a8"));
    }
}

}  // namespace test_convert_int4
