// Reading LoRA adapters (see lora.h): PEFT folders and llama.cpp's GGUF LoRA files, into host f32
// A [r, in] / B [out, r] per layer and target, checked against the base's shapes before anything is kept.
#include "runtime/model/lora.h"

#include "base/error.h"
#include "base/json_limits.h"
#include "base/log.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/safetensors.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace lattice {

namespace {

constexpr int64_t kMaxAdapterConfigBytes = 1 << 20;
constexpr TensorRole kRoles[kLoraTargets] = {TensorRole::kWq,   TensorRole::kWk, TensorRole::kWv,  TensorRole::kWo,
                                             TensorRole::kWGate, TensorRole::kWUp, TensorRole::kWDown};

// "q_proj" of "self_attn.q_proj.weight".
std::string short_name(const char* hf) {
    std::string s = hf;
    s = s.substr(0, s.rfind(".weight"));
    return s.substr(s.rfind('.') + 1);
}

bool target_of(const ModelConfig& cfg, const std::string& module, LoraTarget* t) {
    for (int i = 0; i < kLoraTargets; ++i) {
        const std::string hf = tensor_name(cfg, kRoles[i], 0);
        if (module == short_name(hf.c_str())) {
            *t = LoraTarget(i);
            return true;
        }
    }
    return false;
}

std::string read_text(const std::string& path, int64_t limit) {
    std::ifstream f(path, std::ios::binary);
    LATTICE_CHECK(f.good(), "cannot open {}", path);
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    LATTICE_CHECK(int64_t(s.size()) <= limit, "{}: {} bytes exceeds the {} byte limit", path, s.size(), limit);
    return s;
}

struct PeftConfig {
    int64_t rank = 0;
    double alpha = 0;
    bool rslora = false;
    std::vector<LoraTarget> targets;
};

bool null_or_empty(const nlohmann::json& j, const char* key) {
    if (!j.contains(key) || j[key].is_null()) return true;
    const auto& v = j[key];
    return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
}

PeftConfig parse_peft_config(const std::string& file, const ModelConfig& cfg, const std::string& who) {
    const std::string text = read_text(file, kMaxAdapterConfigBytes);
    JsonLimits lim;
    lim.max_depth = 16;
    check_json_limits(text, file, lim);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: {}: not valid JSON ({})", who, file, e.what());
    }
    LATTICE_CHECK(j.is_object(), "{}: {}: expected a JSON object", who, file);
    if (j.contains("peft_type") && j["peft_type"].is_string())
        LATTICE_CHECK(j["peft_type"] == "LORA", "{}: {}: peft_type {} is not LORA", who, file,
                      j["peft_type"].get<std::string>());
    for (const char* key : {"modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform"})
        LATTICE_CHECK(null_or_empty(j, key), "{}: {}: {} is not supported (only LoRA on the projections)", who, file,
                      key);
    LATTICE_CHECK(!j.value("use_dora", false), "{}: {}: use_dora (DoRA) is not supported", who, file);
    LATTICE_CHECK(!j.contains("bias") || j["bias"].is_null() || j["bias"] == "none",
                  "{}: {}: bias other than \"none\" is not supported", who, file);
    PeftConfig c;
    try {
        c.rank = j.at("r").get<int64_t>();
        c.alpha = j.contains("lora_alpha") ? j["lora_alpha"].get<double>() : double(c.rank);
        c.rslora = j.contains("use_rslora") && !j["use_rslora"].is_null() && j["use_rslora"].get<bool>();
        if (j.value("fan_in_fan_out", false))  // PEFT resets it for nn.Linear targets, with a warning
            LOG_WARN("{}: fan_in_fan_out is set but the targets are Linear projections: ignored (as PEFT does)", who);
        const auto& tm = j.at("target_modules");
        std::vector<std::string> names;
        if (tm.is_string()) {  // PEFT: a regular expression, unless it names one module
            LoraTarget t;
            LATTICE_CHECK(target_of(cfg, tm.get<std::string>(), &t),
                          "{}: {}: target_modules as a regular expression ({}) is not supported; list the modules",
                          who, file, tm.get<std::string>());
            names.push_back(tm.get<std::string>());
        } else {
            names = tm.get<std::vector<std::string>>();
        }
        for (const std::string& n : names) {
            LoraTarget t;
            LATTICE_CHECK(target_of(cfg, n, &t),
                          "{}: {}: target module '{}' is not supported (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                          "up_proj, down_proj)",
                          who, file, n);
            if (std::find(c.targets.begin(), c.targets.end(), t) == c.targets.end()) c.targets.push_back(t);
        }
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: {}: r, lora_alpha, use_rslora, target_modules: {}", who, file, e.what());
    }
    std::sort(c.targets.begin(), c.targets.end());
    LATTICE_CHECK(!c.targets.empty(), "{}: {}: no target_modules", who, file);
    LATTICE_CHECK(std::isfinite(c.alpha), "{}: {}: lora_alpha {} is not finite", who, file, c.alpha);
    return c;
}

void check_rank(int64_t rank, const LoraReadOptions& opt, const std::string& who) {
    LATTICE_CHECK(rank >= 1, "{}: rank {} (must be >= 1)", who, rank);
    LATTICE_CHECK(rank <= opt.max_rank, "{}: rank {} exceeds --max-lora-rank {}", who, rank, opt.max_rank);
}

std::string dims_str(const std::vector<int64_t>& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return "[" + out + "]";
}

// A [r, in] / B [out, r] of target t against the base's shape.
void check_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& want, LoraTarget t,
                 const ModelConfig& cfg, int64_t rank, const std::string& tensor, const std::string& who) {
    const auto [in, out] = lora_target_dims(cfg, t);
    LATTICE_CHECK(shape == want,
                  "{}: {} has shape {}, the base's {} ({} x {}) at rank {} needs {}: an adapter for another base?",
                  who, tensor, dims_str(shape), lora_target_name(t), out, in, rank, dims_str(want));
}

// A [rows, cols] tensor of `dt` in f32.
std::vector<float> to_f32(const uint8_t* p, DType dt, const std::vector<int64_t>& want, const std::string& tensor,
                          const std::string& who) {
    std::vector<float> out(size_t(want[0] * want[1]));
    convert_elements(p, dt, out.data(), DType::kF32, int64_t(out.size()));
    for (float v : out) LATTICE_CHECK(std::isfinite(v), "{}: {} holds a non-finite value", who, tensor);
    return out;
}

void finish(LoraAdapter& ad, const ModelConfig& cfg, const LoraReadOptions& opt) {
    ad.scale = float(ad.rslora ? ad.alpha / std::sqrt(double(ad.rank)) : ad.alpha / double(ad.rank));
    const int64_t end = opt.layer_end < 0 ? cfg.n_layers : opt.layer_end;
    for (int64_t l = opt.layer_begin; l < end; ++l)
        for (LoraTarget t : ad.targets)
            LATTICE_CHECK(ad.layers[size_t(l - opt.layer_begin)][size_t(t)].present(),
                          "adapter '{}': {} of layer {} is missing ({} is a target module)", ad.name,
                          lora_target_name(t), l, lora_target_name(t));
}

LoraAdapter read_peft(const std::string& name, const std::string& dir, const ModelConfig& cfg,
                      const LoraReadOptions& opt) {
    const std::string who = "adapter '" + name + "'";
    const PeftConfig pc = parse_peft_config(dir + "/adapter_config.json", cfg, who);
    check_rank(pc.rank, opt, who);
    LoraAdapter ad;
    ad.name = name;
    ad.path = dir;
    ad.rank = pc.rank;
    ad.alpha = pc.alpha;
    ad.rslora = pc.rslora;
    ad.targets = pc.targets;
    const int64_t end = opt.layer_end < 0 ? cfg.n_layers : opt.layer_end;
    ad.layer_begin = opt.layer_begin;
    ad.layers.resize(size_t(end - opt.layer_begin));
    const std::string file = dir + "/adapter_model.safetensors";
    LATTICE_CHECK(std::filesystem::exists(file), "{}: {} not found (adapter_model.bin is not read: convert it to "
                  "safetensors)", who, file);
    SafetensorsFile st(file);
    const std::string prefix = "base_model.model.";
    for (const auto& [tname, e] : st.entries()) {
        const bool is_a = tname.ends_with(".lora_A.weight"), is_b = tname.ends_with(".lora_B.weight");
        LATTICE_CHECK(tname.rfind(prefix, 0) == 0 && (is_a || is_b),
                      "{}: {}: tensor {} is not a LoRA A/B matrix of a projection", who, file, tname);
        const std::string base = tname.substr(prefix.size(), tname.size() - prefix.size() - 14) + ".weight";
        const int64_t layer = hf_layer_of(base);
        TensorRole role;
        LATTICE_CHECK(hf_role_of(architecture_of(cfg), base, &role) && layer >= 0,
                      "{}: {}: tensor {} does not name a projection of this base", who, file, tname);
        int ti = 0;
        while (ti < kLoraTargets && kRoles[ti] != role) ++ti;
        LATTICE_CHECK(ti < kLoraTargets, "{}: {}: tensor {}: not a supported target", who, file, tname);
        LATTICE_CHECK(layer < cfg.n_layers, "{}: {}: tensor {} is for layer {}, the base has {} layers", who, file,
                      tname, layer, cfg.n_layers);
        const LoraTarget t = LoraTarget(ti);
        LATTICE_CHECK(std::find(ad.targets.begin(), ad.targets.end(), t) != ad.targets.end(),
                      "{}: {}: tensor {} is for {}, which target_modules does not list", who, file, tname,
                      lora_target_name(t));
        const auto [in, out] = lora_target_dims(cfg, t);
        const std::vector<int64_t> want = is_a ? std::vector<int64_t>{ad.rank, in} : std::vector<int64_t>{out, ad.rank};
        check_shape(e.shape, want, t, cfg, ad.rank, tname, who);  // every layer, kept or not
        LATTICE_CHECK(e.dtype == DType::kF32 || e.dtype == DType::kF16 || e.dtype == DType::kBF16,
                      "{}: {}: tensor {} is {} (F32, F16 or BF16 expected)", who, file, tname, dtype_name(e.dtype));
        if (layer < opt.layer_begin || layer >= end) continue;
        LoraMatrix& m = ad.layers[size_t(layer - opt.layer_begin)][size_t(t)];
        (is_a ? m.a : m.b) = to_f32(st.bytes(e), e.dtype, want, tname, who);
    }
    for (auto& layer : ad.layers)
        for (const LoraMatrix& m : layer)
            LATTICE_CHECK(m.a.empty() == m.b.empty(), "{}: {}: a layer holds lora_A without lora_B or the reverse",
                          who, file);
    finish(ad, cfg, opt);
    return ad;
}

LoraAdapter read_gguf(const std::string& name, const std::string& path, const ModelConfig& cfg,
                      const LoraReadOptions& opt) {
    const std::string who = "adapter '" + name + "'";
    auto g = GgufFile::open(path);
    LATTICE_CHECK(g->string_value("general.type").value_or("") == "adapter" &&
                      g->string_value("adapter.type").value_or("lora") == "lora",
                  "{}: {} is a GGUF file but not a LoRA adapter (general.type = adapter, adapter.type = lora)", who,
                  path);
    const Architecture& arch = architecture_of(cfg);
    const std::string garch = g->string_value("general.architecture").value_or("");
    LATTICE_CHECK(garch == arch.gguf_name, "{}: {} is for architecture '{}', the base is '{}'", who, path, garch,
                  arch.gguf_name);
    LoraAdapter ad;
    ad.name = name;
    ad.path = path;
    const int64_t end = opt.layer_end < 0 ? cfg.n_layers : opt.layer_end;
    ad.layer_begin = opt.layer_begin;
    ad.layers.resize(size_t(end - opt.layer_begin));
    for (const GgufTensor& gt : g->tensors()) {
        const bool is_a = gt.name.ends_with(".lora_a"), is_b = gt.name.ends_with(".lora_b");
        LATTICE_CHECK(is_a || is_b, "{}: {}: tensor {} is not a LoRA matrix", who, path, gt.name);
        const std::string hf = gguf_to_hf_name(arch, gt.name.substr(0, gt.name.size() - 7));
        TensorRole role;
        const int64_t layer = hf_layer_of(hf);
        LATTICE_CHECK(!hf.empty() && hf_role_of(arch, hf, &role) && layer >= 0,
                      "{}: {}: tensor {} does not name a projection of this base", who, path, gt.name);
        int ti = 0;
        while (ti < kLoraTargets && kRoles[ti] != role) ++ti;
        LATTICE_CHECK(ti < kLoraTargets, "{}: {}: tensor {}: not a supported target", who, path, gt.name);
        LATTICE_CHECK(layer < cfg.n_layers, "{}: {}: tensor {} is for layer {}, the base has {} layers", who, path,
                      gt.name, layer, cfg.n_layers);
        LATTICE_CHECK(gt.ne.size() == 2, "{}: {}: tensor {} is not 2-D", who, path, gt.name);
        const int64_t r = is_a ? gt.ne[1] : gt.ne[0];
        if (ad.rank == 0) {
            ad.rank = r;
            check_rank(r, opt, who);
        }
        LATTICE_CHECK(r == ad.rank, "{}: {}: tensor {} has rank {}, others {}", who, path, gt.name, r, ad.rank);
        const LoraTarget t = LoraTarget(ti);
        if (std::find(ad.targets.begin(), ad.targets.end(), t) == ad.targets.end()) ad.targets.push_back(t);
        const auto [in, out] = lora_target_dims(cfg, t);
        const std::vector<int64_t> want = is_a ? std::vector<int64_t>{ad.rank, in} : std::vector<int64_t>{out, ad.rank};
        const std::vector<int64_t> shape{gt.ne[1], gt.ne[0]};
        const DType dt = gt.dtype;
        LATTICE_CHECK(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16,
                      "{}: {}: tensor {}: only F32, F16 and BF16 LoRA matrices are read", who, path, gt.name);
        check_shape(shape, want, t, cfg, ad.rank, gt.name, who);
        if (layer < opt.layer_begin || layer >= end) continue;
        std::vector<float> v = to_f32(g->tensor_data(gt), dt, want, gt.name, who);
        // llama.cpp stores q/k rows (B's rows) in RoPE-pair order, as it stores the base's.
        if (is_b && arch.gguf_qk_interleaved && (t == LoraTarget::kQ || t == LoraTarget::kK))
            unpermute_qk_rows(v.data(), out / cfg.head_dim, cfg.head_dim, ad.rank);
        LoraMatrix& m = ad.layers[size_t(layer - opt.layer_begin)][size_t(t)];
        (is_a ? m.a : m.b) = std::move(v);
    }
    LATTICE_CHECK(ad.rank > 0, "{}: {}: no LoRA tensors", who, path);
    std::sort(ad.targets.begin(), ad.targets.end());
    const double alpha = g->float_value("adapter.lora.alpha").value_or(0.0);
    ad.alpha = alpha > 0 ? alpha : double(ad.rank);  // llama.cpp: 0 or absent means scale 1
    finish(ad, cfg, opt);
    return ad;
}

}  // namespace

const char* lora_target_name(LoraTarget t) {
    static const char* names[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"};
    return names[size_t(t)];
}

std::pair<int64_t, int64_t> lora_target_dims(const ModelConfig& cfg, LoraTarget t) {
    const std::vector<int64_t> s = tensor_shape(cfg, kRoles[size_t(t)]);
    return {s[1], s[0]};
}

int64_t LoraAdapter::parameters() const {
    int64_t n = 0;
    for (const auto& layer : layers)
        for (const LoraMatrix& m : layer) n += int64_t(m.a.size() + m.b.size());
    return n;
}

LoraAdapter read_lora_adapter(const std::string& name, const std::string& path, const ModelConfig& cfg,
                              const LoraReadOptions& opt) {
    LATTICE_CHECK(!cfg.is_moe(), "adapter '{}': LoRA on a mixture-of-experts model ({}) is not supported", name,
                  cfg.family);
    const int64_t end = opt.layer_end < 0 ? cfg.n_layers : opt.layer_end;
    LATTICE_CHECK(0 <= opt.layer_begin && opt.layer_begin < end && end <= cfg.n_layers,
                  "adapter '{}': layer range [{}, {}) of {} layers", name, opt.layer_begin, end, cfg.n_layers);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        LATTICE_CHECK(std::filesystem::exists(path + "/adapter_config.json"),
                      "adapter '{}': {} has no adapter_config.json (not a PEFT LoRA folder)", name, path);
        return read_peft(name, path, cfg, opt);
    }
    LATTICE_CHECK(std::filesystem::is_regular_file(path, ec), "adapter '{}': {} is neither a PEFT folder nor a file",
                  name, path);
    return read_gguf(name, path, cfg, opt);
}

}  // namespace lattice
