// load_tokenizer factory, tokenizer_config.json and the finishing step shared by every loader.
// The factory picks the format by content (GGUF magic), then by name (.json), else protobuf.
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file.h"
#include "base/json_limits.h"
#include "runtime/tokenizer/load_util.h"

namespace lattice {

namespace {

// A token given as "text" or {"content": "text", ...}.
std::string token_string(const nlohmann::json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
    return {};
}

int32_t find_token(const TokenizerSpec& spec, const std::string& text) {
    if (text.empty()) return -1;
    for (size_t i = 0; i < spec.tokens.size(); ++i)
        if (spec.tokens[i] == text) return int32_t(i);
    return -1;
}

bool is_gguf(const std::string& path) {
    FileDescriptor fd = open_regular_file(path, "tokenizer");
    char magic[4] = {};
    return ::read(fd.get(), magic, 4) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

void apply_tokenizer_config(TokenizerSpec& spec, const std::string& config_path) {
    const std::string text = tokenizer_read_file(config_path, size_t(16) << 20);
    JsonLimits lim;
    lim.max_depth = 32;
    check_json_limits(text, "tokenizer config " + config_path, lim);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("tokenizer config {}: invalid JSON: {}", config_path, e.what());
    }
    LATTICE_CHECK(j.is_object(), "tokenizer config {}: top level is not an object", config_path);
    if (j.contains("bos_token")) {
        const int32_t id = find_token(spec, token_string(j["bos_token"]));
        if (id >= 0) spec.bos_id = id;
    }
    if (j.contains("eos_token")) {
        const int32_t id = find_token(spec, token_string(j["eos_token"]));
        if (id >= 0) spec.eos_id = id;
    }
    if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) spec.add_bos = j["add_bos_token"].get<bool>();
    if (j.contains("chat_template")) {
        const auto& t = j["chat_template"];
        if (t.is_string()) {
            spec.chat_template = t.get<std::string>();
        } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
            for (const auto& e : t)
                if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
                    e["template"].is_string())
                    spec.chat_template = e["template"].get<std::string>();
        }
    }
}

void finish_spec(TokenizerSpec& spec) {
    for (const char* name : {"<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>", "</s>"}) {
        const int32_t id = find_token(spec, name);
        if (id >= 0 && std::find(spec.eog_ids.begin(), spec.eog_ids.end(), id) == spec.eog_ids.end())
            spec.eog_ids.push_back(id);
    }
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
    auto exists = [](const std::string& p) { return path_kind(p, "tokenizer file") != PathKind::kMissing; };
    mode_t mode = 0;
    const PathKind kind = path_kind(path, "tokenizer", &mode);
    LATTICE_CHECK(kind != PathKind::kMissing, "tokenizer {}: no such file or directory", path);
    if (kind == PathKind::kDirectory) {
        const std::string dir = path.back() == '/' ? path : path + "/";
        const std::string cfg = dir + "tokenizer_config.json";
        TokenizerSpec spec;
        if (exists(dir + "tokenizer.json")) {
            spec = load_tokenizer_json(dir + "tokenizer.json");  // reads tokenizer_config.json itself
        } else if (exists(dir + "tokenizer.model")) {
            spec = load_sentencepiece_model(dir + "tokenizer.model");
            if (exists(cfg)) apply_tokenizer_config(spec, cfg);
            finish_spec(spec);
        } else if (exists(dir + "tokenizer.gguf")) {  // a converted GGUF model's vocab
            return std::make_unique<Tokenizer>(load_gguf_vocab(dir + "tokenizer.gguf"));
        } else {
            LATTICE_FAIL("tokenizer: directory {} has none of tokenizer.json, tokenizer.model, tokenizer.gguf", path);
        }
        return std::make_unique<Tokenizer>(std::move(spec));
    }
    LATTICE_CHECK(kind == PathKind::kRegular, "tokenizer {} is {}, not a file or directory", path, file_kind(mode));
    if (is_gguf(path)) return std::make_unique<Tokenizer>(load_gguf_vocab(path));
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
        return std::make_unique<Tokenizer>(load_tokenizer_json(path));
    TokenizerSpec spec = load_sentencepiece_model(path);
    const size_t slash = path.rfind('/');
    const std::string cfg =
        (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "tokenizer_config.json";
    if (exists(cfg)) apply_tokenizer_config(spec, cfg);
    finish_spec(spec);
    return std::make_unique<Tokenizer>(std::move(spec));
}

}  // namespace lattice
