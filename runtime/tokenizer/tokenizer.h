// Tokenizers for the Llama family: SentencePiece-style BPE (Llama 2) and byte-level BPE (Llama 3,
// GPT-2, Qwen2, SmolLM2), loaded from tokenizer.model, tokenizer.json or a GGUF vocab.
//
// Layout: token ids index tokens_ (piece text as the file stores it: SentencePiece pieces use "▁"
// for space and "<0xNN>" for bytes; byte-level pieces use GPT-2's byte->unicode characters) and
// bytes_ (what the token decodes to). Merges live in one hash table keyed by the adjacent pair of
// ids, so both algorithms share one O(n log n) merge loop (tokenizer.cpp):
//   SentencePiece (scores): the pair whose concatenation has the highest score merges first;
//   rank-based BPE (merges list): the pair with the lowest rank merges first; ties go leftmost.
// Special tokens (CONTROL, and special added_tokens) are recognised in text only when
// parse_special is true; USER_DEFINED tokens (non-special added_tokens) always are, as in
// Hugging Face tokenizers and llama.cpp.
// Files: tokenizer.cpp (tables, merge loop), encode.cpp (encode/decode/streaming), pretokenize.cpp
// (family split rules), load_spm.cpp (tokenizer.model: protobuf parsed by hand, see there why),
// load_json.cpp, load_gguf.cpp (via runtime/weights/gguf.h), load.cpp (factory, tokenizer_config.json).
// Invariants: ids returned by encode are in [0, vocab_size()); decode never throws on bad ids
// (they decode to nothing); a Tokenizer is immutable after construction except for its word cache,
// which is guarded, so one Tokenizer may be shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/pretokenize.h"

namespace lattice {

enum class TokenizerKind { kSentencePiece, kByteLevel };

// SentencePiece / GGUF token types (same numbers as both formats use).
enum class TokenType : uint8_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// What a loader extracts from a file; Tokenizer builds its tables from it.
struct TokenizerSpec {
    TokenizerKind kind = TokenizerKind::kSentencePiece;
    PreTokenizer pre = PreTokenizer::kGpt2;  // byte-level only
    std::vector<std::string> tokens;
    std::vector<float> scores;                                // SentencePiece score mode (when merges is empty)
    std::vector<TokenType> types;                             // empty: all normal
    std::vector<std::pair<std::string, std::string>> merges;  // rank order; rank-based BPE
    int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
    std::vector<int32_t> eog_ids;  // ids that end generation (eos, <|eot_id|>, <|im_end|> ...)
    bool add_bos = false;          // whether the model expects BOS at the start of a prompt
    bool add_space_prefix = true;  // SentencePiece: prepend "▁" to text (add_dummy_prefix)
    bool ignore_merges = false;    // byte-level: a word that is itself a token is not merged (Llama 3)
    std::string chat_template;     // Jinja text from the model's metadata (only its family is used)
    std::string source;            // file it came from, for messages
};

class Tokenizer {
public:
    explicit Tokenizer(TokenizerSpec spec);
    ~Tokenizer();

    // Text -> ids. add_bos prepends bos_id() when the vocab has one; parse_special lets control /
    // special tokens written in the text ("<|im_start|>") become their ids instead of plain text.
    // Throws Error for a character the vocab cannot encode at all (no piece, no byte fallback, no unk).
    std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool parse_special = false) const;
    // Ids -> text. Control tokens decode to nothing unless render_special; SentencePiece's dummy
    // prefix space is removed from the start. Out-of-range ids decode to nothing.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
    const std::string& token_text(int32_t id) const;   // piece as stored in the vocab ("" if out of range)
    const std::string& token_bytes(int32_t id) const;  // bytes the token decodes to
    int32_t token_id(std::string_view piece) const;    // -1 if absent
    TokenType token_type(int32_t id) const;
    bool is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }
    bool is_eog(int32_t id) const;

    int32_t bos_id() const { return spec_.bos_id; }
    int32_t eos_id() const { return spec_.eos_id; }
    int32_t unk_id() const { return spec_.unk_id; }
    const std::vector<int32_t>& eog_ids() const { return spec_.eog_ids; }
    bool add_bos_default() const { return spec_.add_bos; }
    bool spm_space_prefix() const { return spec_.add_space_prefix; }
    TokenizerKind kind() const { return spec_.kind; }
    PreTokenizer pre_tokenizer() const { return spec_.pre; }
    const std::string& source() const { return spec_.source; }
    std::string describe() const;

    // Chat template family from the model's metadata (Jinja text matched by family markers); kJinja
    // for a template of another family that parsed; kNone for no template.
    ChatTemplateKind chat_template_kind() const { return chat_kind_; }
    // The model's chat template as it came (Jinja text; "" for none).
    const std::string& chat_template_text() const { return spec_.chat_template; }
    // The model's own Jinja template when it has one that parses, else the hard-coded family; bound
    // to this vocab's BOS / EOS texts. Kind kNone renders plain concatenation.
    ChatTemplate chat_template() const;

private:
    struct Merge {
        float score;  // higher merges first (scores, or -rank)
        int32_t id;   // resulting token
    };
    struct Special {
        std::string text;
        int32_t id;
        bool always;  // USER_DEFINED: matched even without parse_special
    };
    void build_tables();
    void encode_spm(std::string_view fragment, bool prefix_space, std::vector<int32_t>& out) const;
    void encode_byte_level(std::string_view fragment, std::vector<int32_t>& out) const;
    void bpe_word_byte_level(std::string_view word, std::vector<int32_t>& out) const;
    void spm_merge(std::string_view normalized, std::vector<int32_t>& out) const;
    void encode_cached(std::string_view word, std::vector<int32_t>& out) const;
    // Merge loop over symbols (ids, -1 = not in vocab; lens = byte length of each symbol's text).
    void merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const;
    void emit_fallback(std::string_view bytes, std::vector<int32_t>& out) const;
    [[noreturn]] void refuse_unencodable(std::string_view bytes) const;

    TokenizerSpec spec_;
    std::vector<std::string>& tokens_ = spec_.tokens;
    std::vector<std::string> bytes_;
    std::unordered_map<std::string, int32_t> piece_to_id_;
    std::unordered_map<uint64_t, Merge> merges_;
    std::vector<Special> specials_;  // longest first
    int32_t byte_ids_[256];
    int32_t ascii_ids_[128];  // SentencePiece: id of each ASCII character's piece (-1 absent)
    bool spm_units_ = false;  // SentencePiece: no piece has "▁" after another char (see encode_spm)          //
                              // SentencePiece: id of <0xNN> (-1 absent); byte-level: id of the byte's char
    ChatTemplateKind chat_kind_ = ChatTemplateKind::kNone;
    std::string default_system_;
    std::shared_ptr<const jinja::Template> jinja_;  // the model's template, parsed once

    // Word cache (byte-level words, SentencePiece units): bytes -> ids. Bounded; cleared when full.
    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Decodes token by token for streaming output: never emits part of a UTF-8 character (an
// incomplete trailing sequence is held back until its remaining bytes arrive; bytes that can never
// become valid are passed through). Concatenating every push() and finish() equals
// tokenizer.decode(all ids, render_special).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
        : tok_(tok), render_special_(render_special) {}
    std::string push(int32_t id);
    std::string finish();  // whatever is still held back (an incomplete sequence at the very end)
    void reset();

private:
    const Tokenizer& tok_;
    bool render_special_;
    bool first_ = true;
    std::string pending_;
};

// Loaders. `path` of load_tokenizer: a tokenizer.model, a tokenizer.json, a .gguf file, or a model
// directory (tokenizer.json preferred, then tokenizer.model; tokenizer_config.json next to a
// tokenizer.json supplies BOS/EOS and the chat template). Throw Error naming the file at fault.
TokenizerSpec load_sentencepiece_model(const std::string& path);
TokenizerSpec load_tokenizer_json(const std::string& path);
TokenizerSpec load_gguf_vocab(const std::string& path);
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The same parsers on bytes in memory (`name` labels errors); used by the fuzzer. The JSON one does
// not look for tokenizer_config.json.
TokenizerSpec parse_sentencepiece_model(std::string_view bytes, const std::string& name);
TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& name);

// GPT-2's reversible byte <-> printable-unicode mapping used by byte-level vocabularies.
uint32_t gpt2_byte_to_codepoint(uint8_t b);
int gpt2_codepoint_to_byte(uint32_t cpt);  // -1 if cpt is not in the mapping

}  // namespace lattice
