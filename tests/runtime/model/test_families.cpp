// The architecture table (runtime/arch/architecture.h) and the families beyond Llama: the Qwen2
// fixture (tests/runtime/model/families/qwen2, scripts/make_family_fixtures.py's float64 reference)
// from its GGUF copy (the HF folders of qwen2, qwen2-swa, mistral and mixtral run with every golden model in
// test_golden.cpp, test_layouts, test_quant_accuracy, SmoothQuant and the converter's tests; GGUF vs HF
// per TP rank and Mixtral's own checks are in test_moe.cpp); configs
// of unsupported families and options refused with a message naming them; a checkpoint whose tensors
// do not fit its family refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/convert.h"
#include "base/error.h"
#include "runtime/weights/safetensors.h"
#include "runtime/arch/architecture.h"
#include "runtime/arch/config.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/tensor_source.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/weights/gguf_builder.h"
#include "tests/test_temp_dir.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

namespace fs = std::filesystem;

nlohmann::json qwen2_config() {
    std::ifstream f(golden_dir("families/qwen2") + "/config.json");
    return nlohmann::json::parse(f);
}

// The message parse_hf_config throws for `j` ("" when it parses).
std::string refusal(const nlohmann::json& j) {
    try {
        parse_hf_config(j.dump(), "test/config.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}


}  // namespace

TEST_CASE("qwen2 from GGUF (llama.cpp's qwen2 names and q/k order): logits and greedy tokens of the reference") {
    const std::string m = "families/qwen2";
    auto src = open_model(golden_dir(m) + "/model.gguf");
    CHECK(src->config().family == "qwen2");
    CHECK(src->config().rope_theta == 1e6);
    check_golden_model(golden_dir(m) + "/model.gguf", load_golden(m), 1, 256);
}

TEST_CASE("the architecture table: qwen2 holds q/k/v biases split like their rows, llama none") {
    ModelConfig c = parse_hf_config(qwen2_config().dump(), "qwen2/config.json");
    CHECK(c.family == "qwen2");
    CHECK(c.sliding_window == 0);  // named in the config but off (use_sliding_window false)
    int biases = 0;
    for (const ExpectedTensor& t : expected_tensors(c)) {
        if (t.role == TensorRole::kBq) CHECK(t.shape == std::vector<int64_t>{c.q_dim()});
        if (t.role == TensorRole::kBk || t.role == TensorRole::kBv) CHECK(t.shape == std::vector<int64_t>{c.kv_dim()});
        if (t.role == TensorRole::kBq) CHECK(t.split == TpSplit::kQHeadRows);
        if (t.role == TensorRole::kBk) CHECK(t.split == TpSplit::kKvHeadRows);
        biases += t.role == TensorRole::kBq || t.role == TensorRole::kBk || t.role == TensorRole::kBv;
    }
    CHECK(biases == 3 * c.n_layers);
    CHECK(tensor_name(c, TensorRole::kBk, 1) == "model.layers.1.self_attn.k_proj.bias");
    const int64_t untied = c.parameter_count();
    ModelConfig llama = c;
    llama.family = "llama";
    for (const ExpectedTensor& t : expected_tensors(llama)) CHECK(t.role != TensorRole::kBq);
    CHECK(untied - llama.parameter_count() == c.n_layers * (c.q_dim() + 2 * c.kv_dim()));
}

TEST_CASE("unsupported architectures and options are refused at load, naming them") {
    nlohmann::json j = qwen2_config();
    j["model_type"] = "falcon";
    j["architectures"] = {"FalconForCausalLM"};
    CHECK(refusal(j).find("architecture 'falcon' is not supported; supported: llama, mistral, qwen2, qwen3, "
                          "qwen3_moe, mixtral, gemma2, gemma3, phi3") != std::string::npos);
    j.erase("model_type");  // the class name alone
    CHECK(refusal(j).find("architecture 'FalconForCausalLM' is not supported") != std::string::npos);
    // Families that need blocks lattice lacks are refused naming the reason.
    j["model_type"] = "deepseek_v3";
    j["architectures"] = {"DeepseekV3ForCausalLM"};
    CHECK(refusal(j).find("architecture 'deepseek_v3' is not supported: DeepSeek's multi-head latent attention "
                          "(MLA)") != std::string::npos);
    j.erase("model_type");
    j["architectures"] = {"DeepseekV2ForCausalLM"};
    CHECK(refusal(j).find("'DeepseekV2ForCausalLM' is not supported: DeepSeek's multi-head latent attention") !=
          std::string::npos);
    j["model_type"] = "gemma3";  // Gemma3ForConditionalGeneration: the vision tower is not loaded
    j["architectures"] = {"Gemma3ForConditionalGeneration"};
    CHECK(refusal(j).find("a Gemma 3 checkpoint with its vision tower is not loaded: use a text-only "
                          "Gemma3ForCausalLM checkpoint (model_type gemma3_text)") != std::string::npos);

    // Mistral's window is honoured (the families/mistral fixture checks the numbers); none is none.
    nlohmann::json m = qwen2_config();
    m["model_type"] = "mistral";
    m["architectures"] = {"MistralForCausalLM"};
    m.erase("use_sliding_window");
    m["sliding_window"] = 64;
    CHECK(parse_hf_config(m.dump(), "m").sliding_window == 64);
    m["sliding_window"] = nullptr;  // Mistral v0.2+: no window
    CHECK(parse_hf_config(m.dump(), "m").sliding_window == 0);
    m["sliding_window"] = -1;
    CHECK(refusal(m).find("sliding_window -1 must be >= 0") != std::string::npos);

    // Qwen2 applies its window only with use_sliding_window, and then only from max_window_layers on
    // (28 when not given; the families/qwen2-swa fixture checks the numbers). A layer_types list must be
    // that pattern; any other is refused naming the layer.
    nlohmann::json q = qwen2_config();
    CHECK(parse_hf_config(q.dump(), "q").sliding_window == 0);  // named, switched off
    q["use_sliding_window"] = true;
    ModelConfig qc = parse_hf_config(q.dump(), "q");
    CHECK(qc.sliding_window == 64);
    CHECK(qc.window_layer_begin == 28);
    q["max_window_layers"] = 1;
    CHECK(parse_hf_config(q.dump(), "q").window_layer_begin == 1);
    q["layer_types"] = {"full_attention", "sliding_attention"};
    CHECK(parse_hf_config(q.dump(), "q").window_layer_begin == 1);
    q["layer_types"] = {"sliding_attention", "full_attention"};
    CHECK(refusal(q).find("layer_types[0] is \"sliding_attention\" but sliding_window 64 from layer 1 gives "
                          "\"full_attention\"") != std::string::npos);
    q["layer_types"] = {"full_attention"};
    CHECK(refusal(q).find("layer_types must list 2 layers") != std::string::npos);
    q["max_window_layers"] = -1;
    q.erase("layer_types");
    CHECK(refusal(q).find("max_window_layers) -1 must be >= 0") != std::string::npos);
    q = qwen2_config();  // Qwen2.5 as saved by newer transformers: the window off, every layer full
    q["layer_types"] = {"full_attention", "full_attention"};
    CHECK(parse_hf_config(q.dump(), "q").sliding_window == 0);
    q = qwen2_config();
    q["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 64}};
    CHECK(refusal(q).find("rope_scaling type \"llama3\" is not supported for architecture 'qwen2'") !=
          std::string::npos);
    q["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    CHECK(refusal(q).find("rope_scaling type \"yarn\" unsupported") != std::string::npos);
}

TEST_CASE("a checkpoint whose tensors are not its family's is refused, naming the tensor") {
    // The qwen2 weights under a llama config: the biases have no place in the llama forward.
    TempDir tmp;
    nlohmann::json j = qwen2_config();
    j["model_type"] = "llama";
    j["architectures"] = {"LlamaForCausalLM"};
    j.erase("use_sliding_window");
    j.erase("sliding_window");
    std::ofstream(tmp.path / "config.json") << j.dump();
    fs::create_symlink(golden_dir("families/qwen2") + "/model.safetensors", tmp.path / "model.safetensors");
    auto src = open_model(tmp.path.string());
    CHECK(src->config().family == "llama");
    try {
        check_tensor_set(*src);
        FAIL("a llama config over qwen2 weights was accepted");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("the llama forward does not use") != std::string::npos);
        CHECK(msg.find("_proj.bias") != std::string::npos);
    }
}

TEST_CASE("the block families' configs: their options parsed, their variants refused by name") {
    auto config_of = [](const char* name) {
        std::ifstream f(golden_dir(std::string("families/") + name) + "/config.json");
        return nlohmann::json::parse(f);
    };
    nlohmann::json g2 = config_of("gemma2");
    ModelConfig c = parse_hf_config(g2.dump(), "gemma2");
    CHECK(c.family == "gemma2");
    CHECK(c.hidden_act == HiddenAct::kGeluTanh);
    CHECK(c.attention_scale() == doctest::Approx(1.0 / std::sqrt(24.0)));
    CHECK(c.attn_softcap == 3.0);
    CHECK(c.final_softcap == 1.5);
    CHECK((c.layer_windowed(0) && !c.layer_windowed(1) && c.layer_windowed(2)));  // local, global, local
    for (const ExpectedTensor& t : expected_tensors(c))
        if (t.role == TensorRole::kPostAttnNorm) CHECK(t.name.ends_with("post_attention_layernorm.weight"));
    CHECK(tensor_name(c, TensorRole::kFfnNorm, 1) == "model.layers.1.pre_feedforward_layernorm.weight");
    g2.erase("attn_logit_softcapping");  // transformers' defaults when absent, none when null
    g2["final_logit_softcapping"] = nullptr;
    c = parse_hf_config(g2.dump(), "gemma2");
    CHECK((c.attn_softcap == 50.0 && c.final_softcap == 0.0));
    g2["hidden_activation"] = "gelu";
    CHECK(refusal(g2).find("hidden_activation \"gelu\" unsupported for architecture 'gemma2' (only "
                           "gelu_pytorch_tanh)") != std::string::npos);

    nlohmann::json g3 = config_of("gemma3");
    c = parse_hf_config(g3.dump(), "gemma3");
    for (int64_t l = 0; l < 6; ++l) CHECK(c.layer_windowed(l) == (l != 5));  // 5 local, 1 global
    const std::vector<float> global = c.rope_inv_freq(), local = c.rope_inv_freq(true);
    CHECK(local[1] == doctest::Approx(std::pow(10000.0, -2.0 / 16)));  // the local base, unscaled
    CHECK(global[1] == doctest::Approx(std::pow(1e6, -2.0 / 16) / 4.0));  // rope_theta, linear factor 4
    g3["layer_types"] = nlohmann::json::array();
    for (int l = 0; l < 6; ++l) g3["layer_types"].push_back(l == 5 ? "full_attention" : "sliding_attention");
    CHECK(parse_hf_config(g3.dump(), "gemma3").window_pattern == 6);
    g3["layer_types"][0] = "full_attention";
    CHECK(refusal(g3).find("layer_types[0] is \"full_attention\"") != std::string::npos);

    nlohmann::json q3 = config_of("qwen3");
    c = parse_hf_config(q3.dump(), "qwen3");
    CHECK((c.head_dim == 16 && c.q_dim() != c.hidden));
    int qk = 0;
    for (const ExpectedTensor& t : expected_tensors(c))
        if (t.role == TensorRole::kQNorm || t.role == TensorRole::kKNorm) {
            CHECK(t.shape == std::vector<int64_t>{16});
            CHECK(t.split == TpSplit::kReplicated);
            ++qk;
        }
    CHECK(qk == 2 * c.n_layers);

    nlohmann::json p3 = config_of("phi3");
    c = parse_hf_config(p3.dump(), "phi3");
    CHECK(tensor_name(c, TensorRole::kWk, 1) == "model.layers.1.self_attn.qkv_proj.weight:k");  // a fused part
    CHECK(c.layer_windowed(0));
    p3["partial_rotary_factor"] = 0.75;  // Phi-3.5 / Phi-4-mini
    CHECK(refusal(p3).find("partial_rotary_factor 0.75 unsupported") != std::string::npos);
    p3.erase("partial_rotary_factor");
    p3["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
    CHECK(refusal(p3).find("longrope needs 8 short and long factors (head_dim / 2), got 1 and 1") !=
          std::string::npos);
    c = parse_hf_config(config_of("phi3-longrope").dump(), "phi3-longrope");
    CHECK(c.rope_attention_factor() == doctest::Approx(std::sqrt(1 + std::log(16.0) / std::log(8.0))));
    CHECK(c.rope_inv_freq(false, 8) != c.rope_inv_freq(false, 9));  // short factors up to 8 positions, long past
    nlohmann::json q3l = config_of("qwen3");
    q3l["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
    CHECK(refusal(q3l).find("rope_scaling type \"longrope\" is not supported for architecture 'qwen3'") !=
          std::string::npos);

    nlohmann::json m = config_of("qwen3-moe");
    c = parse_hf_config(m.dump(), "qwen3-moe");
    CHECK((c.n_experts == 8 && c.n_experts_used == 3 && c.intermediate == 24 && c.moe_renormalize));
    m.erase("norm_topk_prob");
    CHECK(!parse_hf_config(m.dump(), "m").moe_renormalize);  // transformers' default: false
    m["decoder_sparse_step"] = 2;
    CHECK(refusal(m).find("decoder_sparse_step 2 unsupported") != std::string::npos);
    m["decoder_sparse_step"] = 1;
    m["mlp_only_layers"] = {0};
    CHECK(refusal(m).find("mlp_only_layers [0] unsupported") != std::string::npos);
}

TEST_CASE("qwen3 from GGUF (llama.cpp's qwen3 names, q/k norms, q/k rows in HF order) equals its HF load") {
    // The families/qwen3 weights written as llama.cpp writes Qwen3 (no window: llama.cpp's qwen3 has none),
    // against the HF folder with its window switched off: the same forward over the same values.
    const std::string dir = golden_dir("families/qwen3");
    std::ifstream cf(dir + "/config.json");
    nlohmann::json j = nlohmann::json::parse(cf);
    j["use_sliding_window"] = false;
    TempDir tmp;
    fs::create_directories(tmp.path / "hf");
    std::ofstream(tmp.path / "hf" / "config.json") << j.dump();
    fs::create_symlink(dir + "/model.safetensors", tmp.path / "hf" / "model.safetensors");
    const ModelConfig c = parse_hf_config(j.dump(), "qwen3");
    test::GgufBuilder b;
    b.kv_str("general.architecture", "qwen3");
    b.kv_u32("qwen3.context_length", uint32_t(c.max_position));
    b.kv_u32("qwen3.embedding_length", uint32_t(c.hidden));
    b.kv_u32("qwen3.feed_forward_length", uint32_t(c.intermediate));
    b.kv_u32("qwen3.block_count", uint32_t(c.n_layers));
    b.kv_u32("qwen3.attention.head_count", uint32_t(c.n_heads));
    b.kv_u32("qwen3.attention.head_count_kv", uint32_t(c.n_kv_heads));
    b.kv_u32("qwen3.attention.key_length", uint32_t(c.head_dim));
    b.kv_u32("qwen3.attention.value_length", uint32_t(c.head_dim));
    b.kv_f32("qwen3.rope.freq_base", float(c.rope_theta));
    b.kv_f32("qwen3.attention.layer_norm_rms_epsilon", float(c.rms_eps));
    SafetensorsFile st(dir + "/model.safetensors");
    const Architecture& arch = find_architecture("qwen3");
    int written = 0;
    for (const TensorSpec& t : arch.tensors)
        for (int64_t l = 0; l < (t.per_layer ? c.n_layers : 1); ++l) {
            const std::string hf = t.per_layer ? "model.layers." + std::to_string(l) + "." + t.hf : t.hf;
            const SafetensorsEntry* e = st.find(hf);
            if (!e) continue;  // (the tied head)
            std::vector<uint64_t> ne(e->shape.rbegin(), e->shape.rend());
            const uint8_t* p = st.bytes(*e);
            b.tensor(t.per_layer ? "blk." + std::to_string(l) + "." + t.gguf : t.gguf, 1 /* F16 */, ne,
                     std::vector<uint8_t>(p, p + (e->end - e->begin)));
            ++written;
        }
    CHECK(written == int(st.entries().size()));
    const std::vector<uint8_t> img = b.build();
    std::ofstream(tmp.path / "qwen3.gguf", std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                                    std::streamsize(img.size()));
    auto gguf = open_model((tmp.path / "qwen3.gguf").string());
    CHECK(gguf->config().family == "qwen3");
    auto hf = open_model((tmp.path / "hf").string());
    const std::vector<int32_t> prompt = load_golden("families/qwen3").front().prompt;
    auto logits = [&](const TensorSource& src) {
        CpuBackend be(CpuBackendOptions{1, false, false});
        Model model(src, be, ModelOptions{}, nullptr);
        return make_local_engine(model)->score(prompt);
    };
    const std::vector<float> a = logits(*gguf), want = logits(*hf);
    REQUIRE(a.size() == want.size());
    CHECK(rel_error(a.data(), want.data(), a.size()) == 0.0);
}
