// Our SentencePiece BPE against the reference implementation (libsentencepiece) on the Llama 2
// tokenizer.model: thousands of random valid-UTF-8 texts built from the vocab test strings, ASCII
// words, whitespace runs and random codepoints (many absent from the vocab, so byte fallback is
// exercised). SentencePiece replaces invalid UTF-8 with U+FFFD, so only valid text is compared.
#include <doctest/doctest.h>
#include <sentencepiece_processor.h>

#include <fstream>
#include <random>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"

using namespace lattice;

TEST_CASE("SentencePiece BPE matches libsentencepiece on random text") {
    const std::string path = std::string(LATTICE_SHARED_DIR) + "/tokenizers/llama2-tokenizer.model";
    sentencepiece::SentencePieceProcessor ref;
    REQUIRE(ref.Load(path).ok());
    auto tok = load_tokenizer(path);

    std::ifstream f(std::string(LATTICE_SHARED_DIR) + "/tokenizers/ggml-vocab-llama-spm.gguf.inp", std::ios::binary);
    const std::string pool(std::istreambuf_iterator<char>(f), {});
    REQUIRE(pool.size() > 1000);
    const char* words[] = {"the", " ", "  ",   "\n", "\t", "Hello", "world", "tokenizer", "123",   "4.5", "'s",
                           "!!",  "é", "中文", "😀",  "ß",  "Ω",     "—",     "  \n ",     "don't", "x",   "A"};
    std::mt19937 rng(42);
    int compared = 0, with_fallback = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string s;
        const int parts = 1 + int(rng() % 12);
        for (int p = 0; p < parts; ++p) {
            switch (rng() % 3) {
                case 0:
                    s += words[rng() % (sizeof(words) / sizeof(words[0]))];
                    break;
                case 1: {
                    const size_t at = rng() % pool.size();
                    s += pool.substr(at, rng() % 24);
                    break;
                }
                default: {
                    uint32_t cp = 0x20 + rng() % 0x2FFF0;
                    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E00;
                    utf8_append(s, cp);
                }
            }
        }
        // Keep valid UTF-8 only, and no "▁" (both tokenizers treat it as a space; not a round trip).
        bool valid = true;
        for (size_t p = 0; p < s.size();)
            if (utf8_next(s, p) == kInvalidCodepoint) valid = false;
        if (!valid || s.find("\xE2\x96\x81") != std::string::npos) continue;
        std::vector<int> expected;
        REQUIRE(ref.Encode(s, &expected).ok());
        const std::vector<int32_t> got = tok->encode(s);
        CAPTURE(s);
        CHECK(std::vector<int>(got.begin(), got.end()) == expected);
        CHECK(tok->decode(got) == s);
        ++compared;
        for (int id : expected) with_fallback += ref.IsByte(id) ? 1 : 0;
    }
    CHECK(compared > 2000);
    CHECK(with_fallback > 100);  // byte fallback was really exercised
}
