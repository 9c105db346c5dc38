// Hugging Face tokenizer.json loader (model.type "BPE" only).
// Which algorithm: a ByteLevel pre-tokenizer or decoder means byte-level BPE (Llama 3, GPT-2, Qwen2,
// SmolLM2); otherwise the SentencePiece-style layout (Llama 2: normalizer Prepend("▁") +
// Replace(" ", "▁") or a Metaspace pre-tokenizer, byte_fallback, <0xNN> tokens).
// The byte-level pre-tokenizer is identified by its Split regex, compared with the known family
// patterns (an unknown pattern is rejected, naming it, rather than split wrongly); a Digits
// pre-tokenizer with individual_digits in front of ByteLevel is SmolLM's.
// Not implemented: Unicode normalizers (NFC/NFKC; Qwen2 declares NFC, applied as identity, which
// is exact for text that is already NFC), dropout, continuing_subword_prefix, added_tokens'
// lstrip/rstrip/single_word.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_limits.h"
#include "base/log.h"
#include "runtime/tokenizer/load_util.h"

namespace lattice {

namespace {

using nlohmann::json;

constexpr int64_t kMaxJsonVocab = int64_t(1) << 24;

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kGpt2PatternNoTail = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Every object of type `type` anywhere under j (Sequence nesting included).
void collect(const json& j, const std::string& type, std::vector<const json*>& out) {
    if (j.is_object()) {
        if (j.contains("type") && j["type"].is_string() && j["type"].get<std::string>() == type) out.push_back(&j);
        for (const auto& [k, v] : j.items()) collect(v, type, out);
    } else if (j.is_array()) {
        for (const auto& v : j) collect(v, type, out);
    }
}

std::vector<const json*> find_all(const json& root, const char* key, const std::string& type) {
    std::vector<const json*> out;
    if (root.contains(key)) collect(root[key], type, out);
    return out;
}

PreTokenizer pre_tokenizer_from_json(const json& root, const std::string& path) {
    const bool digits = [&] {
        for (const json* d : find_all(root, "pre_tokenizer", "Digits"))
            if (d->value("individual_digits", false)) return true;
        return false;
    }();
    for (const json* s : find_all(root, "pre_tokenizer", "Split")) {
        if (!s->contains("pattern") || !(*s)["pattern"].contains("Regex")) continue;
        const std::string re = (*s)["pattern"]["Regex"].get<std::string>();
        if (re == kLlama3Pattern) return PreTokenizer::kLlama3;
        if (re == kQwen2Pattern) return PreTokenizer::kQwen2;
        if (re == kGpt2Pattern || re == kGpt2PatternNoTail) return digits ? PreTokenizer::kSmolLM : PreTokenizer::kGpt2;
        LATTICE_FAIL(
            "tokenizer {}: pre-tokenizer Split pattern '{}' is not one of the supported families "
            "(gpt-2, llama3, qwen2)",
            path, re);
    }
    return digits ? PreTokenizer::kSmolLM : PreTokenizer::kGpt2;  // ByteLevel(use_regex) = GPT-2's pattern
}

}  // namespace

TokenizerSpec load_tokenizer_json(const std::string& path) {
    TokenizerSpec spec = parse_tokenizer_json(tokenizer_read_file(path, kMaxTokenizerFileBytes), path);
    std::error_code ec;
    const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg, ec)) apply_tokenizer_config(spec, cfg.string());
    finish_spec(spec);
    return spec;
}

TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& path) {
    LATTICE_CHECK(text.size() <= kMaxTokenizerFileBytes, "tokenizer {}: {} bytes exceed the {} byte limit", path,
                  text.size(), kMaxTokenizerFileBytes);
    JsonLimits lim;
    lim.max_depth = 32;  // collect() recurses; real files nest about 6 deep
    check_json_limits(text, "tokenizer " + path, lim);
    json root;
    try {
        root = json::parse(text);
    } catch (const json::exception& e) {
        LATTICE_FAIL("tokenizer {}: invalid JSON: {}", path, e.what());
    }
    TokenizerSpec spec;
    spec.source = path;
    try {
        LATTICE_CHECK(root.is_object() && root.contains("model") && root["model"].is_object(),
                      "tokenizer {}: no \"model\" object", path);
        const json& model = root["model"];
        const std::string type = model.value("type", std::string("BPE"));
        LATTICE_CHECK(type == "BPE", "tokenizer {}: model type '{}' is not supported (only BPE)", path, type);
        LATTICE_CHECK(model.contains("vocab") && model["vocab"].is_object(), "tokenizer {}: model.vocab missing", path);

        const bool byte_level =
            !find_all(root, "pre_tokenizer", "ByteLevel").empty() || !find_all(root, "decoder", "ByteLevel").empty();
        spec.kind = byte_level ? TokenizerKind::kByteLevel : TokenizerKind::kSentencePiece;

        // Vocab (+ added tokens) into an id-indexed table; holes become unused empty tokens.
        int64_t max_id = -1;
        auto check_id = [&](const json& v) {
            LATTICE_CHECK(v.is_number_integer(), "tokenizer {}: token id is not an integer", path);
            const int64_t id = v.get<int64_t>();
            LATTICE_CHECK(id >= 0 && id < kMaxJsonVocab, "tokenizer {}: token id {} out of range", path, id);
            max_id = std::max(max_id, id);
            return id;
        };
        for (const auto& [piece, id] : model["vocab"].items()) check_id(id);
        const json added = root.value("added_tokens", json::array());
        for (const auto& a : added) check_id(a.at("id"));
        LATTICE_CHECK(max_id >= 0, "tokenizer {}: empty vocab", path);
        // Ids are dense in real files; bound the table by the entries present so a few bytes of JSON
        // cannot ask for a 16M-entry table.
        const int64_t entries = int64_t(model["vocab"].size() + added.size());
        LATTICE_CHECK(max_id < 2 * entries + 1024, "tokenizer {}: token id {} far beyond the {} tokens listed", path,
                      max_id, entries);
        spec.tokens.assign(size_t(max_id + 1), std::string());
        spec.types.assign(size_t(max_id + 1), TokenType::kUnused);
        for (const auto& [piece, id] : model["vocab"].items()) {
            spec.tokens[size_t(id.get<int64_t>())] = piece;
            spec.types[size_t(id.get<int64_t>())] = TokenType::kNormal;
        }
        for (const auto& a : added) {
            const auto id = size_t(a.at("id").get<int64_t>());
            spec.tokens[id] = a.at("content").get<std::string>();
            spec.types[id] = a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
        }

        // Merges: "a b" strings (classic) or ["a", "b"] pairs (tokenizers >= 0.20).
        if (model.contains("merges") && model["merges"].is_array()) {
            spec.merges.reserve(model["merges"].size());
            for (const auto& m : model["merges"]) {
                if (m.is_string()) {
                    const std::string s = m.get<std::string>();
                    const size_t sp = s.find(' ', 1);
                    LATTICE_CHECK(sp != std::string::npos, "tokenizer {}: merge '{}' has no space", path, s);
                    spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
                } else {
                    LATTICE_CHECK(m.is_array() && m.size() == 2, "tokenizer {}: malformed merge entry", path);
                    spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
                }
            }
        }
        LATTICE_CHECK(!spec.merges.empty(), "tokenizer {}: BPE model without merges", path);
        spec.ignore_merges = model.value("ignore_merges", false);
        if (model.contains("unk_token") && model["unk_token"].is_string()) {
            const std::string unk = model["unk_token"].get<std::string>();
            for (size_t i = 0; i < spec.tokens.size(); ++i)
                if (spec.tokens[i] == unk) {
                    spec.unk_id = int32_t(i);
                    spec.types[i] = TokenType::kUnknown;
                    break;
                }
        }

        for (const char* norm : {"NFC", "NFKC", "NFD", "NFKD"})
            if (!find_all(root, "normalizer", norm).empty())
                LOG_WARN("tokenizer {}: {} normalizer not applied (text that is already {} encodes the same)", path,
                         norm, norm);
        if (byte_level) {
            spec.pre = pre_tokenizer_from_json(root, path);
        } else {
            const bool byte_fallback = model.value("byte_fallback", false);
            for (size_t i = 0; i < spec.tokens.size(); ++i) {
                const std::string& t = spec.tokens[i];
                if (byte_fallback && spec.types[i] == TokenType::kNormal && t.size() == 6 && t.starts_with("<0x") &&
                    t.back() == '>')
                    spec.types[i] = TokenType::kByte;
            }
            bool prepend = !find_all(root, "normalizer", "Prepend").empty();
            for (const json* m : find_all(root, "pre_tokenizer", "Metaspace"))
                prepend = prepend || (m->contains("prepend_scheme") ? m->value("prepend_scheme", "") != "never"
                                                                    : m->value("add_prefix_space", true));
            spec.add_space_prefix = prepend;
        }
    } catch (const json::exception& e) {
        LATTICE_FAIL("tokenizer {}: unexpected structure: {}", path, e.what());
    }

    // BOS / EOS: tokenizer_config.json next to the file when present, else the families' names.
    auto find = [&](const char* t) -> int32_t {
        for (size_t i = 0; i < spec.tokens.size(); ++i)
            if (spec.tokens[i] == t) return int32_t(i);
        return -1;
    };
    for (const char* b : {"<s>", "<|begin_of_text|>"})
        if (spec.bos_id < 0) spec.bos_id = find(b);
    for (const char* e : {"</s>", "<|end_of_text|>", "<|endoftext|>"})
        if (spec.eos_id < 0) spec.eos_id = find(e);
    spec.add_bos = spec.bos_id >= 0;
    finish_spec(spec);
    return spec;
}

}  // namespace lattice
