// Bad checkpoints, configs and prompts: each is rejected with an Error whose message names the
// culprit (file, tensor, field or token); nothing crashes. The executable-level table of hostile
// inputs is tests/launch/test_bad_input.py; this file checks the library below it.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "base/error.h"
#include "base/file.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/tensor_source.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/weights/gguf_builder.h"
#include "tests/test_error.h"
#include "tests/test_temp_dir.h"

using namespace lattice;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {


std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_file(const std::string& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(s.data(), std::streamsize(s.size()));
}

std::string raw_safetensors(const std::string& header, size_t data_bytes) {
    std::string s(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return s + header + std::string(data_bytes, '\0');
}

void load(const std::string& dir) {
    auto src = open_model(dir);
    CpuBackend be(CpuBackendOptions{1, false, false});
    Model m(*src, be, ModelOptions{}, nullptr);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("safetensors header: parse errors name the file and the tensor") {
    auto parse = [](const std::string& img) {
        return error_of([&] { parse_safetensors_header(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "x.st"); });
    };
    CHECK(contains(parse("abc"), "truncated"));
    {
        std::string img = raw_safetensors("{}", 0);
        img[0] = char(0xff);  // header length far beyond the file
        std::string e = parse(img);
        CHECK(contains(e, "x.st"));
        CHECK((contains(e, "beyond the end") || contains(e, "limit")));
    }
    {
        std::string img = raw_safetensors("{}", 0);
        img[0] = 3;  // 3 bytes of header but only 2 present
        CHECK(contains(parse(img), "beyond the end"));
    }
    CHECK(contains(parse(raw_safetensors("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 16]}}", 8)),
                   "out of range"));
    CHECK(contains(parse(raw_safetensors("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 8)),
                   "needs 8"));
    std::string overlap = parse(raw_safetensors(
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        12));
    CHECK(contains(overlap, "overlap"));
    CHECK(contains(overlap, "\"a\""));
    std::string dt = parse(raw_safetensors("{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2));
    CHECK(contains(dt, "unknown dtype"));
    CHECK(contains(dt, "\"w\""));
    CHECK(contains(parse(raw_safetensors("{\"w\": 5}", 0)), "\"w\""));
    CHECK(contains(parse(raw_safetensors("not json", 0)), "not valid JSON"));
    CHECK(contains(parse(raw_safetensors("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 0]}}", 0)),
                   "non-negative"));
}

TEST_CASE("missing and truncated checkpoint files") {
    TempDir d;
    fs::copy_file(golden_dir("tiny-llama2") + "/config.json", d / "config.json");
    CHECK(contains(error_of([&] { load(d.path.string()); }), "no model.safetensors"));
    std::string full = read_file(golden_dir("tiny-llama2") + "/model.safetensors");
    write_file(d / "model.safetensors", full.substr(0, full.size() / 2));
    std::string e = error_of([&] { load(d.path.string()); });
    CHECK(contains(e, "model.safetensors"));
    CHECK(contains(e, "out of range"));
    write_file(d / "model.safetensors", full.substr(0, 5));
    CHECK(contains(error_of([&] { load(d.path.string()); }), "truncated"));
    CHECK(contains(error_of([&] { load((d.path / "nope").string()); }), "does not exist"));
}

TEST_CASE("tensor missing or with the wrong shape names the tensor") {
    auto src = open_model(golden_dir("tiny-llama2"));
    std::vector<TensorToWrite> all;
    std::vector<std::vector<float>> keep;
    SafetensorsFile st(golden_dir("tiny-llama2") + "/model.safetensors");
    for (const auto& [name, e] : st.entries()) {
        std::vector<float> v(size_t((e.end - e.begin) / dtype_size(e.dtype)));
        convert_elements(st.bytes(e), e.dtype, v.data(), DType::kF32, int64_t(v.size()));
        keep.push_back(std::move(v));
        all.push_back({name, DType::kF32, e.shape, keep.back().data()});
    }
    {
        TempDir d;
        fs::copy_file(golden_dir("tiny-llama2") + "/config.json", d / "config.json");
        std::vector<TensorToWrite> missing;
        for (auto& t : all)
            if (t.name != "model.layers.1.mlp.up_proj.weight") missing.push_back(t);
        write_safetensors(d / "model.safetensors", missing);
        std::string e = error_of([&] { load(d.path.string()); });
        CHECK(contains(e, "model.layers.1.mlp.up_proj.weight"));
        CHECK(contains(e, "missing"));
    }
    {
        TempDir d;
        fs::copy_file(golden_dir("tiny-llama2") + "/config.json", d / "config.json");
        std::vector<TensorToWrite> wrong = all;
        for (auto& t : wrong)
            if (t.name == "model.layers.0.mlp.gate_proj.weight") t.shape = {t.shape[1], t.shape[0]};
        write_safetensors(d / "model.safetensors", wrong);
        std::string e = error_of([&] { load(d.path.string()); });
        CHECK(contains(e, "model.layers.0.mlp.gate_proj.weight"));
        CHECK(contains(e, "has shape [64, 176], expected [176, 64]"));
    }
}

TEST_CASE("index.json naming a missing shard or a tensor the shard lacks") {
    TempDir d;
    const std::string g = golden_dir("tiny-gqa-llama3");
    fs::copy_file(g + "/config.json", d / "config.json");
    fs::copy_file(g + "/model-00001-of-00002.safetensors", d / "model-00001-of-00002.safetensors");
    fs::copy_file(g + "/model.safetensors.index.json", d / "model.safetensors.index.json");
    std::string e = error_of([&] { load(d.path.string()); });
    CHECK(contains(e, "model-00002-of-00002.safetensors"));
    CHECK(contains(e, "does not exist"));
    std::string idx = read_file(g + "/model.safetensors.index.json");
    write_file(d / "model.safetensors.index.json",
               R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors", "x": "../../etc/passwd"}})");
    e = error_of([&] { load(d.path.string()); });
    CHECK((contains(e, "not a file in the model directory") || contains(e, "does not hold")));
}

TEST_CASE("config.json: missing fields and inconsistent values name the field") {
    auto cfg_err = [](const std::string& json) { return error_of([&] { parse_hf_config(json, "cfg.json"); }); };
    const std::string base = read_file(golden_dir("tiny-llama2") + "/config.json");
    auto replace = [&](const std::string& from, const std::string& to) {
        std::string s = base;
        size_t p = s.find(from);
        REQUIRE(p != std::string::npos);
        return s.replace(p, from.size(), to);
    };
    CHECK(contains(cfg_err(replace("\"hidden_size\": 64,", "")), "hidden_size"));
    CHECK(contains(cfg_err(replace("\"num_attention_heads\": 4", "\"num_attention_heads\": 5")),
                   "does not divide hidden_size"));
    CHECK(contains(cfg_err(replace("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3")),
                   "num_key_value_heads 3 does not divide num_attention_heads 4"));
    CHECK(contains(cfg_err(replace("\"vocab_size\": 320", "\"vocab_size\": -3")), "vocab_size"));
    CHECK(contains(cfg_err(replace("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"")), "hidden_act"));
    CHECK(contains(cfg_err("{oops"), "not valid JSON"));
    CHECK(contains(cfg_err(replace("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"small\"")), "rms_norm_eps"));
    // A whole config file that is missing.
    CHECK(contains(error_of([] { load_hf_config("/nonexistent/config.json"); }), "/nonexistent/config.json"));
}

TEST_CASE("prompt too long for the context and token ids outside the vocab") {
    auto src = open_model(golden_dir("tiny-llama2"));
    CpuBackend be(CpuBackendOptions{1, false, false});
    Model model(*src, be, ModelOptions{}, nullptr);
    auto gen = make_local_engine(model);
    GenerateRequest req;
    req.prompt.assign(257, 5);  // max_position_embeddings is 256
    std::string e = error_of([&] { gen->generate(req); });
    CHECK(contains(e, "longer than the model's context"));
    req.prompt = {1, 320, 3};
    e = error_of([&] { gen->generate(req); });
    CHECK(contains(e, "320"));
    CHECK(contains(e, "outside the vocab"));
    req.prompt = {1, -1};
    CHECK(contains(error_of([&] { gen->score(req.prompt); }), "outside the vocab"));
}

TEST_CASE("safetensors header limits are checked before parsing and named") {
    auto parse = [](const std::string& img) {
        return error_of(
            [&] { parse_safetensors_header(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "x.st"); });
    };
    CHECK(contains(parse(raw_safetensors(std::string(1 << 20, '['), 0)), "nested deeper than 8"));
    std::string many = "{";
    for (int i = 0; i <= kMaxSafetensorsTensors; ++i) {  // (appended piece by piece: GCC 12's -Wrestrict
        many += i ? ",\"t" : "\"t";                       //  misfires on const char* + std::string&&)
        many += std::to_string(i);
        many += "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
    }
    many += "}";
    CHECK(contains(parse(raw_safetensors(many, 0)), "more than 65536 tensors"));
    std::string img = raw_safetensors("{}", 0);
    img[3] = 0x10;  // 256 MiB of header
    CHECK(contains(parse(img), "exceeds the 16777216 byte limit"));
    CHECK(contains(parse(raw_safetensors(R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", 8)),
                   "shape \"2\" is not a list of integers"));
    // Brackets inside strings do not count as nesting.
    const std::string quoted = R"({"__metadata__": {"k": "[[[[[[[[[[[[[[[[[[[[[[[[\"]]"}})";
    const std::string quoted_img = raw_safetensors(quoted, 0);
    CHECK_NOTHROW(
        parse_safetensors_header(reinterpret_cast<const uint8_t*>(quoted_img.data()), quoted_img.size(), "q.st"));
}

TEST_CASE("non-finite values: first_non_finite finds them in every float type") {
    std::vector<float> f(37, 1.0f);
    CHECK(first_non_finite(f.data(), DType::kF32, 37) == -1);
    f[29] = std::nanf("");
    f[33] = INFINITY;
    CHECK(first_non_finite(f.data(), DType::kF32, 37) == 29);
    CHECK(first_non_finite(f.data(), DType::kF32, 29) == -1);
    std::vector<uint16_t> h(19, f32_to_f16(2.0f)), b(19, f32_to_bf16(2.0f));
    h[18] = f32_to_f16(INFINITY);
    b[4] = f32_to_bf16(-INFINITY);
    CHECK(first_non_finite(h.data(), DType::kF16, 19) == 18);
    CHECK(first_non_finite(b.data(), DType::kBF16, 19) == 4);
    h[18] = f32_to_f16(65504.0f);  // the largest finite f16
    CHECK(first_non_finite(h.data(), DType::kF16, 19) == -1);
}

TEST_CASE("a NaN in any tensor is refused at load, naming the tensor and the element") {
    TempDir d;
    fs::copy_file(golden_dir("tiny-llama2") + "/config.json", d / "config.json");
    SafetensorsFile st(golden_dir("tiny-llama2") + "/model.safetensors");
    std::vector<TensorToWrite> all;
    std::vector<std::vector<float>> keep;
    for (const auto& [name, e] : st.entries()) {
        std::vector<float> v(size_t((e.end - e.begin) / dtype_size(e.dtype)));
        convert_elements(st.bytes(e), e.dtype, v.data(), DType::kF32, int64_t(v.size()));
        if (name == "model.layers.1.self_attn.o_proj.weight") v[size_t(5 * 64 + 9)] = -INFINITY;
        keep.push_back(std::move(v));
        all.push_back({name, DType::kF32, e.shape, keep.back().data()});
    }
    write_safetensors(d / "model.safetensors", all);
    const std::string e = error_of([&] { load(d.path.string()); });
    CHECK(contains(e, "model.layers.1.self_attn.o_proj.weight"));
    CHECK(contains(e, "-inf at [5, 9]"));
}

TEST_CASE("tensor set: extra layers, unused tensors and tie_word_embeddings beside lm_head") {
    const std::string g = golden_dir("tiny-llama2");
    auto with_config = [&](const std::string& from, const std::string& to) {
        auto d = std::make_unique<TempDir>();
        std::string c = read_file(g + "/config.json");
        const size_t p = c.find(from);
        REQUIRE(p != std::string::npos);
        write_file(*d / "config.json", c.replace(p, from.size(), to));
        fs::copy_file(g + "/model.safetensors", *d / "model.safetensors");
        return d;
    };
    auto fewer = with_config("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    std::string e = error_of([&] { load(fewer->path.string()); });
    CHECK(contains(e, "num_hidden_layers is 1"));
    CHECK(contains(e, "holds layers up to 1"));
    auto tied = with_config("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    e = error_of([&] { load(tied->path.string()); });
    CHECK(contains(e, "tie_word_embeddings is true"));
    CHECK(contains(e, "differs from model.embed_tokens.weight"));
    // The same with lm_head equal to the embedding: accepted (some exporters save both).
    SafetensorsFile st(g + "/model.safetensors");
    std::vector<TensorToWrite> all;
    for (const auto& [name, en] : st.entries()) all.push_back({name, en.dtype, en.shape, st.bytes(en)});
    for (auto& t : all)
        if (t.name == "lm_head.weight") t.data = st.bytes(*st.find("model.embed_tokens.weight"));
    const std::vector<float> inv_freq(8, 1.f);
    all.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {8}, inv_freq.data()});
    write_safetensors(*tied / "model.safetensors", all);
    CHECK_NOTHROW(load(tied->path.string()));
    // A tensor nothing uses (a bias: an unsupported feature) is refused.
    TempDir extra;
    fs::copy_file(g + "/config.json", extra / "config.json");
    std::vector<float> bias(64, 0.f);
    all.back() = {"model.layers.0.self_attn.q_proj.bias", DType::kF32, {64}, bias.data()};
    write_safetensors(extra / "model.safetensors", all);
    e = error_of([&] { load(extra.path.string()); });
    CHECK(contains(e, "model.layers.0.self_attn.q_proj.bias"));
    CHECK(contains(e, "does not use"));
}

TEST_CASE("config.json: non-integers, rope factors and absurd sizes") {
    auto cfg_err = [](const std::string& json) { return error_of([&] { parse_hf_config(json, "cfg.json"); }); };
    const std::string base = read_file(golden_dir("tiny-llama2") + "/config.json");
    auto replace = [&](const std::string& from, const std::string& to, std::string s = "") {
        if (s.empty()) s = base;
        size_t p = s.find(from);
        REQUIRE(p != std::string::npos);
        return s.replace(p, from.size(), to);
    };
    CHECK(contains(cfg_err(replace("\"hidden_size\": 64", "\"hidden_size\": 64.9")),
                   "\"hidden_size\" must be an integer, got 64.9"));
    CHECK(parse_hf_config(replace("\"hidden_size\": 64", "\"hidden_size\": 64.0"), "c").hidden == 64);
    CHECK(contains(cfg_err(replace("\"rope_scaling\": null", R"("rope_scaling": {"type": "linear", "factor": 0})")),
                   "rope_scaling factor 0"));
    CHECK(contains(cfg_err(replace("\"rope_theta\": 10000.0", "\"rope_theta\": -1")), "rope_theta"));
    const std::string huge = replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1000",
                                     replace("\"intermediate_size\": 176", "\"intermediate_size\": 2147483647"));
    CHECK(contains(cfg_err(replace("\"hidden_size\": 64", "\"hidden_size\": 2147483520", huge)), "parameters"));
    CHECK(contains(cfg_err(std::string(100000, '[')), "nested deeper than 16"));
}

TEST_CASE("GGUF: a lowered tensor count or bytes no tensor accounts for are refused") {
    test::GgufBuilder b;
    b.kv_str("general.architecture", "llama");
    std::vector<uint8_t> data(4 * 64, 0);
    b.tensor("a.weight", 0, {64}, data);
    b.tensor("b.weight", 0, {64}, data);
    b.tensor("c.weight", 0, {64}, data);
    std::vector<uint8_t> img = b.build();
    CHECK_NOTHROW(GgufFile::parse(img.data(), img.size(), "ok.gguf"));
    std::vector<uint8_t> lowered = img;
    test::GgufBuilder::patch<uint64_t>(lowered, 8, 2);
    CHECK(contains(error_of([&] { GgufFile::parse(lowered.data(), lowered.size(), "low.gguf"); }), "tensor count (2)"));
    std::vector<uint8_t> tail = img;
    tail.resize(tail.size() + 64, 0);
    CHECK(contains(error_of([&] { GgufFile::parse(tail.data(), tail.size(), "tail.gguf"); }),
                   "64 unaccounted bytes after the last tensor"));
    std::vector<uint8_t> gap = img;  // c moves one aligned slot further: 32 bytes nothing describes
    test::GgufBuilder::patch<uint64_t>(gap, b.tensor_offset_pos[2], 2 * 256 + 32);
    gap.resize(gap.size() + 32, 0);
    CHECK(contains(error_of([&] { GgufFile::parse(gap.data(), gap.size(), "gap.gguf"); }), "unaccounted bytes"));
}

TEST_CASE("GGUF of an architecture outside the table is refused, naming it and the supported ones") {
    test::GgufBuilder b;
    b.kv_str("general.architecture", "falcon");
    std::vector<uint8_t> data(4 * 64, 0);
    b.tensor("token_embd.weight", 0, {8, 8}, data);
    std::vector<uint8_t> img = b.build();
    TempDir d;
    const std::string path = d / "falcon.gguf";
    write_file(path, std::string(img.begin(), img.end()));
    CHECK(contains(error_of([&] { open_model(path); }),
                   "architecture 'falcon' is not supported; supported: llama, mistral, qwen2"));
}

TEST_CASE("odd files: FIFOs, directories and symlink loops are named, never opened blocking") {
    TempDir d;
    REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
    CHECK(contains(error_of([&] { read_regular_file(d / "fifo", 100, "config file"); }), "is a FIFO"));
    CHECK(contains(error_of([&] { GgufFile::open(d / "fifo"); }), "FIFO"));
    CHECK(contains(error_of([&] { load_hf_config(d.path.string()); }), "is a directory"));
    fs::create_symlink("loop", d / "loop");
    CHECK(contains(error_of([&] { open_model(d / "loop"); }), "symbolic links"));
    CHECK(contains(error_of([&] { AtomicWriter(d / "fifo", "--out"); }), "is a FIFO"));
    CHECK(contains(error_of([&] { AtomicWriter(d / "loop", "--out"); }), "symbolic link"));
    {
        AtomicWriter w(d / "out", "--out");
        w.write("partial");
    }  // dropped without commit: neither the target nor the temporary file exists
    CHECK(!fs::exists(d / "out"));
    int tmp_files = 0;
    for (const auto& e : fs::directory_iterator(d.path))
        tmp_files += e.path().string().find(".tmp.") != std::string::npos;
    CHECK(tmp_files == 0);
    AtomicWriter w(d / "out", "--out");
    w.write("done");
    w.commit();
    CHECK(read_file(d / "out") == "done");
}
