// Mixture of experts (Mixtral): the routing (softmax, top k, renormalized, grouped by expert) against
// hand-computed values; the architecture table's MoE entry (names, shapes, splits, parameter count);
// configs refused naming the field; the families/mixtral fixture from its GGUF copy (llama.cpp's merged
// ffn_*_exps tensors, and the older one-tensor-per-expert layout rebuilt from it) against the float64
// reference; every TP rank reads the same expert slices from HF and GGUF; a decode step runs only the
// num_experts_per_tok experts its token is routed to. The HF fixture itself runs through every golden
// suite (golden.h's golden_models(): one rank, layouts, W8A16 / W8A8, SmoothQuant, the converter).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/convert.h"
#include "base/error.h"
#include "runtime/arch/architecture.h"
#include "runtime/arch/config.h"
#include "runtime/model/moe_routing.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/tensor_source.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/weights/gguf_builder.h"
#include "tests/test_temp_dir.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

namespace fs = std::filesystem;

const std::string kMixtral = "families/mixtral";

nlohmann::json mixtral_config() {
    std::ifstream f(golden_dir(kMixtral) + "/config.json");
    return nlohmann::json::parse(f);
}

std::string refusal(const nlohmann::json& j) {
    try {
        parse_hf_config(j.dump(), "test/config.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}


// Rewrites `src` (scalar metadata copied) with each tensor passed through `split`: it returns the
// tensors to write in its place (itself unchanged for most).
template <typename Split>
void rewrite_gguf(const GgufFile& src, const std::string& out, Split split) {
    test::GgufBuilder b;
    for (const std::string& k : src.keys()) {
        const GgufValue& v = *src.find(k);
        switch (v.type) {
            case GgufType::kString:
                b.kv_str(k, v.s);
                break;
            case GgufType::kF32:
                b.kv_f32(k, float(v.f));
                break;
            case GgufType::kF64:
                b.kv_f64(k, v.f);
                break;
            case GgufType::kBool:
                b.kv_bool(k, v.i != 0);
                break;
            case GgufType::kU32:
                b.kv_u32(k, uint32_t(v.u));
                break;
            case GgufType::kI32:
                b.kv_i32(k, int32_t(v.i));
                break;
            case GgufType::kU64:
                b.kv_u64(k, v.u);
                break;
            default:
                FAIL("rewrite_gguf: metadata key ", k, " of an unexpected type");
        }
    }
    for (const GgufTensor& t : src.tensors()) {
        const uint8_t* d = src.tensor_data(t);
        for (auto& [name, ne, bytes] : split(t, std::vector<uint8_t>(d, d + t.nbytes))) {
            std::vector<uint64_t> une(ne.begin(), ne.end());
            b.tensor(name, t.ggml_type, une, std::move(bytes));
        }
    }
    const std::vector<uint8_t> img = b.build();
    std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
}

struct GgufPart {
    std::string name;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

}  // namespace

TEST_CASE("route_tokens: softmax, the top k (lower index first among equals), renormalized, grouped by expert") {
    // Token 0 prefers 3 then 2; token 1 ties experts 0, 1 and 3; token 2 prefers 2 then 1.
    const std::vector<float> logits = {0, 1, 2, 3, 5, 5, 0, 5, -1, 4, 4.5f, -3};
    MoeRoutes r;
    route_tokens(logits.data(), 3, 4, 2, true, &r);
    CHECK(r.begin == std::vector<int32_t>{0, 1, 3, 5, 6});
    CHECK(r.tokens == std::vector<int32_t>{1, 1, 2, 0, 2, 0});  // batch order within each expert
    const float s = float(1 / (1 + std::exp(-1.0))), t = float(1 / (1 + std::exp(-0.5)));
    const std::vector<float> want = {0.5f, 0.5f, 1 - t, 1 - s, t, s};
    for (size_t i = 0; i < want.size(); ++i) CHECK(r.weights[i] == doctest::Approx(want[i]).epsilon(1e-6));

    // Without renormalization the weights stay softmax probabilities over all experts.
    route_tokens(logits.data(), 3, 4, 2, false, &r);
    const double z0 = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    CHECK(r.weights[5] == doctest::Approx(std::exp(3.0) / z0).epsilon(1e-6));  // token 0, expert 3
    CHECK(r.weights[0] == doctest::Approx(std::exp(5.0) / (3 * std::exp(5.0) + 1)).epsilon(1e-6));

    // k = E: every expert, each token once; a decode batch of one token: k slots.
    route_tokens(logits.data(), 3, 4, 4, true, &r);
    CHECK(r.tokens.size() == 12);
    for (int64_t e = 0; e < 4; ++e) CHECK(r.count(e) == 3);
    route_tokens(logits.data() + 8, 1, 4, 2, true, &r);
    CHECK(r.begin == std::vector<int32_t>{0, 0, 1, 2, 2});

    std::vector<float> bad = logits;
    bad[6] = NAN;
    try {
        route_tokens(bad.data(), 3, 4, 2, true, &r);
        FAIL("a NaN router logit was routed");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("logit of token 1 for expert 2 is nan") != std::string::npos);
    }
    CHECK_THROWS_AS(route_tokens(logits.data(), 3, 4, 5, true, &r), Error);
}

TEST_CASE("the architecture table: mixtral's router and experts replace the MLP, split like a dense FFN") {
    const ModelConfig c = parse_hf_config(mixtral_config().dump(), "mixtral/config.json");
    CHECK(c.family == "mixtral");
    CHECK(c.n_experts == 4);
    CHECK(c.n_experts_used == 2);
    CHECK(c.sliding_window == 0);  // Mixtral's configs ship "sliding_window": null
    int router = 0, gate = 0, up = 0, down = 0;
    for (const ExpectedTensor& t : expected_tensors(c)) {
        CAPTURE(t.name);
        CHECK(t.role != TensorRole::kWGate);
        CHECK(t.role != TensorRole::kWUp);
        CHECK(t.role != TensorRole::kWDown);
        if (t.role == TensorRole::kRouter) {
            router += 1;
            CHECK(t.split == TpSplit::kReplicated);
            CHECK(t.shape == std::vector<int64_t>{4, c.hidden});
        }
        if (t.role == TensorRole::kExpGate || t.role == TensorRole::kExpUp) {
            (t.role == TensorRole::kExpGate ? gate : up) += 1;
            CHECK(t.split == TpSplit::kFfnRows);
            CHECK(t.shape == std::vector<int64_t>{c.intermediate, c.hidden});
        }
        if (t.role == TensorRole::kExpDown) {
            down += 1;
            CHECK(t.split == TpSplit::kFfnCols);
            CHECK(t.shape == std::vector<int64_t>{c.hidden, c.intermediate});
        }
    }
    CHECK(router == c.n_layers);
    CHECK(gate == 4 * c.n_layers);
    CHECK(up == 4 * c.n_layers);
    CHECK(down == 4 * c.n_layers);
    CHECK(tensor_name(c, TensorRole::kExpUp, 1, 3) == "model.layers.1.block_sparse_moe.experts.3.w3.weight");
    CHECK_THROWS_AS(tensor_name(c, TensorRole::kExpUp, 1, 4), Error);
    CHECK(tensor_name(c, TensorRole::kRouter, 0) == "model.layers.0.block_sparse_moe.gate.weight");

    // Names: llama.cpp's older per-expert GGUF names, and HF names back to their roles.
    const Architecture& a = find_architecture("mixtral");
    CHECK(gguf_to_hf_name(a, "blk.1.ffn_down.3.weight") == "model.layers.1.block_sparse_moe.experts.3.w2.weight");
    CHECK(gguf_to_hf_name(a, "blk.1.ffn_gate_inp.weight") == "model.layers.1.block_sparse_moe.gate.weight");
    CHECK(gguf_to_hf_name(a, "blk.1.ffn_down.03.weight").empty());
    CHECK(gguf_to_hf_name(a, "blk.1.ffn_down..weight").empty());
    CHECK(gguf_to_hf_name(a, "blk.1.ffn_down.weight").empty());
    TensorRole role{};
    CHECK(hf_role_of(a, "model.layers.0.block_sparse_moe.experts.12.w1.weight", &role));
    CHECK(role == TensorRole::kExpGate);
    CHECK_FALSE(hf_role_of(a, "model.layers.0.block_sparse_moe.experts.*.w1.weight", &role));
    CHECK_FALSE(hf_role_of(a, "model.layers.0.mlp.down_proj.weight", &role));
    CHECK(gguf_merged_spec(a, "ffn_up_exps.weight")->role == TensorRole::kExpUp);

    // Every expert counts: the dense model of the same shapes plus 3 more experts' FFNs and the router.
    ModelConfig dense = c;
    dense.family = "mistral";
    dense.n_experts = dense.n_experts_used = 0;
    CHECK(c.parameter_count() - dense.parameter_count() ==
          c.n_layers * (3 * 3 * c.hidden * c.intermediate + 4 * c.hidden));
    CHECK(std::abs(c.parameter_count_estimate() - double(c.parameter_count())) < 1.0);
    CHECK(c.dims().n_experts == 4);
    CHECK(c.dims().n_experts_used == 2);
}

TEST_CASE("mixtral configs without experts, or routing to more experts than there are, are refused naming the field") {
    nlohmann::json j = mixtral_config();
    j["num_experts_per_tok"] = 5;
    CHECK(refusal(j).find("num_experts_per_tok 5") != std::string::npos);
    j["num_experts_per_tok"] = 0;
    CHECK(refusal(j).find("num_experts_per_tok 0") != std::string::npos);
    j = mixtral_config();
    j.erase("num_local_experts");
    CHECK(refusal(j).find("num_local_experts") != std::string::npos);
    j = mixtral_config();
    j["num_local_experts"] = 0;
    CHECK(refusal(j).find("num_local_experts 0") != std::string::npos);
    j["num_local_experts"] = 100000;
    CHECK(refusal(j).find("num_local_experts 100000") != std::string::npos);
    j = mixtral_config();  // a window shorter than the context is Mistral's, honoured
    j["sliding_window"] = 8;
    CHECK(parse_hf_config(j.dump(), "m").sliding_window == 8);
}

TEST_CASE("mixtral from GGUF (llama.cpp's layout: \"llama\" with expert_count, merged ffn_*_exps): the reference") {
    auto src = open_model(golden_dir(kMixtral) + "/model.gguf");
    CHECK(src->config().family == "mixtral");
    CHECK(src->config().n_experts == 4);
    CHECK(src->config().n_experts_used == 2);
    check_golden_model(golden_dir(kMixtral) + "/model.gguf", load_golden(kMixtral), 1, 256);
}

TEST_CASE("GGUF and HF give every TP rank the same tensors (qwen2 biases; mixtral's router and expert slices)") {
    for (const std::string m : {"families/qwen2", "families/mixtral"}) {
        CAPTURE(m);
        auto hf = open_model(golden_dir(m));
        auto gg = open_model(golden_dir(m) + "/model.gguf");
        const ModelConfig& c = hf->config();
        for (int tp : {1, 2, 4}) {  // tp 4 > 2 kv heads: each rank holds a replicated kv head (and its bias)
            for (int r = 0; r < tp; ++r) {
                CAPTURE(tp);
                CAPTURE(r);
                const ModelOptions o = rank_model_options(ModelOptions{}, WorldConfig::make(tp, tp, 1, r), c.n_layers);
                RankWeights a(*hf, o), b(*gg, o);
                REQUIRE(a.tensors().size() == b.tensors().size());
                int biases = 0, experts = 0;
                for (size_t i = 0; i < a.tensors().size(); ++i) {
                    const RankTensor& t = a.tensors()[i];
                    CAPTURE(t.name);
                    REQUIRE(t.name == b.tensors()[i].name);
                    HostTensor x = a.read(t), y = b.read(b.tensors()[i]);
                    REQUIRE(x.rows * x.cols == y.rows * y.cols);
                    std::vector<float> fx(size_t(x.rows * x.cols)), fy(fx.size());
                    convert_elements(x.data.data(), x.dtype, fx.data(), DType::kF32, int64_t(fx.size()));
                    convert_elements(y.data.data(), y.dtype, fy.data(), DType::kF32, int64_t(fy.size()));
                    CHECK(fx == fy);
                    biases += t.role == WeightRole::kBqkv;
                    experts += t.role == WeightRole::kExpGateUp;
                }
                CHECK(biases == (c.family == "qwen2" ? c.n_layers : 0));
                CHECK(experts == c.n_layers * c.n_experts);
            }
        }
    }
}

TEST_CASE(
    "mixtral from an older GGUF (one ffn_*.E tensor per expert) gives the reference; a wrong expert count is refused") {
    auto gg = GgufFile::open(golden_dir(kMixtral) + "/model.gguf");
    TempDir tmp;
    // The merged [experts, rows, cols] tensors cut into one [rows, cols] tensor per expert, named as
    // llama.cpp's converter named them before the merge (blk.N.ffn_gate.E.weight).
    const std::string split_path = (tmp.path / "split.gguf").string();
    rewrite_gguf(*gg, split_path, [](const GgufTensor& t, std::vector<uint8_t> bytes) {
        std::vector<GgufPart> out;
        const size_t at = t.name.find("_exps.weight");
        if (at == std::string::npos) {
            out.push_back({t.name, t.ne, std::move(bytes)});
            return out;
        }
        const size_t per = bytes.size() / size_t(t.ne[2]);
        for (int64_t e = 0; e < t.ne[2]; ++e)
            out.push_back({t.name.substr(0, at) + "." + std::to_string(e) + ".weight",
                           {t.ne[0], t.ne[1]},
                           std::vector<uint8_t>(bytes.begin() + e * per, bytes.begin() + (e + 1) * per)});
        return out;
    });
    check_golden_model(split_path, load_golden(kMixtral), 1, 256);

    // Layer 1's merged up tensor holding 3 experts where expert_count says 4.
    const std::string short_path = (tmp.path / "short.gguf").string();
    rewrite_gguf(*gg, short_path, [](const GgufTensor& t, std::vector<uint8_t> bytes) {
        std::vector<int64_t> ne = t.ne;
        if (t.name == "blk.1.ffn_up_exps.weight") {
            ne[2] = 3;
            bytes.resize(bytes.size() / 4 * 3);
        }
        return std::vector<GgufPart>{{t.name, ne, std::move(bytes)}};
    });
    try {
        open_model(short_path);
        FAIL("a merged expert tensor with 3 of 4 experts was accepted");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("blk.1.ffn_up_exps.weight") != std::string::npos);
        CHECK(msg.find("4 experts") != std::string::npos);
    }
}

TEST_CASE("CpuBackend row moves: gather, weighted scatter-add, and a row outside the tensor refused naming it") {
    CpuBackend be(CpuBackendOptions{1, false, false});
    std::vector<float> src = {1, 2, 3, 4, 5, 6}, dst(4, -1.0f), acc = {10, 20, 30, 40, 50, 60};
    std::vector<int32_t> rows = {2, 0};
    std::vector<float> w = {0.5f, 2.0f};
    const View s = View::contiguous(src.data(), DType::kF32, {3, 2}),
               d = View::contiguous(dst.data(), DType::kF32, {2, 2});
    const View r = View::contiguous(rows.data(), DType::kI32, {2}), wv = View::contiguous(w.data(), DType::kF32, {2});
    be.gather_rows(d, s, r);
    CHECK(dst == std::vector<float>{5, 6, 1, 2});
    be.scatter_add_rows(View::contiguous(acc.data(), DType::kF32, {3, 2}), d, r, wv);
    CHECK(acc == std::vector<float>{12, 24, 30, 40, 52.5f, 63});  // row 2 += 0.5 [5 6], row 0 += 2 [1 2]
    rows[1] = 3;
    try {
        be.gather_rows(d, s, r);
        FAIL("row 3 of 3 was gathered");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("gather_rows: row 3 of [3, 2]") != std::string::npos);
    }
    rows[1] = -1;
    CHECK_THROWS_AS(be.scatter_add_rows(View::contiguous(acc.data(), DType::kF32, {3, 2}), d, r, wv), Error);
}

TEST_CASE("a decode step runs only the experts its token is routed to; prefill runs each chosen expert once") {
    auto src = open_model(golden_dir(kMixtral));
    const ModelConfig& c = src->config();
    CpuBackend be(CpuBackendOptions{1, false, false});
    {  // The INT8 experts (W8A8, per-expert GEMMs over gathered rows): one decode token, k experts a layer.
        ModelOptions mo;
        mo.quant = QuantMode::kW8A8;
        Model q(*src, be, mo, nullptr);
        auto gen = make_local_engine(q);
        GenerateRequest req{load_golden(kMixtral)[0].prompt, 3, 0, {}, true, {}};
        const Model::MoeCounters before = q.moe_counters();
        gen->generate(req);
        const int64_t T = int64_t(req.prompt.size());
        // The prefill routes T tokens (k slots each), then 2 decode steps route one token each.
        CHECK(q.moe_counters().expert_rows - before.expert_rows == c.n_layers * (T + 2) * c.n_experts_used);
    }
    Model model(*src, be, ModelOptions{}, nullptr);
    const AttentionShape& a = model.attention_shape();
    model.allocate_kv(a.table_width);
    std::vector<int32_t> table(size_t(a.table_width));
    for (size_t b = 0; b < table.size(); ++b) table[b] = int32_t(b);
    std::vector<int32_t> seq = load_golden(kMixtral)[0].prompt;
    const int64_t T = int64_t(seq.size());
    std::vector<int32_t> pos(seq.size()), s0(seq.size(), 0);
    for (size_t i = 0; i < seq.size(); ++i) pos[i] = int32_t(i);
    std::vector<float> logits(size_t(c.vocab));
    model.forward(TokenBatch{seq.data(), pos.data(), s0.data(), T, table.data(), 1, a.table_width}, {T - 1},
                  logits.data());
    const Model::MoeCounters prefill = model.moe_counters();
    CHECK(prefill.expert_rows == c.n_layers * T * c.n_experts_used);  // every token k times
    CHECK(prefill.expert_runs <= c.n_layers * c.n_experts);           // each expert at most once a layer
    CHECK(prefill.expert_runs > c.n_layers * c.n_experts_used);       // 16 tokens spread over more than k
    for (int step = 0; step < 4; ++step) {
        const Model::MoeCounters before = model.moe_counters();
        int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        int32_t p = int32_t(T + step), s = 0;
        model.forward(TokenBatch{&next, &p, &s, 1, table.data(), 1, a.table_width}, {0}, logits.data());
        CHECK(model.moe_counters().expert_runs - before.expert_runs == c.n_layers * c.n_experts_used);
        CHECK(model.moe_counters().expert_rows - before.expert_rows == c.n_layers * c.n_experts_used);
    }
    // The decode floor counts k of the E experts: all weights but the embedding table, less E - k
    // experts of every layer (one expert's bytes as this backend holds them: f16 here, as the file).
    const DType wt = src->info(tensor_name(c, TensorRole::kExpDown, 0, 0)).dtype;
    std::vector<uint8_t> zeros(size_t(dtype_bytes(wt, 2 * c.intermediate * c.hidden)));
    const int64_t one_expert =
        be.make_linear(View::contiguous(zeros.data(), wt, {2 * c.intermediate, c.hidden}), QuantMode::kNone)
            .weight_bytes() +
        be.make_linear(View::contiguous(zeros.data(), wt, {c.hidden, c.intermediate}), QuantMode::kNone).weight_bytes();
    const int64_t embed = dtype_bytes(src->info(tensor_name(c, TensorRole::kEmbed)).dtype, c.vocab * c.hidden);
    CHECK(model.weight_bytes() - model.streamed_weight_bytes() ==
          embed + c.n_layers * (c.n_experts - c.n_experts_used) * one_expert);
}
