// GGUF checkpoints of the block families (Gemma 2, Gemma 3 text, Phi-3 with and without LongRoPE, Qwen3-MoE):
// each HF fixture (tests/runtime/model/families/<name>) rewritten here as llama.cpp's convert_hf_to_gguf.py
// writes that family (its names and metadata spelled below from gguf-py and the converter, not from lattice's
// table): Gemma's norms stored as 1 + w and no output.weight, Phi-3's fused attn_qkv / ffn_up and its LongRoPE
// factor tensors, Qwen3-MoE's experts merged into ffn_{gate,up,down}_exps with expert_feed_forward_length, f16
// weights with f32 norms and router. The GGUF load runs at 1 rank and tp 2 (mpirun -np 2) against the fixture's
// float64 reference (logits within 1e-5 relative, every greedy token); Gemma 2's fixture scales attention by a
// query_pre_attn_scalar a GGUF cannot carry (llama.cpp scales by head_dim), so its GGUF runs against the HF
// folder with that scalar set to head_dim. Then the variants refused by name: a vision tower's tensors, a
// missing key, LongRoPE with one factor list, a fused tensor of the wrong rows; llama.cpp's attention scale for
// the 27B Gemmas (known by their layer count) and soft-cap defaults; and Phi-3's fused tensors in Q4_0, whose
// parts a 4-bit load reads as raw blocks (their rows found in the file's tensor).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "base/convert.h"
#include "base/error.h"
#include "parallel/mpi_session.h"
#include "runtime/builder/build.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/safetensors.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/weights/gguf_builder.h"
#include "tests/test_temp_dir.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

namespace fs = std::filesystem;
constexpr uint32_t kF32 = 0, kF16 = 1;

nlohmann::json fixture_config(const std::string& name) {
    std::ifstream f(golden_dir("families/" + name) + "/config.json");
    return nlohmann::json::parse(f);
}

// gguf-py's names (tensor_mapping.py) for the HF names after "model.layers.N.", per family where they differ.
std::string gguf_layer_name(const std::string& arch, const std::string& hf) {
    const bool gemma = arch == "gemma2" || arch == "gemma3";
    static const std::map<std::string, std::string> kCommon = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.gate_up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    };
    if (hf == "post_attention_layernorm.weight") return gemma ? "post_attention_norm.weight" : "ffn_norm.weight";
    auto it = kCommon.find(hf);
    REQUIRE_MESSAGE(it != kCommon.end(), "no GGUF name for " << hf);
    return it->second;
}

std::vector<uint8_t> f16_to_f32_bytes(const uint8_t* p, int64_t n, float shift) {
    std::vector<float> f(static_cast<size_t>(n));
    convert_elements(p, DType::kF16, f.data(), DType::kF32, n);
    for (float& v : f) v += shift;
    std::vector<uint8_t> out(f.size() * 4);
    std::memcpy(out.data(), f.data(), out.size());
    return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& f) {
    std::vector<uint8_t> out(f.size() * 4);
    std::memcpy(out.data(), f.data(), out.size());
    return out;
}

// The metadata convert_hf_to_gguf.py writes for the family (keys in `skip` left out).
void twin_metadata(test::GgufBuilder& b, const std::string& arch, const nlohmann::json& j,
                   const std::set<std::string>& skip) {
    const std::string p = arch + ".";
    auto u32 = [&](const std::string& k, int64_t v) {
        if (!skip.count(p + k)) b.kv_u32(p + k, uint32_t(v));
    };
    auto f32 = [&](const std::string& k, double v) {
        if (!skip.count(p + k)) b.kv_f32(p + k, float(v));
    };
    b.kv_str("general.architecture", arch);
    u32("context_length", j["max_position_embeddings"]);
    u32("embedding_length", j["hidden_size"]);
    u32("feed_forward_length", j["intermediate_size"]);
    u32("block_count", j["num_hidden_layers"]);
    u32("attention.head_count", j["num_attention_heads"]);
    u32("attention.head_count_kv", j["num_key_value_heads"]);
    u32("attention.key_length", j["head_dim"]);  // (Phi-3's converter leaves it to hidden / heads, not the fixture's)
    u32("attention.value_length", j["head_dim"]);
    f32("attention.layer_norm_rms_epsilon", j["rms_norm_eps"]);
    f32("rope.freq_base", j["rope_theta"]);
    if (j.contains("sliding_window"))  // (phi3: null written as 0)
        u32("attention.sliding_window", j["sliding_window"].is_null() ? 0 : int(j["sliding_window"]));
    if (arch == "gemma2") {
        f32("attn_logit_softcapping", j["attn_logit_softcapping"]);
        f32("final_logit_softcapping", j["final_logit_softcapping"]);
    }
    if (arch == "gemma3" && j["rope_scaling"].is_object()) {
        if (!skip.count(p + "rope.scaling.type")) b.kv_str(p + "rope.scaling.type", "linear");
        f32("rope.scaling.factor", j["rope_scaling"]["factor"]);
    }
    if (arch == "phi3") {
        u32("rope.dimension_count", j["head_dim"]);
        u32("rope.scaling.original_context_length", j["original_max_position_embeddings"]);
        if (j["rope_scaling"].is_object()) {
            const double scale = double(j["max_position_embeddings"]) / double(j["original_max_position_embeddings"]);
            const double orig = double(j["original_max_position_embeddings"]);
            f32("rope.scaling.attn_factor", scale > 1 ? std::sqrt(1 + std::log(scale) / std::log(orig)) : 1.0);
        }
    }
    if (arch == "qwen3moe") {
        u32("expert_count", j["num_experts"]);
        u32("expert_used_count", j["num_experts_per_tok"]);
        u32("expert_feed_forward_length", j["moe_intermediate_size"]);
    }
    b.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(j["bos_token_id"]));
    b.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(j["eos_token_id"]));
}

// Qwen3-MoE's experts of one layer as llama.cpp's 3-D tensors (ne [cols, rows, experts], f16).
void twin_experts(test::GgufBuilder& b, const SafetensorsFile& st, int64_t layer, int64_t experts) {
    for (const char* proj : {"gate", "up", "down"}) {
        std::vector<uint8_t> data;
        std::vector<int64_t> shape;
        for (int64_t e = 0; e < experts; ++e) {
            const SafetensorsEntry* t = st.find("model.layers." + std::to_string(layer) + ".mlp.experts." +
                                                std::to_string(e) + "." + proj + "_proj.weight");
            REQUIRE(t != nullptr);
            shape = t->shape;
            data.insert(data.end(), st.bytes(*t), st.bytes(*t) + (t->end - t->begin));
        }
        b.tensor("blk." + std::to_string(layer) + ".ffn_" + proj + "_exps.weight", kF16,
                 {uint64_t(shape[1]), uint64_t(shape[0]), uint64_t(experts)}, std::move(data));
    }
}

// The fixture `name` as llama.cpp's converter writes it for `arch`; metadata keys and tensors named in `skip`
// left out. Tensors may be added to the builder before build().
test::GgufBuilder twin(const std::string& name, const std::string& arch, const std::set<std::string>& skip = {}) {
    const nlohmann::json j = fixture_config(name);
    test::GgufBuilder b;
    twin_metadata(b, arch, j, skip);
    const bool gemma = arch == "gemma2" || arch == "gemma3";
    SafetensorsFile st(golden_dir("families/" + name) + "/model.safetensors");
    std::set<int64_t> expert_layers;
    for (const auto& entry : st.entries()) {
        const std::string& hf = entry.first;
        const SafetensorsEntry& e = entry.second;
        std::string g;
        if (hf == "model.embed_tokens.weight") g = "token_embd.weight";
        else if (hf == "model.norm.weight") g = "output_norm.weight";
        else if (hf == "lm_head.weight") g = "output.weight";
        if (g.empty()) {
            REQUIRE(hf.rfind("model.layers.", 0) == 0);
            const size_t dot = hf.find('.', 13);
            const std::string layer = hf.substr(13, dot - 13), rest = hf.substr(dot + 1);
            if (rest.rfind("mlp.experts.", 0) == 0) {
                expert_layers.insert(std::stoll(layer));
                continue;
            }
            g = "blk." + layer + "." + gguf_layer_name(arch, rest);
        }
        if (skip.count(g)) continue;
        std::vector<uint64_t> ne(e.shape.rbegin(), e.shape.rend());
        const int64_t n = int64_t(e.end - e.begin) / 2;
        REQUIRE(e.dtype == DType::kF16);
        if (e.shape.size() == 1 || g.ends_with("ffn_gate_inp.weight"))  // norms and the router: f32
            b.tensor(g, kF32, ne, f16_to_f32_bytes(st.bytes(e), n, gemma && g.ends_with("norm.weight") ? 1.0f : 0.0f));
        else
            b.tensor(g, kF16, ne, std::vector<uint8_t>(st.bytes(e), st.bytes(e) + (e.end - e.begin)));
    }
    for (int64_t l : expert_layers) twin_experts(b, st, l, j["num_experts"]);
    if (arch == "phi3" && j["rope_scaling"].is_object())
        for (const char* k : {"long_factor", "short_factor"}) {
            const std::string g = std::string("rope_factors_") + (k[0] == 'l' ? "long" : "short") + ".weight";
            if (!skip.count(g))
                b.tensor(g, kF32, {uint64_t(j["rope_scaling"][k].size())},
                         f32_bytes(j["rope_scaling"][k].get<std::vector<float>>()));
        }
    return b;
}

std::string write(test::GgufBuilder& b, const TempDir& dir, const std::string& file) {
    const std::vector<uint8_t> img = b.build();
    std::ofstream(dir.path / file, std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                         std::streamsize(img.size()));
    return dir / file;
}

// What open_model throws for `path` ("" when it opens).
std::string refusal(const std::string& path) {
    try {
        open_model(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// The GGUF twin at 1 rank and tp 2 against `want` (per case: the reference's logits and greedy tokens).
void check_layouts(const TensorSource& gguf, const std::vector<GoldenCase>& want) {
    for (const GoldenCase& c : want)
        for (int tp : {1, 2}) {
            CAPTURE(tp);
            if (tp == 1 && mpi_session().rank() != 0) continue;
            const CaseRun r = run_case(gguf, tp, 1, c);
            CHECK(r.tokens == c.greedy);  // every rank agrees on every token
            if (r.rank != 0) continue;    // logits are delivered to world rank 0
            REQUIRE(r.logits.size() == c.logits.size());
            CHECK(rel_error(r.logits.data(), c.logits.data(), c.logits.size()) < 1e-5);
        }
}

}  // namespace

TEST_CASE("GGUF twins of the block families equal the float64 reference at 1 rank and tp 2") {
    REQUIRE(mpi_session().size() == 2);
    const std::pair<const char*, const char*> cases[] = {
        {"gemma3", "gemma3"}, {"phi3", "phi3"}, {"phi3-longrope", "phi3"}, {"qwen3-moe", "qwen3moe"}};
    for (const auto& [name, arch] : cases) {
        const std::string family = name;
        CAPTURE(family);
        TempDir tmp;  // one per rank
        test::GgufBuilder b = twin(name, arch);
        auto src = open_model(write(b, tmp, "model.gguf"));
        const ModelConfig& c = src->config();
        CHECK(c.family == parse_hf_config(fixture_config(name).dump(), name).family);
        check_layouts(*src, load_golden(std::string("families/") + name));
    }
}

TEST_CASE("Gemma 2's GGUF twin equals its HF load with query_pre_attn_scalar = head_dim, at 1 rank and tp 2") {
    nlohmann::json j = fixture_config("gemma2");
    REQUIRE(j["query_pre_attn_scalar"] != j["head_dim"]);  // the scalar the GGUF cannot carry
    j["query_pre_attn_scalar"] = j["head_dim"];
    TempDir tmp;
    fs::create_directories(tmp.path / "hf");
    std::ofstream(tmp.path / "hf" / "config.json") << j.dump();
    fs::create_symlink(golden_dir("families/gemma2") + "/model.safetensors", tmp.path / "hf" / "model.safetensors");
    test::GgufBuilder b = twin("gemma2", "gemma2");
    auto gguf = open_model(write(b, tmp, "model.gguf"));
    const ModelConfig& c = gguf->config();
    CHECK((c.family == "gemma2" && c.tie_embeddings && c.window_pattern == 2 && c.sliding_window == 4));
    CHECK((c.attn_softcap == 3.0 && c.final_softcap == 1.5 && c.query_pre_attn_scalar == 16.0));
    // The norms as HF stores them (the converter's + 1 taken off).
    auto hf = open_model((tmp.path / "hf").string());
    const std::string norm = "model.layers.1.post_feedforward_layernorm.weight";
    const int64_t hidden = c.hidden;
    std::vector<float> a(static_cast<size_t>(hidden)), w(static_cast<size_t>(hidden));
    gguf->read(norm, 0, 1, 0, hidden, DType::kF32, a.data());
    hf->read(norm, 0, 1, 0, hidden, DType::kF32, w.data());
    CHECK(a == w);
    // The HF load at tp 2 (test_block_families checks that layout against the reference): tokens on every
    // rank, logits on rank 0.
    std::vector<GoldenCase> want = load_golden("families/gemma2");
    for (GoldenCase& g : want) {
        const CaseRun r = run_case(*hf, 2, 1, g);
        g.greedy = r.tokens;
        g.logits = r.logits;
    }
    check_layouts(*gguf, want);
}

TEST_CASE("GGUF variants of the block families refused by name") {
    if (mpi_session().rank() != 0) return;
    TempDir tmp;
    auto refused = [&](test::GgufBuilder& b, const std::string& file) { return refusal(write(b, tmp, file)); };

    // A Gemma 3 GGUF carrying its vision tower (llama.cpp writes that to a separate mmproj file).
    test::GgufBuilder vision = twin("gemma3", "gemma3");
    vision.tensor("v.blk.0.attn_q.weight", kF32, {4, 4}, std::vector<uint8_t>(64, 0));
    CHECK(refused(vision, "vision.gguf").find("tensor \"v.blk.0.attn_q.weight\" belongs to a vision tower") !=
          std::string::npos);
    test::GgufBuilder mmproj;
    mmproj.kv_str("general.architecture", "clip");
    CHECK(refused(mmproj, "mmproj.gguf").find("vision projector (mmproj)") != std::string::npos);

    // Qwen3-MoE without its experts' width (feed_forward_length is the dense intermediate_size).
    test::GgufBuilder moe = twin("qwen3-moe", "qwen3moe", {"qwen3moe.expert_feed_forward_length"});
    CHECK(refused(moe, "moe.gguf").find("missing metadata key \"qwen3moe.expert_feed_forward_length\"") !=
          std::string::npos);

    test::GgufBuilder counts = twin("qwen3-moe", "qwen3moe", {"qwen3moe.expert_count"});
    CHECK(refused(counts, "counts.gguf").find("architecture 'qwen3moe' is a mixture of experts but "
                                              "qwen3moe.expert_count is missing") != std::string::npos);

    // LongRoPE with one factor list, or without its original context length.
    test::GgufBuilder one = twin("phi3-longrope", "phi3", {"rope_factors_short.weight"});
    CHECK(refused(one, "one.gguf").find("LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight") !=
          std::string::npos);
    test::GgufBuilder orig = twin("phi3-longrope", "phi3", {"phi3.rope.scaling.original_context_length"});
    CHECK(refused(orig, "orig.gguf").find("missing metadata key \"phi3.rope.scaling.original_context_length\"") !=
          std::string::npos);

    // A fused q|k|v of the wrong rows (one kv head short).
    const nlohmann::json pj = fixture_config("phi3");
    const int64_t hidden = pj["hidden_size"], hd = pj["head_dim"];
    const int64_t rows = (int64_t(pj["num_attention_heads"]) + 2 * int64_t(pj["num_key_value_heads"])) * hd;
    test::GgufBuilder fused = twin("phi3", "phi3", {"blk.1.attn_qkv.weight"});
    fused.tensor("blk.1.attn_qkv.weight", kF16, {uint64_t(hidden), uint64_t(rows - hd)},
                 std::vector<uint8_t>(size_t(hidden * (rows - hd) * 2), 0));
    CHECK(refused(fused, "fused.gguf")
              .find(fmt::format("tensor \"blk.1.attn_qkv.weight\" has shape [{}, {}] (GGUF order), expected 2 dims "
                                "with its 3 parts' {} rows",
                                hidden, rows - hd, rows)) != std::string::npos);

    // A tensor nothing maps (a shared expert, which lattice's Qwen3-MoE has not) is refused by its name.
    test::GgufBuilder shexp = twin("qwen3-moe", "qwen3moe");
    shexp.tensor("blk.0.ffn_up_shexp.weight", kF16, {32, 16}, std::vector<uint8_t>(32 * 16 * 2, 0));
    auto src = open_model(write(shexp, tmp, "shexp.gguf"));
    CHECK_THROWS_WITH_AS(check_tensor_set(*src), doctest::Contains("blk.0.ffn_up_shexp.weight"), Error);
}

TEST_CASE("Gemma GGUF metadata: llama.cpp's attention scale by size, soft-cap defaults, Gemma 3's local rope") {
    if (mpi_session().rank() != 0) return;
    TempDir tmp;
    // Metadata and the embedding only: gguf_model_config reads no other tensor.
    auto config = [&](const std::string& arch, int layers, bool caps) {
        test::GgufBuilder b;
        const std::string p = arch + ".";
        b.kv_str("general.architecture", arch);
        b.kv_u32(p + "embedding_length", 64);
        b.kv_u32(p + "feed_forward_length", 128);
        b.kv_u32(p + "block_count", uint32_t(layers));
        b.kv_u32(p + "attention.head_count", 4);
        b.kv_u32(p + "attention.head_count_kv", 2);
        b.kv_u32(p + "attention.key_length", 32);
        b.kv_u32(p + "attention.sliding_window", 8);
        b.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
        if (caps) b.kv_f32(p + "final_logit_softcapping", 20.0f);
        b.tensor("token_embd.weight", kF32, {64, 16}, std::vector<uint8_t>(64 * 16 * 4, 0));
        const std::string path = write(b, tmp, arch + std::to_string(layers) + ".gguf");
        return gguf_model_config(*GgufFile::open(path));
    };
    ModelConfig c = config("gemma2", 4, false);
    CHECK((c.query_pre_attn_scalar == 32 && c.attn_softcap == 50 && c.final_softcap == 30));  // head_dim; defaults
    CHECK((c.hidden_act == HiddenAct::kGeluTanh && c.window_pattern == 2));
    CHECK((c.layer_windowed(0) && !c.layer_windowed(1)));
    c = config("gemma2", 46, false);  // the 27B: (hidden / heads)^-0.5
    CHECK(c.query_pre_attn_scalar == 16);
    c = config("gemma3", 6, true);
    CHECK((c.query_pre_attn_scalar == 32 && c.attn_softcap == 0 && c.final_softcap == 20));
    CHECK((c.window_pattern == 6 && c.rope_local_theta == 10000 && c.rope_theta == 10000));
    CHECK(config("gemma3", 62, false).query_pre_attn_scalar == 16);
}

TEST_CASE("Phi-3's fused attn_qkv / ffn_up in Q4_0: each part's raw blocks and 4-bit form are its own rows") {
    if (mpi_session().rank() != 0) return;
    const nlohmann::json j = fixture_config("phi3");
    const int64_t hidden = j["hidden_size"], hd = j["head_dim"], ffn = j["intermediate_size"];
    const int64_t q_rows = int64_t(j["num_attention_heads"]) * hd, kv_rows = int64_t(j["num_key_value_heads"]) * hd;
    const int64_t qkv_rows = q_rows + 2 * kv_rows, block = 18;  // Q4_0: f16 d + 16 bytes of nibbles per 32
    std::vector<uint8_t> qkv(size_t(qkv_rows * hidden / 32 * block)), up(size_t(2 * ffn * hidden / 32 * block));
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = uint8_t(i * 7 + 3);
    for (size_t i = 0; i < up.size(); ++i) up[i] = uint8_t(i * 5 + 1);
    for (std::vector<uint8_t>* t : {&qkv, &up})  // finite scales: d = 2^-6 in every block
        for (size_t o = 0; o < t->size(); o += block) (*t)[o] = 0x00, (*t)[o + 1] = 0x24;
    test::GgufBuilder b = twin("phi3", "phi3", {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"});
    b.tensor("blk.0.attn_qkv.weight", 2 /* Q4_0 */, {uint64_t(hidden), uint64_t(qkv_rows)}, qkv);
    b.tensor("blk.0.ffn_up.weight", 2, {uint64_t(hidden), uint64_t(2 * ffn)}, up);
    TempDir tmp;
    auto src = open_model(write(b, tmp, "q4.gguf"));
    const int64_t row_bytes = hidden / 32 * block;
    // (part, its first row in the file's tensor, the tensor's bytes); a tp 2 rank's slice: the part's second half.
    const struct {
        const char* part;
        int64_t first, rows;
        const std::vector<uint8_t>* file;
    } parts[] = {{"self_attn.qkv_proj.weight:q", 0, q_rows, &qkv},
                 {"self_attn.qkv_proj.weight:k", q_rows, kv_rows, &qkv},
                 {"self_attn.qkv_proj.weight:v", q_rows + kv_rows, kv_rows, &qkv},
                 {"mlp.gate_up_proj.weight:gate", 0, ffn, &up},
                 {"mlp.gate_up_proj.weight:up", ffn, ffn, &up}};
    for (const auto& p : parts) {
        const std::string name = std::string("model.layers.0.") + p.part;
        CAPTURE(name);
        REQUIRE(src->info(name).shape == std::vector<int64_t>{p.rows, hidden});
        const int64_t row0 = p.rows / 2, rows = p.rows - row0;
        std::vector<uint8_t> raw(size_t(rows * row_bytes));
        src->read(name, row0, rows, 0, hidden, DType::kQ4_0, raw.data());
        const uint8_t* want = p.file->data() + (p.first + row0) * row_bytes;
        CHECK(std::equal(raw.begin(), raw.end(), want));
        const Int4Weights w = src->read_int4(name, row0, rows, 0, hidden);
        REQUIRE(w.d.size() == size_t(rows * hidden / 32));
        CHECK(std::memcmp(w.qs.data(), want + 2, 16) == 0);  // the first block's nibbles, as stored
        CHECK(w.d[0] == 0x2400);
    }
}
