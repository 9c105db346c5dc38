// End to end through the engine: the golden GGUF copies must reproduce the float64 reference of
// their HF originals (every greedy token; logits to relative error < 1e-4), exactly as the HF path
// does; and the built-in default model (SmolLM2-135M-Instruct Q4_1, models/ of the checkout) must
// actually model English: mean NLL per token of a fixed paragraph far below log(vocab) = 10.8.
// Separate executable from test_gguf so the parser tests do not depend on the engine.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "runtime/engine/client.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/tensor_source.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/nll.h"
#include "tests/test_paths.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

void check_gguf_golden(const std::string& model_name, const std::string& file, int threads, int64_t batch) {
    const std::string path = std::string(LATTICE_SHARED_DIR) + "/golden/gguf/" + file;
    check_golden_model(path, load_golden(model_name), threads, batch);
}

}  // namespace

TEST_CASE("golden GGUF: tiny-llama2 f32 reproduces the reference") {
    check_gguf_golden("tiny-llama2", "tiny-llama2.f32.gguf", 1, 256);
}

TEST_CASE("golden GGUF: tiny-gqa-llama3 f16 with rope_freqs reproduces the reference") {
    check_gguf_golden("tiny-gqa-llama3", "tiny-gqa-llama3.f16.gguf", 2, 256);
}

TEST_CASE("golden GGUF: tiny-fp16-tied f16 reproduces the reference (prompt chunks of 3)") {
    check_gguf_golden("tiny-fp16-tied", "tiny-fp16-tied.f16.gguf", 2, 3);
}

TEST_CASE("default model: SmolLM2-135M-Instruct Q4_1 models English") {
    const std::string path = test::default_model_file();
    REQUIRE_FILE(path);
    auto src = open_model(path);
    auto tok = load_tokenizer(path);
    const std::string text =
        "The sun rose slowly over the quiet village. Farmers walked to their fields, children ran to school, and "
        "the baker opened his shop to sell fresh bread. It was the first warm day of spring, and everyone seemed "
        "happy to be outside after the long, cold winter.";
    std::vector<int32_t> ids = tok->encode(text);
    REQUIRE(ids.size() > 40);
    CpuBackend be(CpuBackendOptions{2, false, false});
    ModelOptions mo;
    mo.max_seq = 256;
    Model model(*src, be, mo, nullptr);
    auto gen = make_local_engine(model);
    const int64_t V = src->config().vocab;
    std::vector<float> logits = EngineClient(*gen, nullptr, true).score(ids);
    REQUIRE(logits.size() == ids.size() * size_t(V));
    const double nll = mean_nll(logits, ids, V);
    MESSAGE("SmolLM2 mean NLL " << nll << " nats/token over " << ids.size() - 1
                                << " tokens (random: " << std::log(double(V)) << ")");
    CHECK(nll < 4.5);
    CHECK(nll > 0.1);  // a model that is "certain" of everything is broken, too
}

TEST_CASE("default model: greedy chat answer is the recorded English sentence (1 and 2 threads)") {
    const std::string path = test::default_model_file();
    REQUIRE_FILE(path);
    // Recorded from this engine (fp32 CPU path) on 2026-11-29; decodes to
    // "The ocean is a vast, mysterious, and awe-inspiring body of water".
    const std::vector<int32_t> kRecorded = {504, 5065,  314, 253,   4749, 28,   11965, 28,
                                            284, 27456, 29,  22846, 3166, 1248, 282,   913};
    auto src = open_model(path);
    auto tok = load_tokenizer(path);
    REQUIRE(tok->chat_template_kind() == ChatTemplateKind::kChatML);
    std::string prompt = tok->chat_template().render({{"user", "Describe the ocean in two sentences."}}, true);
    std::vector<int32_t> ids = tok->encode(prompt, false, true);
    REQUIRE(ids.size() > 10);
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        CpuBackend be(CpuBackendOptions{threads, false, false});
        ModelOptions mo;
        mo.max_seq = 256;
        Model model(*src, be, mo, nullptr);
        auto gen = make_local_engine(model);
        GenerateRequest req;
        req.prompt = ids;
        req.max_new_tokens = 16;
        req.ignore_eos = true;
        std::vector<int32_t> out = EngineClient(*gen, nullptr, true).generate(req).tokens;
        std::string text = tok->decode(out);
        CAPTURE(text);
        CHECK(out == kRecorded);
        // Independently of the recording: ASCII words (letters, with , . - ' attached), at least 8 of them.
        int words = 0;
        bool in_word = false, ok = true;
        for (char ch : text) {
            const bool letter = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
            if (letter && !in_word) ++words;
            in_word = letter || (in_word && (ch == '-' || ch == '\''));
            ok = ok && (letter || ch == ' ' || ch == ',' || ch == '.' || ch == '-' || ch == '\'');
        }
        CHECK(ok);
        CHECK(words >= 8);
    }
}
