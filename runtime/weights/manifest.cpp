// manifest.json writing and (untrusted) parsing; see manifest.h for the format.
#include "runtime/weights/manifest.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "base/error.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/sha256.h"

namespace lattice {

namespace {

using nlohmann::json;

const json& field(const json& j, const char* key, const std::string& where) {
    LATTICE_CHECK(j.is_object() && j.contains(key), "{}: missing field \"{}\"", where, key);
    return j[key];
}

int64_t int_field(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
    const json& v = field(j, key, where);
    LATTICE_CHECK(v.is_number_integer(), "{}: field \"{}\" must be an integer", where, key);
    const int64_t x = v.get<int64_t>();
    LATTICE_CHECK(x >= lo && x <= hi, "{}: field \"{}\" = {} is outside [{}, {}]", where, key, x, lo, hi);
    return x;
}

std::string string_field(const json& j, const char* key, const std::string& where) {
    const json& v = field(j, key, where);
    LATTICE_CHECK(v.is_string(), "{}: field \"{}\" must be a string", where, key);
    return v.get<std::string>();
}

// A file name that stays inside the folder: no separators, not "." or "..", printable.
bool plain_file_name(const std::string& s) {
    if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
    for (unsigned char c : s)
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) return false;
    return true;
}

constexpr char kSealField[] = "manifest_sha256";

// SHA-256 of the canonical form (manifest.h): the object without its seal, dumped compactly.
std::string content_sha256(json j) {
    j.erase(kSealField);
    const std::string canonical = j.dump(-1, ' ', false, json::error_handler_t::strict);
    return sha256_hex(canonical.data(), canonical.size());
}

// "" when the seal matches the content (or there is none: m.sealed stays false).
std::string check_seal(const json& j, const std::string& src, Manifest& m) {
    if (!j.contains(kSealField)) return {};
    const json& v = j[kSealField];
    LATTICE_CHECK(v.is_string() && is_sha256_hex(v.get<std::string>()),
                  "{}: \"{}\" is not 64 lowercase hex digits", src, kSealField);
    m.sealed = true;
    const std::string got = content_sha256(j);
    if (got == v.get<std::string>()) return {};
    return fmt::format("the SHA-256 of its content, {}, differs from its \"{}\" {}: the manifest was edited or "
                       "damaged after the conversion (its config, layout, quantization or file hashes may not be "
                       "what the files hold); convert the model again (for a deliberate edit, delete the \"{}\" "
                       "field: the manifest then loads unchecked)",
                       got, kSealField, v.get<std::string>(), kSealField);
}

}  // namespace

std::string int4_meta_value(int64_t k, int64_t group, Int4Kind kind) {
    return fmt::format("k={} group={} kind={}", k, group, int4_kind_name(kind));
}

bool parse_int4_meta_value(const std::string& v, int64_t* k, int64_t* group, Int4Kind* kind) {
    // Exactly the writer's form: "k=<digits> group=<digits> kind=<name>".
    auto number = [](const std::string& s, int64_t* out) {
        if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos) return false;
        *out = std::stoll(s);
        return true;
    };
    const size_t g = v.find(" group="), kd = v.find(" kind=");
    if (!v.starts_with("k=") || g == std::string::npos || kd == std::string::npos || kd < g) return false;
    if (!number(v.substr(2, g - 2), k) || !number(v.substr(g + 7, kd - g - 7), group)) return false;
    const std::string name = v.substr(kd + 6);
    for (Int4Kind c : {Int4Kind::kOffset8, Int4Kind::kZeroPoint, Int4Kind::kAffine})
        if (name == int4_kind_name(c)) {
            *kind = c;
            return true;
        }
    return false;
}

std::string rank_file_name(int rank, int world) {
    return fmt::format("rank-{:05}-of-{:05}.safetensors", rank, world);
}

const ManifestFile& Manifest::rank_file(int rank) const {
    for (const auto& f : files)
        if (f.kind == "rank" && f.rank == rank) return f;
    LATTICE_FAIL("manifest lists no file for rank {}", rank);
}

PreparedLayout Manifest::layout(const std::string& folder, int rank) const {
    PreparedLayout p;
    p.folder = folder;
    p.tp = tp;
    p.pp = pp;
    p.rank = rank;
    p.stage_layers = stage_layers;
    p.quant = quant;
    p.quant_head = quant_head;
    p.smooth = smooth;
    p.kv_cache_dtype = kv_cache_dtype;
    return p;
}

std::string hf_config_json(const ModelConfig& c) {
    json j = {{"architectures", {c.architecture}},
              {"model_type", find_architecture(c.family).hf_model_type},
              {"hidden_act", "silu"},
              {"hidden_size", c.hidden},
              {"intermediate_size", c.intermediate},
              {"num_hidden_layers", c.n_layers},
              {"num_attention_heads", c.n_heads},
              {"num_key_value_heads", c.n_kv_heads},
              {"head_dim", c.head_dim},
              {"vocab_size", c.vocab},
              {"max_position_embeddings", c.max_position},
              {"rms_norm_eps", c.rms_eps},
              {"rope_theta", c.rope_theta},
              {"tie_word_embeddings", c.tie_embeddings},
              {"bos_token_id", c.bos_id},
              {"eos_token_id", c.eos_ids}};
    const RopeScaling& r = c.rope_scaling;
    if (r.type == "llama3")
        j["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", r.factor},
                             {"low_freq_factor", r.low_freq_factor},
                             {"high_freq_factor", r.high_freq_factor},
                             {"original_max_position_embeddings", r.original_max_position}};
    else if (r.type == "linear")
        j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
    else
        j["rope_scaling"] = nullptr;
    if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
    if (c.sliding_window > 0) j["use_sliding_window"] = true;  // Qwen2 applies the window only with it
    if (c.sliding_window > 0) j["max_window_layers"] = c.window_layer_begin;  // ... from this layer on
    if (c.is_moe()) {
        j["num_local_experts"] = c.n_experts;
        j["num_experts_per_tok"] = c.n_experts_used;
    }
    const Architecture& arch = find_architecture(c.family);
    if (arch.write_config) arch.write_config(c, j);  // the family's own keys (runtime/arch/family_*.cpp)
    return j.dump(2);
}

std::string manifest_json(const Manifest& m) {
    json files = json::array();
    for (const auto& f : m.files) {
        json e = {{"path", f.path}, {"kind", f.kind}, {"bytes", f.bytes}, {"sha256", f.sha256}};
        if (f.kind == "rank") e["rank"] = f.rank;
        files.push_back(e);
    }
    json j = {{"format", kConvertedFormat},
              {"format_version", m.format_version},
              {"writer", m.writer},
              {"source", m.source},
              {"config", json::parse(hf_config_json(m.config))},
              {"layout", {{"tp", m.tp}, {"pp", m.pp}, {"stage_layers", m.stage_layers}}},
              {"quantization",
               {{"mode", m.quant},
                {"quant_head", m.quant_head},
                {"scheme", m.quant == "none" ? "float weights as in the source (fused, smoothing folded in)"
                           : m.quant == "w4a8" || m.quant == "w4a16"
                               ? "4-bit linears: u8 nibbles [n, k_padded / 2] in \"<name>\", f16 scales [n, groups] in "
                                 "\"<name>_d\", f16 minimums \"<name>_m\" or u8 zero points \"<name>_z\" by kind, i32 "
                                 "act-order permutation \"<name>_perm\" [k], header metadata \"int4:<name>\"; an 8-bit "
                                 "LM head as int8 [n, k] with f32 scales [n] in \"<name>_scale\""
                               : "symmetric per-output-channel int8 [n, k], f32 scales [n] in \"<name>_scale\""},
                {"smooth", m.smooth.empty() ? json(nullptr) : json(m.smooth)},
                {"smooth_sha256", m.smooth_sha256.empty() ? json(nullptr) : json(m.smooth_sha256)}}},
              {"files", files}};
    if (m.kv_cache_dtype != "auto") j["defaults"] = {{"kv_cache_dtype", m.kv_cache_dtype}};
    j[kSealField] = content_sha256(j);
    return j.dump(2) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& src, std::string* seal_problem) {
    json j = json::parse(text, nullptr, false);
    LATTICE_CHECK(!j.is_discarded(), "{}: not valid JSON", src);
    LATTICE_CHECK(j.is_object(), "{}: expected a JSON object", src);
    const std::string format = string_field(j, "format", src);
    LATTICE_CHECK(format == kConvertedFormat, "{}: format \"{}\" is not \"{}\" (not a lattice converted checkpoint)",
                  src, format, kConvertedFormat);
    Manifest m;
    const json& ver = field(j, "format_version", src);
    LATTICE_CHECK(ver.is_number_integer(), "{}: format_version must be an integer", src);
    m.format_version = ver.get<int>();
    LATTICE_CHECK(m.format_version == kConvertedFormatVersion,
                  "{}: format version {}, but this lattice reads version {}: convert the checkpoint again with "
                  "this lattice (or use the lattice that wrote it)",
                  src, ver.dump(), kConvertedFormatVersion);
    if (j.contains("writer") && j["writer"].is_string()) m.writer = j["writer"].get<std::string>();
    if (j.contains("source") && j["source"].is_string()) m.source = j["source"].get<std::string>();
    const json& cfg = field(j, "config", src);
    LATTICE_CHECK(cfg.is_object(), "{}: \"config\" must be an object", src);
    m.config = parse_hf_config(cfg.dump(), src + " config");

    const std::string lw = src + " layout";
    const json& layout = field(j, "layout", src);
    m.tp = int(int_field(layout, "tp", lw, 1, kMaxTp));
    m.pp = int(int_field(layout, "pp", lw, 1, kMaxPp));
    const json& stages = field(layout, "stage_layers", lw);
    LATTICE_CHECK(stages.is_array() && int64_t(stages.size()) == m.pp, "{}: stage_layers must list {} stages", lw,
                  m.pp);
    for (const auto& s : stages) {
        LATTICE_CHECK(s.is_number_integer() && s.get<int64_t>() >= 1, "{}: stage_layers entries must be >= 1", lw);
        m.stage_layers.push_back(s.get<int64_t>());
    }
    const int64_t total = std::accumulate(m.stage_layers.begin(), m.stage_layers.end(), int64_t(0));
    LATTICE_CHECK(total == m.config.n_layers, "{}: stage_layers add up to {} layers, the config has {}", lw, total,
                  m.config.n_layers);

    const std::string qw = src + " quantization";
    const json& q = field(j, "quantization", src);
    m.quant = string_field(q, "mode", qw);
    LATTICE_CHECK(
        m.quant == "none" || m.quant == "w8a16" || m.quant == "w8a8" || m.quant == "w4a16" || m.quant == "w4a8",
        "{}: mode \"{}\" unknown (none, w8a16, w8a8, w4a16, w4a8)", qw, m.quant);
    const json& qh = field(q, "quant_head", qw);
    LATTICE_CHECK(qh.is_boolean(), "{}: quant_head must be true or false", qw);
    m.quant_head = qh.get<bool>();
    LATTICE_CHECK(!m.quant_head || m.quant != "none", "{}: quant_head without an int8 mode", qw);
    if (q.contains("smooth") && !q["smooth"].is_null()) m.smooth = string_field(q, "smooth", qw);
    if (q.contains("smooth_sha256") && !q["smooth_sha256"].is_null()) {
        m.smooth_sha256 = string_field(q, "smooth_sha256", qw);
        LATTICE_CHECK(is_sha256_hex(m.smooth_sha256), "{}: smooth_sha256 is not 64 lowercase hex digits", qw);
    }

    if (j.contains("defaults")) {  // optional: a run's defaults chosen at conversion
        const std::string dw = src + " defaults";
        const json& d = j["defaults"];
        LATTICE_CHECK(d.is_object(), "{}: must be an object", dw);
        for (const auto& [key, v] : d.items())
            LATTICE_CHECK(key == "kv_cache_dtype", "{}: unknown field \"{}\" (kv_cache_dtype)", dw, key);
        if (d.contains("kv_cache_dtype")) m.kv_cache_dtype = string_field(d, "kv_cache_dtype", dw);
        LATTICE_CHECK(m.kv_cache_dtype == "auto" || m.kv_cache_dtype == "f32" || m.kv_cache_dtype == "f16" ||
                          m.kv_cache_dtype == "bf16" || m.kv_cache_dtype == "int8",
                      "{}: kv_cache_dtype \"{}\" unknown (auto, f32, f16, bf16, int8)", dw, m.kv_cache_dtype);
    }

    const json& files = field(j, "files", src);
    LATTICE_CHECK(files.is_array() && files.size() <= 100000, "{}: \"files\" must be an array", src);
    std::set<std::string> names;
    std::set<int> ranks;
    for (size_t i = 0; i < files.size(); ++i) {
        const std::string fw = fmt::format("{} files[{}]", src, i);
        ManifestFile f;
        f.path = string_field(files[i], "path", fw);
        LATTICE_CHECK(plain_file_name(f.path) && f.path != "manifest.json",
                      "{}: path \"{}\" is not a plain file name inside the folder", fw, f.path);
        LATTICE_CHECK(names.insert(f.path).second, "{}: \"{}\" listed twice", fw, f.path);
        f.kind = string_field(files[i], "kind", fw);
        LATTICE_CHECK(f.kind == "rank" || f.kind == "tokenizer", "{}: kind \"{}\" unknown (rank, tokenizer)", fw,
                      f.kind);
        f.bytes = int_field(files[i], "bytes", fw, 0, int64_t(1) << 50);
        f.sha256 = string_field(files[i], "sha256", fw);
        LATTICE_CHECK(is_sha256_hex(f.sha256), "{}: sha256 \"{}\" is not 64 lowercase hex digits", fw, f.sha256);
        if (f.kind == "rank") {
            f.rank = int(int_field(files[i], "rank", fw, 0, m.world() - 1));
            LATTICE_CHECK(ranks.insert(f.rank).second, "{}: a second file for rank {}", fw, f.rank);
        }
        m.files.push_back(std::move(f));
    }
    LATTICE_CHECK(int(ranks.size()) == m.world(), "{}: lists {} rank files for tp {} x pp {} ({} ranks)", src,
                  ranks.size(), m.tp, m.pp, m.world());
    // After the fields (a bad field is named as such), before any use of a valid but edited value.
    const std::string seal = check_seal(j, src, m);
    if (seal_problem)
        *seal_problem = seal;
    else
        LATTICE_CHECK(seal.empty(), "{}: {}", src, seal);
    return m;
}

Manifest read_manifest(const std::string& folder, std::string* seal_problem) {
    namespace fs = std::filesystem;
    const std::string path = (fs::path(folder) / "manifest.json").string();
    std::error_code ec;
    LATTICE_CHECK(fs::is_regular_file(path, ec),
                  "{}: no manifest.json: not a converted checkpoint (or an "
                  "interrupted conversion)",
                  folder);
    const auto size = fs::file_size(path, ec);
    LATTICE_CHECK(!ec && int64_t(size) <= kMaxManifestBytes, "{}: {} bytes exceeds the {} byte limit", path, size,
                  kMaxManifestBytes);
    std::ifstream f(path, std::ios::binary);
    std::string text(size_t(size), '\0');
    f.read(text.data(), std::streamsize(size));
    LATTICE_CHECK(f.good(), "{}: read failed", path);
    return parse_manifest(text, path, seal_problem);
}

}  // namespace lattice
