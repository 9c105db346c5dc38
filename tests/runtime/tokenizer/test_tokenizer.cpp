// Tokenizers against reference tokenizations (llama.cpp's vocab tests in ../shared/tokenizers):
// every string of every .inp file must encode to its .out line, for the four GGUF vocabs and for
// llama2-tokenizer.model / llama3-tokenizer.json (same ids as the matching GGUF); every string must
// decode back to itself, and a streaming decode must equal the whole decode without ever emitting
// part of a UTF-8 character.
#include "tests/test_paths.h"
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"

using namespace lattice;

namespace {

const std::string kDir = std::string(LATTICE_SHARED_DIR) + "/tokenizers/";

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f.good(), "cannot open " << path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The .inp format: strings each followed by "\n__ggml_vocab_test__\n" (so strings may themselves
// start or end with newlines, and the empty string is a case).
std::vector<std::string> read_inp(const std::string& path) {
    const std::string data = slurp(path);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t at; (at = data.find(sep, start)) != std::string::npos; start = at + sep.size())
        out.push_back(data.substr(start, at - start));
    REQUIRE(start == data.size());
    return out;
}

std::vector<std::vector<int32_t>> read_out(const std::string& path) {
    std::istringstream in(slurp(path));
    std::vector<std::vector<int32_t>> out;
    for (std::string line; std::getline(in, line);) {
        std::istringstream ls(line);
        std::vector<int32_t> ids;
        for (int32_t id; ls >> id;) ids.push_back(id);
        out.push_back(ids);
    }
    return out;
}

const Tokenizer& cached(const std::string& file) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto& t = cache[file];
    if (!t) t = load_tokenizer(kDir + file);
    return *t;
}

bool valid_utf8(std::string_view s) {
    for (size_t p = 0; p < s.size();)
        if (utf8_next(s, p) == kInvalidCodepoint) return false;
    return true;
}

void check_against(const Tokenizer& tok, const std::string& vocab) {
    const auto inputs = read_inp(kDir + "ggml-vocab-" + vocab + ".gguf.inp");
    const auto expected = read_out(kDir + "ggml-vocab-" + vocab + ".gguf.out");
    REQUIRE(inputs.size() == expected.size());
    REQUIRE(inputs.size() >= 40);
    size_t total_ids = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string& s = inputs[i];
        CAPTURE(i);
        CAPTURE(s);
        const std::vector<int32_t> ids = tok.encode(s, false, false);
        CHECK(ids == expected[i]);
        total_ids += ids.size();
        for (int32_t id : ids) CHECK((id >= 0 && id < tok.vocab_size()));
        CHECK(tok.decode(ids) == s);
        // Streaming: same text, delivered only in whole characters.
        StreamDecoder sd(tok);
        std::string streamed;
        for (int32_t id : ids) {
            const std::string chunk = sd.push(id);
            CHECK(valid_utf8(chunk));
            streamed += chunk;
        }
        streamed += sd.finish();
        CHECK(streamed == s);
        // With BOS: one more id at the front, same decode.
        if (tok.bos_id() >= 0) {
            const std::vector<int32_t> with_bos = tok.encode(s, true, false);
            REQUIRE(!with_bos.empty());
            CHECK(with_bos[0] == tok.bos_id());
            CHECK(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()) == ids);
            CHECK(tok.decode(with_bos) == s);
        }
    }
    CHECK(total_ids > 300);  // the files are not trivially empty
}

}  // namespace

TEST_CASE("llama-spm gguf vocab reproduces reference ids") {
    const Tokenizer& t = cached("ggml-vocab-llama-spm.gguf");
    CHECK(t.kind() == TokenizerKind::kSentencePiece);
    CHECK(t.vocab_size() == 32000);
    CHECK(t.bos_id() == 1);
    CHECK(t.eos_id() == 2);
    check_against(t, "llama-spm");
}

TEST_CASE("llama2 tokenizer.model reproduces the llama-spm ids") {
    const Tokenizer& t = cached("llama2-tokenizer.model");
    CHECK(t.kind() == TokenizerKind::kSentencePiece);
    CHECK(t.vocab_size() == 32000);
    CHECK(t.bos_id() == 1);
    CHECK(t.eos_id() == 2);
    CHECK(t.unk_id() == 0);
    check_against(t, "llama-spm");
}

TEST_CASE("llama-bpe gguf vocab reproduces reference ids") {
    const Tokenizer& t = cached("ggml-vocab-llama-bpe.gguf");
    CHECK(t.kind() == TokenizerKind::kByteLevel);
    CHECK(t.pre_tokenizer() == PreTokenizer::kLlama3);
    check_against(t, "llama-bpe");
}

TEST_CASE("llama3 tokenizer.json reproduces the llama-bpe ids") {
    const Tokenizer& t = cached("llama3-tokenizer.json");
    CHECK(t.kind() == TokenizerKind::kByteLevel);
    CHECK(t.pre_tokenizer() == PreTokenizer::kLlama3);
    CHECK(t.vocab_size() == 128256);
    CHECK(t.bos_id() == 128000);
    check_against(t, "llama-bpe");
}

TEST_CASE("gpt-2 gguf vocab reproduces reference ids") {
    const Tokenizer& t = cached("ggml-vocab-gpt-2.gguf");
    CHECK(t.pre_tokenizer() == PreTokenizer::kGpt2);
    check_against(t, "gpt-2");
}

TEST_CASE("qwen2 gguf vocab reproduces reference ids") {
    const Tokenizer& t = cached("ggml-vocab-qwen2.gguf");
    CHECK(t.pre_tokenizer() == PreTokenizer::kQwen2);
    check_against(t, "qwen2");
}

TEST_CASE("gguf and file tokenizers agree on a long mixed text") {
    const auto inputs = read_inp(kDir + "ggml-vocab-llama-spm.gguf.inp");
    std::string all;
    for (const auto& s : inputs) all += s + " ";
    const Tokenizer& spm_gguf = cached("ggml-vocab-llama-spm.gguf");
    const Tokenizer& spm_model = cached("llama2-tokenizer.model");
    CHECK(spm_gguf.encode(all) == spm_model.encode(all));
    CHECK(spm_model.decode(spm_model.encode(all)) == all);
    const Tokenizer& bpe_gguf = cached("ggml-vocab-llama-bpe.gguf");
    const Tokenizer& bpe_json = cached("llama3-tokenizer.json");
    CHECK(bpe_gguf.encode(all) == bpe_json.encode(all));
    CHECK(bpe_json.decode(bpe_json.encode(all)) == all);
}

TEST_CASE("streaming decoder holds back split UTF-8 characters") {
    // SentencePiece byte fallback: a character missing from the vocab arrives as <0xNN> tokens.
    const Tokenizer& t = cached("llama2-tokenizer.model");
    const std::string s = "a🦙b";  // U+1F999 is not a Llama 2 piece: 4 byte tokens
    const auto ids = t.encode(s);
    REQUIRE(ids.size() >= 6);
    StreamDecoder sd(t);
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(sd.push(id));
    chunks.push_back(sd.finish());
    std::string joined;
    int empty = 0;
    for (const auto& c : chunks) {
        CHECK(valid_utf8(c));
        CHECK(utf8_incomplete_tail(c) == 0);
        empty += c.empty();
        joined += c;
    }
    CHECK(empty >= 3);  // three of the four byte tokens could not be shown yet
    CHECK(joined == s);

    // Byte-level: an emoji split across tokens.
    const Tokenizer& b = cached("ggml-vocab-gpt-2.gguf");
    const std::string e = "🦙🦙 x";
    StreamDecoder sb(b);
    std::string out;
    for (int32_t id : b.encode(e)) {
        const std::string c = sb.push(id);
        CHECK(valid_utf8(c));
        out += c;
    }
    out += sb.finish();
    CHECK(out == e);

    // A truncated sequence at the very end comes out of finish(), so nothing is lost.
    StreamDecoder tail(b);
    const std::vector<int32_t> partial = b.encode("\xF0\x9F\xA6");
    std::string got;
    for (int32_t id : partial) got += tail.push(id);
    CHECK(got.empty());
    CHECK(tail.finish() == "\xF0\x9F\xA6");
}

TEST_CASE("random byte strings round-trip and file/GGUF variants agree") {
    // Random bytes (invalid UTF-8 included) and random cuts of the test strings: every tokenizer must
    // give the bytes back, and the two sources of one vocabulary must give the same ids.
    const auto inputs = read_inp(kDir + "ggml-vocab-llama-spm.gguf.inp");
    std::string pool;
    for (const auto& s : inputs) pool += s;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    };
    const char* pairs[][2] = {{"llama2-tokenizer.model", "ggml-vocab-llama-spm.gguf"},
                              {"llama3-tokenizer.json", "ggml-vocab-llama-bpe.gguf"},
                              {"ggml-vocab-gpt-2.gguf", "ggml-vocab-qwen2.gguf"}};
    for (int iter = 0; iter < 300; ++iter) {
        std::string s;
        const size_t len = next() % 64;
        if (iter % 2 == 0) {
            for (size_t i = 0; i < len; ++i) s += char(next() % 256);
        } else {
            const size_t at = next() % pool.size();
            s = pool.substr(at, len);
        }
        if (s.find("\xE2\x96\x81") != std::string::npos) continue;  // SentencePiece's own space marker
        CAPTURE(iter);
        for (const auto& p : pairs) {
            const Tokenizer& a = cached(p[0]);
            const Tokenizer& b = cached(p[1]);
            const auto ia = a.encode(s);
            CHECK(a.decode(ia) == s);
            CHECK(b.decode(b.encode(s)) == s);
            if (std::string(p[0]) != "ggml-vocab-gpt-2.gguf") CHECK(ia == b.encode(s));
        }
    }
}

TEST_CASE("SmolLM2 default model vocab (smollm pre-tokenizer, ChatML template)") {
    const std::string path = test::default_model_file();
    REQUIRE_FILE(path);
    auto t = load_tokenizer(path);
    CHECK(t->kind() == TokenizerKind::kByteLevel);
    CHECK(t->pre_tokenizer() == PreTokenizer::kSmolLM);
    CHECK(t->vocab_size() == 49152);
    CHECK(t->chat_template_kind() == ChatTemplateKind::kChatML);
    // Digits are single tokens, the space before a number is its own token.
    const auto ids = t->encode("Hello world 123");
    REQUIRE(ids.size() == 6);
    CHECK(t->token_text(ids[2]) == "\xC4\xA0");  // "Ġ": a lone space
    CHECK(t->token_text(ids[3]) == "1");
    CHECK(t->token_text(ids[5]) == "3");
    const std::string prompt = t->chat_template().render({{"user", "Hi"}}, true);
    CHECK(prompt ==
          "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    const auto pids = t->encode(prompt, false, true);
    CHECK(pids[0] == t->token_id("<|im_start|>"));
    CHECK(t->is_eog(t->token_id("<|im_end|>")));
    CHECK(t->decode(pids, true) == prompt);
    const auto inputs = read_inp(kDir + "ggml-vocab-gpt-2.gguf.inp");
    for (const auto& s : inputs) CHECK(t->decode(t->encode(s)) == s);
}
