// Structured output: a grammar (JSON object, JSON schema, regex, choice) compiled to a byte-level
// pushdown automaton, and the per-token mask a sampler applies so that the output always matches.
//
// Why our own: xgrammar is the maintained engine that fits, and its PyPI sdist carries its C++ core
// (0.2.9: 32k lines in cpp/, with cpptrace, dlpack and picojson in 3rdparty/); we did not build it at
// setup because every cold CI run (30 min budget) would compile it again, the bare GPU machine would
// need it carried, and it brings an Earley parser and EBNF front end for far more than the subset users
// send (OpenAI structured outputs, pydantic schemas, vLLM's guided_regex/choice), which compiles to
// a small automaton here, checked by tests/runtime/engine/test_grammar.cpp and served end to end.
//
// Layout: a Grammar is a recursive transition network over bytes (grammar_detail::Nfa): states with
// byte-range edges, epsilon edges and call edges (push a return state, jump to a rule's start); a rule
// ends at a kReturn state, the whole grammar at kFinal. grammar_nfa.cpp builds the shared pieces
// (UTF-8 code point ranges, JSON strings / numbers / integer ranges, the free JSON value rule),
// grammar_json_schema.cpp and grammar_regex.cpp the two front ends, grammar_check.cpp each state's
// shortest way out and the check that some finite output exists, grammar.cpp compile() and the
// vocabulary index, grammar_mask.cpp the matcher. A GrammarMatcher holds a set of configurations
// (each a call stack whose top is the current state), closed under epsilon/call/return, keeping only
// configurations whose top has byte edges; complete() is "a configuration reached kFinal".
// Masks: the vocabulary is indexed as a byte trie in preorder (TokenVocab), walked depth-first, one
// configuration set per depth, a subtree skipped at its first impossible byte. Sets are interned per
// Grammar with their byte transitions filled in lazily (DfaCache: a lazy DFA over configuration
// sets), so a trie node costs one table lookup once a grammar is warm (~5.5 ns: 1.5 ms for all 275k
// nodes of the 128k trie, the floor of a mask that allows everything). Inside a JSON string body
// (the wide state: almost every token allowed) the tokens made only of plain string characters are
// precomputed per character count, so only the others (quote, backslash, control bytes, invalid
// UTF-8) are walked; masks that still took > 50 µs are memoized per (vocabulary, set). Measured
// costs: docs/benchmark-results.md ("Structured output: mask cost").
//
// Invariants: TokenVocab is immutable and shared between threads; a Grammar is too, apart from its
// DfaCache (a mutex; masks of one grammar run one at a time; bounded, ~8 MB at 128k); a
// GrammarMatcher is one sequence's state (copy it to fork). Whitespace: JSON output is compact (one
// optional space after ':' and ','; none elsewhere); numbers have <= 16 integer digits, <= 16
// fraction digits, 1-2 exponent digits (a finite double); strings accept exactly valid UTF-8 and
// JSON's escapes (\uXXXX excluding lone surrogates, so the output always parses). Nesting: a
// configuration's stack holds at most kMaxStack frames (each free JSON value inside another, each
// array item of a schema and each $ref costs one), so json_object nests 32 deep. TokenVocab builds
// in ~10 ms at 32k and ~50 ms at 128k tokens.
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lattice {

struct GrammarSpec {
    enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice };
    Kind kind = Kind::kNone;
    std::string source;                // kJsonSchema: the schema as JSON text; kRegex: the pattern (whole-match)
    std::vector<std::string> choices;  // kChoice: the output is exactly one of these strings
    bool active() const { return kind != Kind::kNone; }
    std::string key() const;  // canonical text identifying the spec (cache key)
};

namespace grammar_detail {

constexpr int kMaxStack = 33;  // frames per configuration (top-level + 32 nested)
constexpr int32_t kNever = INT32_MAX;  // Nfa::finish_bytes / finish_depth of a state that cannot end its frame

struct ByteEdge {
    uint8_t lo, hi;
    int32_t to;
};
struct CallEdge {
    int32_t callee;  // the called rule's start state
    int32_t ret;     // where the caller continues once the rule returns
};
enum StateFlags : uint8_t { kReturn = 1, kFinal = 2 };

// Compressed adjacency: state s owns [x_off[s], x_off[s + 1]) of each edge array.
struct Nfa {
    std::vector<uint32_t> byte_off, eps_off, call_off;
    std::vector<ByteEdge> bytes;
    std::vector<int32_t> eps;
    std::vector<CallEdge> calls;
    std::vector<uint8_t> flags;
    // String-body states at a character boundary: every run of at most this many plain string
    // characters (U+0020.. but '"' and '\') can be consumed from here (INT32_MAX: any run); -1 for
    // every other state. What the mask's precomputed plain-token sets rely on.
    std::vector<int32_t> body_remaining;
    int32_t start = 0;
    // Filled by analyze() (grammar_check.cpp): per state, bytes of the shortest way to the end of its
    // frame, and the frames that way needs above it (kNever: none). rule_names: the front end's name
    // of each rule it made (rule start, e.g. a JSON pointer), for errors.
    std::vector<int32_t> finish_bytes, finish_depth;
    std::vector<std::pair<int32_t, std::string>> rule_names;
    int32_t num_states() const { return int32_t(flags.size()); }
};

void analyze(Nfa& n);
// Throws Error (prefixed by `what`) when no finite output matches: a rule that can never end (named),
// or a shortest output nested deeper than kMaxStack allows.
void check_finite(const Nfa& n, const std::string& what);

// A byte trie over token ids in preorder: node i's subtree is [i, end[i]); node 0 is the root.
struct Trie {
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<uint32_t> end;
    std::vector<uint32_t> tok_off;  // tokens ending at node i: toks[tok_off[i], tok_off[i + 1])
    std::vector<int32_t> toks;
    int max_depth = 0;
    void build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids);
};

constexpr int kPlainMaxChars = 48;  // plain tokens with more characters are walked instead

// Builds an Nfa (grammar_nfa.cpp); the front ends add fragments between two given states.
class NfaBuilder {
public:
    static constexpr int32_t kUnbounded = INT32_MAX;
    using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code point ranges

    int32_t state();
    void byte(int32_t from, uint8_t lo, uint8_t hi, int32_t to);
    void eps(int32_t from, int32_t to);
    void call(int32_t from, int32_t callee, int32_t to);  // run the rule starting at callee, then continue at to
    std::pair<int32_t, int32_t> rule();                   // a new rule's (start, end); end returns to the caller
    void literal(int32_t from, std::string_view bytes, int32_t to);
    void codepoints(int32_t from, const Ranges& ranges, int32_t to);  // one character of the set, as UTF-8
    int32_t opt_space(int32_t from);                                  // from, or after one ' '
    void json_string(int32_t from, int32_t to, int32_t min_chars, int32_t max_chars);
    // A JSON string (an object key) whose value is none of `names`.
    void json_string_except(int32_t from, int32_t to, const std::vector<std::string>& names);
    void json_number(int32_t from, int32_t to);
    void json_integer(int32_t from, int32_t to, int64_t lo, int64_t hi);
    void free_value(int32_t from, int32_t to);   // any JSON value (the shared free-value rule)
    void free_object(int32_t from, int32_t to);  // any JSON object
    Nfa finish(int32_t start, int32_t final_state);

private:
    void json_char(int32_t from, int32_t to);
    void digits(int32_t from, int32_t to, int min, int max);
    void fixed_range(int32_t from, int32_t to, const std::string& lo, const std::string& hi);
    void nonneg_range(int32_t from, int32_t to, int64_t lo, int64_t hi);
    std::vector<std::vector<ByteEdge>> bytes_;
    std::vector<std::vector<int32_t>> eps_;
    std::vector<std::vector<CallEdge>> calls_;
    std::vector<uint8_t> flags_;
    std::vector<int32_t> body_;
    int32_t value_rule_ = -1;
};

constexpr int64_t kMaxIntegerMagnitude = 9999999999999999;  // 16 digits

}  // namespace grammar_detail

namespace grammar_detail {
// A set of configurations stored flat: configuration i is data[off[i], off[i + 1]) (bottom .. top).
struct Configs {
    std::vector<int32_t> data;
    std::vector<uint32_t> off{0};
    int32_t size() const { return int32_t(off.size()) - 1; }
    std::span<const int32_t> at(int32_t i) const {
        return {data.data() + off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]};
    }
    int32_t top(int32_t i) const { return data[off[size_t(i) + 1] - 1]; }
    void clear() {
        data.clear();
        off.resize(1);
    }
    bool contains(std::span<const int32_t> c) const;
    void pop() {
        off.pop_back();
        data.resize(off.back());
    }
    void push(std::span<const int32_t> c) {
        data.insert(data.end(), c.begin(), c.end());
        off.push_back(uint32_t(data.size()));
    }
};

// Configuration sets interned as ids with their byte transitions filled in lazily (a lazy DFA over
// configuration sets: step() is a function of the set, so each (set, byte) is computed once per
// grammar), and masks memoized per (vocabulary, set) when they were expensive. One per Grammar,
// guarded by mu (a mask holds it throughout; masks of one grammar run one at a time). Bounded:
// past kMaxSets sets (or kMaxMasks masks) it is cleared at the start of the next mask.
struct DfaCache {
    static constexpr size_t kMaxSets = 4096, kMaxMasks = 256;  // 4 MB of transitions, 4 MB of masks at 128k
    std::mutex mu;
    std::unordered_map<std::string, int32_t> ids;  // key: the set's flat data
    std::deque<Configs> sets;
    std::vector<int32_t> body;   // per set: the fast path's remaining characters, or -1
    std::vector<int32_t> trans;  // [set * 256 + byte]: -1 unknown, else (target + 1) << 1 | complete; target -1: none
    std::vector<int32_t> dist;   // per set: bytes of the shortest completion (-1 unknown, INT32_MAX none)
    std::unordered_map<uint64_t, int32_t> tok_dist;  // vocabulary serial << 32 | set: tokens of the shortest completion
    std::unordered_map<uint64_t, std::vector<uint32_t>> masks;  // key: vocabulary serial << 32 | set
    void clear() {
        ids.clear();
        sets.clear();
        body.clear();
        trans.clear();
        dist.clear();
        tok_dist.clear();
        masks.clear();
    }
};
}  // namespace grammar_detail

// The vocabulary as byte strings (what each id decodes to) plus whatever index the mask needs (a prefix trie...).
// Immutable and shared by every request of a model: built once (~50 ms at 128k, see the header comment).
class TokenVocab {
public:
    // bytes.size() is the model's logits width (may exceed the tokenizer's vocabulary: pad ids get "").
    // Ids with empty bytes (special/control tokens, padding) are never allowed, except `end_ids`
    // (eos / end-of-turn ids), which are allowed exactly when the grammar's output is complete.
    // An end id's own bytes (if any) are ignored: it only ends the output.
    TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> end_ids);
    int32_t size() const { return int32_t(bytes_.size()); }
    const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
    const std::vector<int32_t>& end_ids() const { return end_ids_; }
    bool is_end(int32_t id) const { return is_end_[size_t(id)] != 0; }
    uint32_t serial() const { return serial_; }
    // Whether each of the 256 bytes is a token by itself (byte-level BPE; SentencePiece with byte
    // fallback): then an output of k bytes takes at most k tokens.
    bool has_all_bytes() const { return all_bytes_; }

    // Mask index (grammar_mask.cpp).
    const grammar_detail::Trie& trie() const { return all_; }
    const grammar_detail::Trie& nonplain_trie() const { return nonplain_; }
    // Bitset of tokens made of at most k plain string characters (k <= kPlainMaxChars).
    std::span<const uint32_t> plain_upto(int k) const;

private:
    std::vector<std::string> bytes_;
    std::vector<int32_t> end_ids_;
    std::vector<uint8_t> is_end_;
    grammar_detail::Trie all_, nonplain_;
    std::vector<uint32_t> plain_words_;  // (kPlainMaxChars + 1) bitsets, cumulative in k
    int32_t words_ = 0;
    uint32_t serial_ = 0;  // distinguishes vocabularies in a Grammar's mask memo
    bool all_bytes_ = false;
};

class Tokenizer;
// The TokenVocab of a tokenizer: each id's decoded bytes (control, unknown and unused tokens get ""),
// padded with "" to logits_width when the model's logits are wider; end ids: the tokenizer's
// end-of-generation ids (eos, <|eot_id|>, <|im_end|> ...).
std::shared_ptr<const TokenVocab> make_token_vocab(const Tokenizer& tok, int32_t logits_width = 0);

// A compiled grammar: immutable, shareable across requests and threads.
class Grammar {
public:
    // Throws lattice::Error naming what is wrong or unsupported (the schema keyword and its JSON path,
    // e.g. `response_format.json_schema: "pattern" at /properties/name is not supported`, the regex
    // construct and its offset, an empty choice list). Never silently ignores a keyword that constrains
    // validity; annotation keywords (title, description, examples, default, $schema, $comment) are ignored;
    // string formats are compiled (date-time, date, time, email, uuid, ipv4, uri) or refused by name.
    // Also refused: a grammar no finite output completes (a rule that can never end, named, or a
    // shortest output nested past kMaxStack), a schema past 5000 properties, a grammar past 1M states.
    static std::shared_ptr<const Grammar> compile(const GrammarSpec& spec);

    // Analyzes the Nfa (grammar_detail::analyze) unless the compiler did.
    explicit Grammar(grammar_detail::Nfa nfa);
    const grammar_detail::Nfa& nfa() const { return nfa_; }
    grammar_detail::DfaCache& cache() const { return cache_; }

private:
    grammar_detail::Nfa nfa_;
    mutable grammar_detail::DfaCache cache_;
};

// Front ends (grammar_json_schema.cpp, grammar_regex.cpp, grammar_nfa.cpp); each throws Error naming the culprit.
grammar_detail::Nfa compile_json_schema(const std::string& schema_text);
grammar_detail::Nfa compile_json_object();
grammar_detail::Nfa compile_regex(const std::string& pattern);
grammar_detail::Nfa compile_choice(const std::vector<std::string>& choices);
// A whole match of `pattern` (the guided_regex subset) between two states of a builder (JSON schema formats).
void regex_fragment(grammar_detail::NfaBuilder& b, const std::string& pattern, int32_t from, int32_t to);

// One sequence's position in a grammar. Copyable (cheap enough to copy per request).
class GrammarMatcher {
public:
    GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v);
    // The tokens allowed next: bit (id % 32) of words[id / 32]; words.size() == (vocab.size() + 31) / 32.
    // A token is allowed iff all its bytes can be consumed from the current state. End ids are allowed
    // iff complete(). If nothing at all would be allowed (cannot happen for a well-formed grammar) the end ids are set.
    void fill_mask(std::span<uint32_t> words) const;
    bool accept(int32_t id);  // advances by the token; false (state unchanged) if the token was not allowed
    const TokenVocab& vocab() const { return *vocab_; }
    bool complete() const { return complete_; }                       // the bytes so far are a whole match
    bool finished() const { return complete_ && live_.size() == 0; }  // complete() and no byte can follow

    // Finishing: bytes of the shortest completion from here (0 when complete(); INT32_MAX if none was
    // found), and a mask of only the allowed tokens after which that distance is smaller or the output
    // complete (when complete(): only the end ids). Sampling from it ends the output within distance()
    // tokens, so a request about to reach max_tokens can still end well-formed: switch to it when the
    // tokens left are no more than distance(). distance() sums per-state costs computed at compile time.
    int32_t distance() const;
    void fill_mask_finishing(std::span<uint32_t> words) const;

    // Tokens of the shortest completion from here in this vocabulary (0 when complete(); INT32_MAX
    // if none): what the reserve near max_tokens needs. Exact (a search over the lazy DFA with tokens
    // as edges, memoized per state) unless the search passes 256 states, then the byte distance (an
    // upper bound where every byte is a token). And the mask of the allowed tokens after which the
    // output is complete or can still be completed within tokens_left - 1 tokens (end ids when
    // complete()): sampling from it with tokens_left = max_tokens - generated ends the output
    // well-formed whenever max_tokens was at least the shortest document. When no token can (the
    // budget is already below the shortest completion) it is fill_mask()'s mask.
    int32_t min_remaining_tokens() const;
    void fill_mask_within(std::span<uint32_t> words, int64_t tokens_left) const;

    // Byte-level access (tests, tools): consumes the bytes if all can be consumed, else false and unchanged.
    bool accept_bytes(std::string_view bytes);

private:
    std::shared_ptr<const Grammar> grammar_;
    std::shared_ptr<const TokenVocab> vocab_;
    grammar_detail::Configs live_;  // configurations whose top state has byte edges
    bool complete_ = false;
};

}  // namespace lattice
