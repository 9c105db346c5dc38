// load_tokenizer factory, tokenizer_config.json and the finishing step shared by every loader.
// The factory picks the format by content (GGUF magic), then by name (.json), else protobuf.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/tokenizer/load_util.h"

namespace lattice {

namespace {

namespace fs = std::filesystem;

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
    std::ifstream f(path, std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    return f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

void apply_tokenizer_config(TokenizerSpec& spec, const std::string& config_path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(tokenizer_read_file(config_path, size_t(16) << 20));
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
                if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
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
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        const fs::path dir(path);
        const fs::path cfg = dir / "tokenizer_config.json";
        TokenizerSpec spec;
        if (fs::exists(dir / "tokenizer.json", ec)) {
            spec = load_tokenizer_json((dir / "tokenizer.json").string());  // reads tokenizer_config.json itself
        } else if (fs::exists(dir / "tokenizer.model", ec)) {
            spec = load_sentencepiece_model((dir / "tokenizer.model").string());
            if (fs::exists(cfg, ec)) apply_tokenizer_config(spec, cfg.string());
            finish_spec(spec);
        } else {
            LATTICE_FAIL("tokenizer: directory {} has neither tokenizer.json nor tokenizer.model", path);
        }
        return std::make_unique<Tokenizer>(std::move(spec));
    }
    LATTICE_CHECK(fs::is_regular_file(path, ec), "tokenizer: {} is not a file or directory", path);
    if (is_gguf(path)) return std::make_unique<Tokenizer>(load_gguf_vocab(path));
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
        return std::make_unique<Tokenizer>(load_tokenizer_json(path));
    TokenizerSpec spec = load_sentencepiece_model(path);
    const fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg, ec)) apply_tokenizer_config(spec, cfg.string());
    finish_spec(spec);
    return std::make_unique<Tokenizer>(std::move(spec));
}

}  // namespace lattice
