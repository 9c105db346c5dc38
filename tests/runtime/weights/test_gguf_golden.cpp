// The golden GGUF copies against their HF checkpoints (../shared/golden): config equality, every
// tensor equal (q/k after unpermute_qk_rows; f16 GGUF vs bf16 HF within fp16 rounding), llama3
// rope_freqs against ModelConfig::rope_inv_freq, and the built-in default model (SmolLM2-135M,
// models/ of the checkout) when scripts/fetch_default_model.sh has been run.
// The HF side is read by a deliberately independent ~40-line safetensors reader below, so a bug
// in the project's loader cannot hide a bug here.
#include "tests/test_paths.h"
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/arch/architecture.h"
#include "runtime/arch/config.h"
#include "runtime/weights/gguf.h"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(LATTICE_SHARED_DIR) + "/golden/";

// llama.cpp's converter permutation (HF row j * half + i of a head -> file row 2 * i + j): the
// inverse of what the GGUF source undoes, written independently here.
std::vector<float> permute_qk_rows(const std::vector<float>& hf, int64_t head_dim, int64_t cols) {
    std::vector<float> out(hf.size());
    const int64_t half = head_dim / 2, heads = int64_t(hf.size()) / (head_dim * cols);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j)
                std::copy_n(hf.begin() + ((h * head_dim) + j * half + i) * cols, cols,
                            out.begin() + ((h * head_dim) + 2 * i + j) * cols);
    return out;
}

struct HfTensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// All tensors of every *.safetensors in `dir`, converted to f32.
std::map<std::string, HfTensor> read_hf(const std::string& dir) {
    std::map<std::string, HfTensor> out;
    for (const auto& ent : fs::directory_iterator(dir)) {
        std::string p = ent.path().string();
        if (ent.path().extension() != ".safetensors" || ent.path().filename().string().rfind("model", 0) != 0) continue;
        std::ifstream f(p, std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        REQUIRE(bytes.size() >= 8);
        uint64_t n;
        std::memcpy(&n, bytes.data(), 8);
        auto header = nlohmann::json::parse(std::string(bytes.data() + 8, size_t(n)));
        const char* data = bytes.data() + 8 + n;
        for (auto& [name, v] : header.items()) {
            if (name == "__metadata__") continue;
            HfTensor t;
            t.shape = v["shape"].get<std::vector<int64_t>>();
            uint64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
            std::string dt = v["dtype"];
            const char* s = data + b;
            if (dt == "F32") {
                t.data.resize((e - b) / 4);
                std::memcpy(t.data.data(), s, e - b);
            } else {
                REQUIRE((dt == "BF16" || dt == "F16"));
                t.data.resize((e - b) / 2);
                for (size_t k = 0; k < t.data.size(); ++k) {
                    uint16_t h;
                    std::memcpy(&h, s + 2 * k, 2);
                    t.data[k] = dt == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
                }
            }
            out[name] = std::move(t);
        }
    }
    return out;
}

std::vector<float> read_all(const TensorSource& src, const std::string& name) {
    const TensorInfo& i = src.info(name);
    std::vector<float> v(size_t(i.rows() * i.cols()), -12345.0f);
    src.read(name, 0, i.rows(), 0, i.cols(), DType::kF32, v.data());
    return v;
}

bool is_qk(const std::string& name, bool* is_q) {
    *is_q = name.find("q_proj") != std::string::npos;
    return *is_q || name.find("k_proj") != std::string::npos;
}

void check_model(const std::string& model, const std::string& gguf_file, bool f16) {
    auto src = open_gguf_model(kGolden + "gguf/" + gguf_file);
    ModelConfig hf = load_hf_config(kGolden + model + "/config.json");
    const ModelConfig& g = src->config();
    CHECK(g.hidden == hf.hidden);
    CHECK(g.intermediate == hf.intermediate);
    CHECK(g.n_layers == hf.n_layers);
    CHECK(g.n_heads == hf.n_heads);
    CHECK(g.n_kv_heads == hf.n_kv_heads);
    CHECK(g.head_dim == hf.head_dim);
    CHECK(g.vocab == hf.vocab);
    CHECK(g.max_position == hf.max_position);
    CHECK(g.rms_eps == hf.rms_eps);
    CHECK(g.rope_theta == hf.rope_theta);
    CHECK(g.tie_embeddings == hf.tie_embeddings);
    CHECK(g.bos_id == hf.bos_id);
    CHECK(g.eos_ids == hf.eos_ids);

    auto ref = read_hf(kGolden + model);
    REQUIRE(!ref.empty());
    int compared = 0, permuted_differs = 0;
    for (const auto& entry : ref) {
        const std::string& name = entry.first;
        const HfTensor& t = entry.second;
        CAPTURE(name);
        REQUIRE(src->has(name));
        const TensorInfo& info = src->info(name);
        CHECK(info.shape == t.shape);
        std::vector<float> got = read_all(*src, name);
        REQUIRE(got.size() == t.data.size());
        bool q = false;
        if (is_qk(name, &q)) {
            // The source un-permutes q/k rows: in the file's order they must differ from HF's (the
            // test would be vacuous otherwise), and a slice of whole heads reads the same rows.
            const std::vector<float> file_order = permute_qk_rows(got, g.head_dim, info.cols());
            bool same = true;
            for (size_t k = 0; k < got.size(); ++k) same = same && file_order[k] == t.data[k];
            permuted_differs += !same;
            const int64_t heads = q ? g.n_heads : g.n_kv_heads;
            if (heads > 1) {
                std::vector<float> part(size_t(g.head_dim * info.cols()));
                src->read(name, g.head_dim, g.head_dim, 0, info.cols(), DType::kF32, part.data());
                CHECK(std::equal(part.begin(), part.end(), got.begin() + g.head_dim * info.cols()));
                CHECK_THROWS_AS(src->read(name, 1, g.head_dim, 0, info.cols(), DType::kF32, part.data()), Error);
            }
        }
        int64_t bad = 0;
        double max_err = 0;
        bool is_f16 = f16 && info.dtype == DType::kF16;
        CHECK(std::count(got.begin(), got.end(), 0.0f) < int64_t(got.size()));
        for (size_t k = 0; k < got.size(); ++k) {
            double err = std::fabs(double(got[k]) - double(t.data[k]));
            // f16 holds every bf16 value of moderate magnitude exactly; allow one fp16 rounding step anyway.
            double tol =
                is_f16 ? std::max(std::fabs(double(t.data[k])) * std::ldexp(1.0, -11), std::ldexp(1.0, -24)) : 0.0;
            if (err > tol) ++bad;
            max_err = std::max(max_err, err);
        }
        CHECK_MESSAGE(bad == 0, name << ": " << bad << " elements differ, max err " << max_err);
        ++compared;
    }
    CHECK(compared == int(ref.size()));
    CHECK(permuted_differs == 2 * hf.n_layers);
    // Every GGUF tensor with an HF name was compared (none extra besides lm_head when tied is absent).
    int64_t hf_named = 0;
    auto gf = GgufFile::open(kGolden + "gguf/" + gguf_file);
    for (const auto& t : gf->tensors()) hf_named += !gguf_to_hf_name(find_architecture("llama"), t.name).empty();
    CHECK(hf_named == int64_t(ref.size()));
}

}  // namespace

TEST_CASE("golden gguf: tiny-llama2 f32 equals the HF checkpoint") {
    check_model("tiny-llama2", "tiny-llama2.f32.gguf", false);
}

TEST_CASE("golden gguf: tiny-gqa-llama3 f16 equals the HF checkpoint, rope_freqs match llama3 scaling") {
    check_model("tiny-gqa-llama3", "tiny-gqa-llama3.f16.gguf", true);
    auto src = open_gguf_model(kGolden + "gguf/tiny-gqa-llama3.f16.gguf");
    ModelConfig hf = load_hf_config(kGolden + "tiny-gqa-llama3/config.json");
    REQUIRE(hf.rope_scaling.type == "llama3");
    std::vector<float> factors = src->rope_freq_factors();
    std::vector<float> inv = hf.rope_inv_freq();
    REQUIRE(factors.size() == size_t(hf.head_dim / 2));
    REQUIRE(inv.size() == factors.size());
    int scaled = 0;
    for (size_t i = 0; i < inv.size(); ++i) {
        double base = std::pow(hf.rope_theta, -2.0 * double(i) / double(hf.head_dim));
        CHECK_MESSAGE(std::fabs(base / factors[i] - inv[i]) <= 1e-5 * inv[i], "pair " << i);
        scaled += factors[i] != 1.0f;
    }
    CHECK(scaled > 0);
    CHECK(factors[0] == 1.0f);
}

TEST_CASE("golden gguf: tiny-fp16-tied equals the HF checkpoint (tied, no output.weight)") {
    check_model("tiny-fp16-tied", "tiny-fp16-tied.f16.gguf", true);
    auto src = open_gguf_model(kGolden + "gguf/tiny-fp16-tied.f16.gguf");
    CHECK(src->config().tie_embeddings);
    CHECK_FALSE(src->has("lm_head.weight"));
    CHECK(src->rope_freq_factors().empty());
}

TEST_CASE("golden gguf: metadata and tokenizer keys through GgufFile") {
    auto f = GgufFile::open(kGolden + "gguf/tiny-gqa-llama3.f16.gguf");
    CHECK(f->version() == 3);
    CHECK(f->string_value("general.architecture") == "llama");
    CHECK(f->string_value("tokenizer.ggml.model") == "llama");
    CHECK(f->string_array("tokenizer.ggml.tokens").size() == 1024);
    CHECK(f->string_array("tokenizer.ggml.tokens")[0] == "<unk>");
    CHECK(f->float_array("tokenizer.ggml.scores").size() == 1024);
    CHECK(f->int_array("tokenizer.ggml.token_type").size() == 1024);
    CHECK(f->int_value("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f->bool_value("tokenizer.ggml.add_bos_token") == false);
    CHECK(f->path() == kGolden + "gguf/tiny-gqa-llama3.f16.gguf");
}

TEST_CASE("unpermute_qk_rows inverts llama.cpp's permute") {
    // llama.cpp: w.reshape(n_head, 2, d/2, cols).swapaxes(1, 2).reshape(...)
    const int64_t heads = 3, d = 6, cols = 5;
    std::vector<float> hf(size_t(heads * d * cols));
    for (size_t k = 0; k < hf.size(); ++k) hf[k] = float(k) * 0.5f + 1.0f;
    std::vector<float> gguf = permute_qk_rows(hf, d, cols);
    CHECK(gguf != hf);
    unpermute_qk_rows(gguf.data(), heads, d, cols);
    CHECK(gguf == hf);
    // A slice of whole heads (head 1 only) works on its own.
    std::vector<float> one(hf.begin() + d * cols, hf.begin() + 2 * d * cols);
    std::vector<float> p = permute_qk_rows(one, d, cols);
    unpermute_qk_rows(p.data(), 1, d, cols);
    CHECK(p == one);
    CHECK_THROWS_AS(unpermute_qk_rows(p.data(), 1, 5, cols), Error);
}

TEST_CASE("gguf_to_hf_name: the architecture table's llama and qwen2 entries") {
    const Architecture& llama = find_architecture("llama");
    CHECK(gguf_to_hf_name(llama, "token_embd.weight") == "model.embed_tokens.weight");
    CHECK(gguf_to_hf_name(llama, "output.weight") == "lm_head.weight");
    CHECK(gguf_to_hf_name(llama, "output_norm.weight") == "model.norm.weight");
    CHECK(gguf_to_hf_name(llama, "blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight");
    CHECK(gguf_to_hf_name(llama, "blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight");
    CHECK(gguf_to_hf_name(llama, "blk.3.attn_norm.weight") == "model.layers.3.input_layernorm.weight");
    CHECK(gguf_to_hf_name(llama, "blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight");
    CHECK(gguf_to_hf_name(llama, "rope_freqs.weight").empty());
    CHECK(gguf_to_hf_name(llama, "blk.x.attn_q.weight").empty());
    CHECK(gguf_to_hf_name(llama, "blk.01.attn_q.weight").empty());
    CHECK(gguf_to_hf_name(llama, "blk..attn_q.weight").empty());
    CHECK(gguf_to_hf_name(llama, "blk.1.attn_q.bias").empty());  // llama has no q/k/v bias
    const Architecture& qwen2 = find_architecture("qwen2");
    CHECK(gguf_to_hf_name(qwen2, "blk.1.attn_q.bias") == "model.layers.1.self_attn.q_proj.bias");
    CHECK(gguf_to_hf_name(qwen2, "blk.0.attn_v.bias") == "model.layers.0.self_attn.v_proj.bias");
    CHECK(gguf_to_hf_name(qwen2, "blk.2.attn_k.weight") == "model.layers.2.self_attn.k_proj.weight");
    CHECK(architecture_for_gguf("qwen2") == &qwen2);
    CHECK(architecture_for_gguf("gemma2") == &find_architecture("gemma2"));
    CHECK(architecture_for_gguf("qwen3moe", true) == &find_architecture("qwen3_moe"));
    CHECK(architecture_for_gguf("falcon") == nullptr);
}

TEST_CASE("default model: SmolLM2-135M-Instruct Q4_1 (models/, after scripts/fetch_default_model.sh)") {
    const std::string path = test::default_model_file();
    REQUIRE_FILE(path);
    auto src = open_gguf_model(path);
    const ModelConfig& c = src->config();
    CHECK(c.hidden == 576);
    CHECK(c.n_layers == 30);
    CHECK(c.n_heads == 9);
    CHECK(c.n_kv_heads == 3);
    CHECK(c.head_dim == 64);
    CHECK(c.intermediate == 1536);
    CHECK(c.vocab == 49152);
    CHECK(c.tie_embeddings);
    CHECK(c.rope_theta == 100000.0);
    CHECK(c.rms_eps == 1e-5);
    CHECK(src->info("model.embed_tokens.weight").dtype == DType::kQ8_0);
    CHECK(src->info("model.layers.7.self_attn.q_proj.weight").dtype == DType::kQ4_1);
    CHECK(src->info("model.layers.7.input_layernorm.weight").dtype == DType::kF32);
    // A dequantized row is finite and not all zero.
    std::vector<float> row(1536, -12345.0f);
    src->read("model.layers.29.mlp.down_proj.weight", 575, 1, 0, 1536, DType::kF32, row.data());
    double sum = 0;
    for (float x : row) {
        REQUIRE(std::isfinite(x));
        sum += std::fabs(x);
    }
    CHECK(sum > 0);
    auto f = GgufFile::open(path);
    CHECK(f->string_value("tokenizer.ggml.model") == "gpt2");
    CHECK(f->string_value("tokenizer.ggml.pre") == "smollm");
    CHECK(f->string_value("tokenizer.chat_template").value_or("").find("im_start") != std::string::npos);
    CHECK(f->string_array("tokenizer.ggml.merges").size() == 48900);
}
