// Bad checkpoints, configs and prompts: each is rejected with an Error whose message names the
// culprit (file, tensor, field or token); nothing crashes.
#include "tests/runtime/model/golden.h"

#include "base/error.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/engine/build.h"
#include "runtime/model/model.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/tensor_source.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>

using namespace lattice;
using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("lattice-bad-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    static int& counter() {
        static int c = 0;
        return c;
    }
    std::string operator/(const std::string& n) const { return (path / n).string(); }
};

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

// Runs fn and returns the Error message (fails the test if nothing is thrown).
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    FAIL("expected lattice::Error");
    return "";
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
