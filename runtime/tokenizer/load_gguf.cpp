// Tokenizer from GGUF metadata (llama.cpp's keys), read through runtime/weights/gguf.h:
//   tokenizer.ggml.model        "llama" (SentencePiece BPE: tokens, scores, token_type) or
//                               "gpt2" (byte-level BPE: tokens, token_type, merges "a b", pre)
//   tokenizer.ggml.pre          pre-tokenizer family: llama-bpe/llama3, gpt-2/default, qwen2, smollm
//   tokenizer.ggml.{bos,eos,unknown,padding,eot,eom}_token_id, add_bos_token, add_space_prefix
//   tokenizer.chat_template     Jinja text (only its family is used)
// Llama 3 ("llama-bpe") sets ignore_merges as llama.cpp does.
#include "base/error.h"
#include "runtime/weights/gguf.h"
#include "runtime/tokenizer/load_util.h"

namespace lattice {

namespace {

PreTokenizer pre_from_name(const std::string& name, const std::string& path) {
    if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "smaug-bpe")
        return PreTokenizer::kLlama3;
    if (name == "qwen2") return PreTokenizer::kQwen2;
    if (name == "smollm") return PreTokenizer::kSmolLM;
    if (name == "gpt-2" || name == "gpt2" || name == "default" || name.empty()) return PreTokenizer::kGpt2;
    LATTICE_FAIL("tokenizer {}: tokenizer.ggml.pre '{}' is not supported (llama-bpe, gpt-2, qwen2, smollm)", path,
                 name);
}

}  // namespace

TokenizerSpec load_gguf_vocab(const std::string& path) {
    std::unique_ptr<GgufFile> f = GgufFile::open(path);
    TokenizerSpec spec;
    spec.source = path;
    const std::string model = f->string_value("tokenizer.ggml.model").value_or("");
    LATTICE_CHECK(!model.empty(), "tokenizer {}: no tokenizer.ggml.model key (no vocab in this GGUF)", path);
    spec.tokens = f->string_array("tokenizer.ggml.tokens");
    LATTICE_CHECK(!spec.tokens.empty(), "tokenizer {}: tokenizer.ggml.tokens missing or empty", path);
    const size_t n = spec.tokens.size();
    const std::vector<int32_t> types = f->int_array("tokenizer.ggml.token_type");
    LATTICE_CHECK(types.empty() || types.size() == n, "tokenizer {}: {} token types for {} tokens", path, types.size(),
                  n);
    for (size_t i = 0; i < types.size(); ++i) {
        LATTICE_CHECK(types[i] >= 1 && types[i] <= 6, "tokenizer {}: token {} has unknown type {}", path, i, types[i]);
        spec.types.push_back(TokenType(types[i]));
    }
    if (model == "llama") {
        spec.kind = TokenizerKind::kSentencePiece;
        spec.scores = f->float_array("tokenizer.ggml.scores");
        LATTICE_CHECK(spec.scores.size() == n, "tokenizer {}: {} scores for {} tokens", path, spec.scores.size(), n);
        spec.add_space_prefix = f->bool_value("tokenizer.ggml.add_space_prefix").value_or(true);
        spec.add_bos = true;
    } else if (model == "gpt2") {
        spec.kind = TokenizerKind::kByteLevel;
        spec.pre = pre_from_name(f->string_value("tokenizer.ggml.pre").value_or(""), path);
        spec.ignore_merges = spec.pre == PreTokenizer::kLlama3;
        const std::vector<std::string> merges = f->string_array("tokenizer.ggml.merges");
        LATTICE_CHECK(!merges.empty(), "tokenizer {}: tokenizer.ggml.merges missing", path);
        spec.merges.reserve(merges.size());
        for (const std::string& m : merges) {
            const size_t sp = m.find(' ', 1);
            LATTICE_CHECK(sp != std::string::npos, "tokenizer {}: merge '{}' has no space", path, m);
            spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
        }
        spec.add_bos = false;
    } else {
        LATTICE_FAIL("tokenizer {}: tokenizer.ggml.model '{}' is not supported (llama, gpt2)", path, model);
    }
    auto id = [&](const char* key, int32_t fallback) -> int32_t {
        const std::optional<int64_t> v = f->int_value(key);
        if (!v) return fallback;
        LATTICE_CHECK(*v >= -1 && *v < int64_t(n), "tokenizer {}: {} = {} outside vocab of {}", path, key, *v, n);
        return int32_t(*v);
    };
    const bool spm = spec.kind == TokenizerKind::kSentencePiece;
    spec.bos_id = id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
    spec.eos_id = id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
    spec.unk_id = id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
    spec.pad_id = id("tokenizer.ggml.padding_token_id", -1);
    for (const char* k : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
        if (const int32_t e = id(k, -1); e >= 0) spec.eog_ids.push_back(e);
    if (const auto b = f->bool_value("tokenizer.ggml.add_bos_token")) spec.add_bos = *b;
    spec.chat_template = f->string_value("tokenizer.chat_template").value_or("");
    finish_spec(spec);
    return spec;
}

}  // namespace lattice
