// Tokenizer parts: special-token parsing on/off, chat templates per family (exact strings),
// pre-tokenizer splits, bad input files, and linear-ish cost on long words.
#include "tests/test_paths.h"
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/pretokenize.h"
#include "runtime/tokenizer/tokenizer.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_tokenizer_parts {

using namespace lattice;

namespace {

const std::string kDir = std::string(LATTICE_SHARED_DIR) + "/tokenizers/";

std::vector<std::string> split(PreTokenizer p, std::string_view s) {
    std::vector<std::string_view> w;
    pretokenize(p, s, w);
    std::string joined;
    for (auto x : w) joined += x;
    CHECK(joined == s);  // words tile the text
    return {w.begin(), w.end()};
}

bool contains(const std::vector<int32_t>& v, int32_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
}

std::string temp_file(const std::string& name, const std::string& bytes) {
    const auto p = std::filesystem::temp_directory_path() / ("lattice_tok_" + std::to_string(::getpid()) + "_" + name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
}

}  // namespace

TEST_CASE("pre-tokenizer splits per family") {
    using V = std::vector<std::string>;
    CHECK(split(PreTokenizer::kGpt2, "Hello world  123 it's") == V{"Hello", " world", " ", " 123", " it", "'s"});
    CHECK(split(PreTokenizer::kGpt2, "a  \n") == V{"a", "  \n"});
    CHECK(split(PreTokenizer::kGpt2, "WE'VE") == V{"WE", "'", "VE"});  // case-sensitive contractions
    CHECK(split(PreTokenizer::kLlama3, "WE'VE") == V{"WE", "'VE"});    // (?i:...)
    CHECK(split(PreTokenizer::kLlama3, "12345 x") == V{"123", "45", " x"});
    CHECK(split(PreTokenizer::kQwen2, "12345") == V{"1", "2", "3", "4", "5"});
    CHECK(split(PreTokenizer::kLlama3, "a.\n\n b") == V{"a", ".\n\n", " b"});
    CHECK(split(PreTokenizer::kLlama3, "x \n \n y") == V{"x", " \n \n", " y"});
    CHECK(split(PreTokenizer::kLlama3, "(hi") == V{"(hi"});  // [^\r\n\p{L}\p{N}]?\p{L}+
    CHECK(split(PreTokenizer::kSmolLM, "ab 12c") == V{"ab", " ", "1", "2", "c"});
    CHECK(split(PreTokenizer::kGpt2, "нещо на") == V{"нещо", " на"});
    CHECK(split(PreTokenizer::kGpt2, "x\xFF\xFEy") == V{"x", "\xFF\xFE", "y"});  // invalid bytes are "other"
    CHECK(split(PreTokenizer::kGpt2, "").empty());
}

TEST_CASE("special tokens are parsed only when asked") {
    auto llama3 = load_tokenizer(kDir + "llama3-tokenizer.json");
    const std::string text = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
    const auto on = llama3->encode(text, false, true);
    REQUIRE(on.size() >= 5);
    CHECK(on[0] == 128000);
    CHECK(on[1] == llama3->token_id("<|start_header_id|>"));
    CHECK(on.back() == llama3->token_id("<|eot_id|>"));
    CHECK(llama3->is_eog(on.back()));
    const auto off = llama3->encode(text, false, false);
    CHECK(!contains(off, 128000));
    CHECK(!contains(off, llama3->token_id("<|eot_id|>")));
    CHECK(off.size() > on.size());
    CHECK(llama3->decode(off) == text);         // the text survives as plain text
    CHECK(llama3->decode(on) == "user\n\nHi");  // control tokens hidden by default
    CHECK(llama3->decode(on, true) == text);    // and shown when asked

    auto qwen = load_tokenizer(kDir + "ggml-vocab-qwen2.gguf");
    const int32_t im_start = qwen->token_id("<|im_start|>");
    REQUIRE(im_start >= 0);
    CHECK(qwen->encode("<|im_start|>user", false, true)[0] == im_start);
    CHECK(!contains(qwen->encode("<|im_start|>user", false, false), im_start));

    auto spm = load_tokenizer(kDir + "llama2-tokenizer.model");
    const auto s_on = spm->encode("<s>Hi</s>", false, true);
    CHECK(s_on.front() == 1);
    CHECK(s_on.back() == 2);
    // After a special token the text gets SentencePiece's space prefix again: "▁Hi".
    CHECK(s_on[1] == spm->token_id("\xE2\x96\x81Hi"));
    const auto s_off = spm->encode("<s>Hi</s>", false, false);
    CHECK(!contains(s_off, 1));
    CHECK(!contains(s_off, 2));
    CHECK(spm->decode(s_off) == "<s>Hi</s>");
}

TEST_CASE("chat templates render each family exactly") {
    const std::vector<ChatMessage> conv = {
        {"system", "Be brief."}, {"user", " Hi there "}, {"assistant", "Hello!"}, {"user", "2+2?"}};
    ChatTemplate l2(ChatTemplateKind::kLlama2, "<s>", "</s>");
    CHECK(l2.render(conv, true) ==
          "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
    // Without a system prompt the user text itself is stripped (the template strips the whole content).
    CHECK(l2.render({{"user", " Hi "}}, true) == "<s>[INST] Hi [/INST]");
    CHECK_THROWS_AS(l2.render({{"user", "a"}, {"user", "b"}}, true), Error);

    ChatTemplate l3(ChatTemplateKind::kLlama3, "<|begin_of_text|>", "");
    CHECK(l3.render(conv, true) ==
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(l3.render({{"user", "x"}}, false) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");

    ChatTemplate ml(ChatTemplateKind::kChatML, "", "", "You are SmolLM.");
    CHECK(ml.render({{"user", "Hi"}}, true) ==
          "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    CHECK(ml.render({{"system", "S"}, {"user", " Hi "}}, false) ==
          "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n");
    CHECK_THROWS_AS(ml.render({{"robot", "x"}}, true), Error);
}

TEST_CASE("chat template family detection from Jinja text") {
    const std::string smol =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif "
        "%}{{'<|im_start|>'"
        " + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    CHECK(detect_chat_template(smol) == ChatTemplateKind::kChatML);
    CHECK(chatml_default_system(smol) == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    CHECK(chatml_default_system("{{'<|im_start|>system\\n' + message['content'] + '<|im_end|>'}}").empty());
    CHECK(detect_chat_template("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}") ==
          ChatTemplateKind::kLlama2);
    CHECK(detect_chat_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}") ==
          ChatTemplateKind::kLlama3);
    CHECK(detect_chat_template("") == ChatTemplateKind::kNone);
    CHECK(detect_chat_template("{{ message['content'] }}") == ChatTemplateKind::kNone);
}

TEST_CASE("bad tokenizer files give errors, not crashes") {
    const std::string model = [] {
        std::ifstream f(kDir + "llama2-tokenizer.model", std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    }();
    REQUIRE(model.size() > 1000);
    // Truncations at many points: either a clean Error or (cut between pieces) a smaller valid vocab.
    for (size_t cut : {size_t(1), size_t(7), size_t(100), model.size() / 2, model.size() - 3}) {
        const std::string p = temp_file("trunc.model", model.substr(0, cut));
        try {
            auto t = load_tokenizer(p);
            CHECK(t->vocab_size() > 0);
            (void)t->encode("Hello world");
        } catch (const Error&) {
        }
        std::filesystem::remove(p);
    }
    const std::string garbage = temp_file("garbage.model", std::string(4096, '\xFF'));
    CHECK_THROWS_AS(load_tokenizer(garbage), Error);
    std::filesystem::remove(garbage);
    const std::string bad_json = temp_file("bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -5}}}");
    CHECK_THROWS_AS(load_tokenizer(bad_json), Error);
    std::filesystem::remove(bad_json);
    const std::string not_json = temp_file("x.json", "{\"model\": [");
    CHECK_THROWS_AS(load_tokenizer(not_json), Error);
    std::filesystem::remove(not_json);
    CHECK_THROWS_AS(load_tokenizer(kDir + "does-not-exist.model"), Error);

    auto t = load_tokenizer(kDir + "ggml-vocab-gpt-2.gguf");
    CHECK(t->decode(std::vector<int32_t>{-1, 1 << 30}).empty());  // bad ids decode to nothing
}

TEST_CASE("long words cost near-linear time") {
    // 200k symbols in one word: an O(n^2) merge loop would take minutes.
    const std::string word(200000, 'a');
    for (const char* f : {"llama2-tokenizer.model", "ggml-vocab-llama-bpe.gguf"}) {
        auto t = load_tokenizer(kDir + f);
        const auto t0 = std::chrono::steady_clock::now();
        const auto ids = t->encode(word);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CAPTURE(f);
        CHECK(s < 5.0);
        CHECK(ids.size() < word.size() / 2);  // merges happened
        CHECK(t->decode(ids) == word);
    }
}

TEST_CASE("tiny hand-made vocabularies: merge order, byte fallback, unknown, user-defined tokens") {
    auto body = [](const char* file) {
        std::ifstream f(std::string(LATTICE_SOURCE_DIR) + "/tests/fuzz/seeds_tokenizer/" + file, std::ios::binary);
        std::string s(std::istreambuf_iterator<char>(f), {});
        REQUIRE(s.size() > 1);
        return s.substr(1);  // first byte selects the fuzzer's parser
    };
    using V = std::vector<int32_t>;
    // SentencePiece-style tokenizer.json: merges "▁ a" (rank 0) < "a b" < "▁a b".
    Tokenizer spm(parse_tokenizer_json(body("spm.json"), "spm.json"));
    CHECK(spm.kind() == TokenizerKind::kSentencePiece);
    CHECK(spm.encode("ab") == V{10});   // ▁a then ▁ab
    CHECK(spm.encode("b") == V{5, 7});  // no merge "▁ b"
    CHECK(spm.encode("A") == V{5, 3});  // byte fallback <0x41>
    CHECK(spm.encode("c") == V{5, 0});  // no <0x63>: <unk>
    CHECK(spm.encode("ab", true) == V{1, 10});
    CHECK(spm.decode(V{5, 3, 4}) == "A\xFF");

    // SentencePiece protobuf with scores: "▁a" (-0.5) beats "ab" (-0.7), so "ab" -> ▁a b.
    Tokenizer model(parse_sentencepiece_model(body("spm.model"), "spm.model"));
    CHECK(model.vocab_size() == 9);
    CHECK(model.encode("ab") == V{7, 6});
    CHECK(model.encode("bab") == V{4, 6, 8});  // ▁ b ab: "▁b" is no piece, "ab" is
    CHECK(model.encode("A") == V{4, 3});

    // Byte-level with ignore_merges: "Hello" is a token, so it is taken whole.
    Tokenizer bl(parse_tokenizer_json(body("bytelevel.json"), "bytelevel.json"));
    CHECK(bl.kind() == TokenizerKind::kByteLevel);
    CHECK(bl.pre_tokenizer() == PreTokenizer::kLlama3);
    CHECK(bl.encode("Hello") == V{8});
    CHECK(bl.encode("Hell") == V{5, 6});                     // He + ll (no "Hell")
    CHECK(bl.encode("<x>Hello", false, false) == V{11, 8});  // non-special added token: always matched
    // Not parsed as the special token: taken as text, which this toy vocab cannot encode ("<" has no
    // piece and there is no <unk>), so it is refused rather than dropped.
    CHECK_THROWS_WITH_AS(bl.encode("<|begin_of_text|>", false, false), doctest::Contains("bytes 3c"), Error);
    CHECK(bl.encode("<|begin_of_text|>", false, true) == V{10});
    // No piece, no byte token, no <unk> for "z": refused (naming the byte), never dropped.
    CHECK_THROWS_WITH_AS(bl.encode("Hello z"), doctest::Contains("bytes 7a"), Error);
    TokenizerSpec no_unk = parse_tokenizer_json(body("spm.json"), "spm.json");
    no_unk.unk_id = -1;
    Tokenizer strict(std::move(no_unk));
    CHECK(strict.encode("A") == V{5, 3});  // byte fallback still works
    CHECK_THROWS_WITH_AS(strict.encode("abc"), doctest::Contains("cannot encode"), Error);
}

TEST_CASE("byte-level BPE matches Hugging Face tokenizers on random text") {
    // tests/runtime/tokenizer/data/hf_<family>_random.json: 600 random texts each (mixed scripts, digits,
    // whitespace runs, contractions in both cases, random codepoints) encoded by the Rust
    // `tokenizers` library: llama3 from llama3-tokenizer.json itself; gpt-2, qwen2 and smollm from the
    // GGUF vocab rebuilt as tokenizer.json with the family's pre-tokenizer (make_hf_reference*.py).
    // HF matches added tokens in text always, hence parse_special.
    const std::string data = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/tokenizer/data/";
    const std::string smol = test::default_model_file();
    const std::vector<std::pair<std::string, std::string>> jobs = {{"llama3", kDir + "llama3-tokenizer.json"},
                                                                   {"llama3", kDir + "ggml-vocab-llama-bpe.gguf"},
                                                                   {"gpt-2", kDir + "ggml-vocab-gpt-2.gguf"},
                                                                   {"qwen2", kDir + "ggml-vocab-qwen2.gguf"},
                                                                   {"smollm", smol}};
    for (const auto& job : jobs) {
        const std::string& family = job.first;
        const std::string& file = job.second;
        REQUIRE_FILE(file);
        std::ifstream f(data + "hf_" + family + "_random.json");
        const auto j = nlohmann::json::parse(f);
        REQUIRE(j["cases"].size() == 600);
        auto t = load_tokenizer(file);
        int mismatches = 0;
        size_t total = 0;
        for (const auto& c : j["cases"]) {
            const std::string text = c["text"].get<std::string>();
            const auto expected = c["ids"].get<std::vector<int32_t>>();
            const auto got = t->encode(text, false, true);
            CAPTURE(file);
            CAPTURE(text);
            CHECK(got == expected);
            mismatches += got != expected;
            total += got.size();
            CHECK(t->decode(got, true) == text);
        }
        CHECK(mismatches == 0);
        CHECK(total > 5000);
    }
}

TEST_CASE("model directory: tokenizer.json + tokenizer_config.json (BOS/EOS, chat template)") {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("lattice_tok_dir_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    fs::copy_file(kDir + "ggml-vocab-llama-spm.gguf.inp", dir / "unrelated.txt", fs::copy_options::overwrite_existing);
    CHECK_THROWS_AS(load_tokenizer(dir.string()), Error);  // neither tokenizer.json nor tokenizer.model
    fs::create_symlink(kDir + "llama3-tokenizer.json", dir / "tokenizer.json");
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "add_bos_token": true,
              "chat_template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"})";
    auto t = load_tokenizer(dir.string());
    CHECK(t->bos_id() == 128000);
    CHECK(t->eos_id() == t->token_id("<|eot_id|>"));
    CHECK(t->add_bos_default());
    CHECK(t->chat_template_kind() == ChatTemplateKind::kLlama3);
    const std::string prompt = t->chat_template().render({{"user", "Hi"}}, true);
    CHECK(prompt ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const auto ids = t->encode(prompt, false, true);
    // The well-known Llama 3 prompt ids.
    CHECK(ids == std::vector<int32_t>{128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271});
    fs::remove_all(dir);

    // A directory with only tokenizer.model (Llama 2 layout) and a Llama 2 chat template.
    fs::create_directories(dir);
    fs::create_symlink(kDir + "llama2-tokenizer.model", dir / "tokenizer.model");
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"chat_template": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"})";
    auto t2 = load_tokenizer(dir.string());
    CHECK(t2->kind() == TokenizerKind::kSentencePiece);
    CHECK(t2->chat_template_kind() == ChatTemplateKind::kLlama2);
    CHECK(t2->chat_template().render({{"user", "Hi"}}, true) == "<s>[INST] Hi [/INST]");
    CHECK(t2->encode(t2->chat_template().render({{"user", "Hi"}}, true), false, true)[0] == 1);
    fs::remove_all(dir);
}

}  // namespace test_tokenizer_parts
