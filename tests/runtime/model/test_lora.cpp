// LoRA adapters on one rank: each fixture adapter (ranks 4 / 16 / 8, different target sets, rsLoRA on and
// off, F32 / F16 / BF16 files) applied unmerged gives the logits of the base with the adapter merged in,
// computed in float64 by NumPy (tests/runtime/model/lora/make_lora_fixtures.py), within 1e-5; the GGUF twin
// of one equals it; a mixed batch of 32 sequences (base and three adapters interleaved) gives each sequence
// the tokens it gets alone; the prefix cache never hands one adapter's K/V to another; with one slot the
// adapters take turns (LRU), and a request for another adapter while the slot is held waits for it; prompt
// logprobs under an adapter are its generate-side logprobs; bad adapters are refused at load with a message naming the fault while the
// others keep serving.
#include <doctest/doctest.h>

#include "runtime/model/lora.h"
#include "tests/runtime/model/lora_test_util.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/test_temp_dir.h"

#include <filesystem>

using namespace lattice;
using namespace lattice::testing;

namespace {

RankRuntime build_base(const std::string& base, int64_t max_loras = 4, QuantMode quant = QuantMode::kNone) {
    BuildOptions opt = test::cpu_options(1);
    opt.model.max_batch_tokens = 64;
    opt.model.quant = quant;
    opt.engine.max_loras = max_loras;
    opt.engine.max_lora_rank = 16;
    auto src = open_model(lora_base_path(base));
    return build(opt, *src);
}

}  // namespace

TEST_CASE("LoRA: unmerged adapters equal the float64 merged reference (1e-5), GGUF twin included") {
    for (const std::string base : {"tiny-llama2", "tp3-base"}) {
        CAPTURE(base);
        RankRuntime rt = build_base(base);
        add_fixture_adapters(*rt.engine, base);
        const LoraCases cases(base);
        EngineClient client(*rt.engine, nullptr, true);
        for (size_t i = 0; i < cases.prompts.size(); ++i) {
            CAPTURE(i);
            const std::vector<float> ref_base = cases.logits("base", i);
            const std::vector<float> got_base = client.score(cases.prompts[i]);
            CHECK(rel_error(got_base.data(), ref_base.data(), ref_base.size()) < 1e-5);
            for (const std::string& a : lora_adapters()) {
                CAPTURE(a);
                const std::vector<float> ref = cases.logits(a, i);
                const std::vector<float> got = client.score(cases.prompts[i], a);
                REQUIRE(got.size() == ref.size());
                const double err = rel_error(got.data(), ref.data(), ref.size());
                MESSAGE(base << " " << a << " case " << i << ": rel err " << err);
                CHECK(err < 1e-5);
                CHECK(rel_error(ref_base.data(), ref.data(), ref.size()) > 1e-2);  // the adapter matters
            }
        }
        if (base == "tiny-llama2") {  // llama.cpp's GGUF LoRA of b16 (q/k B rows in RoPE-pair order)
            rt.engine->loras().add("b16-gguf", lora_dir(base) + "/b16.gguf");
            const std::vector<float> ref = cases.logits("b16", 0);
            const std::vector<float> got = client.score(cases.prompts[0], "b16-gguf");
            CHECK(rel_error(got.data(), ref.data(), ref.size()) < 1e-5);
        }
    }
}

TEST_CASE("LoRA: on INT8 and 4-bit bases the adapter adds no error beyond the quantized base's") {
    // The adapter's product stays f32 over any base format: against the merged float64 reference, the adapted
    // quantized model errs about as the quantized base does against its own reference.
    const LoraCases cases("tiny-llama2");
    for (const QuantMode q : {QuantMode::kW8A8, QuantMode::kW8A16, QuantMode::kW4A16, QuantMode::kW4A8}) {
        CAPTURE(quant_mode_name(q));
        RankRuntime rt = build_base("tiny-llama2", 4, q);
        add_fixture_adapters(*rt.engine, "tiny-llama2");
        EngineClient client(*rt.engine, nullptr, true);
        const std::vector<float> ref_base = cases.logits("base", 0);
        const std::vector<float> got_base = client.score(cases.prompts[0]);
        const double e_base = rel_error(got_base.data(), ref_base.data(), ref_base.size());
        for (const std::string& a : lora_adapters()) {
            const std::vector<float> ref = cases.logits(a, 0);
            const std::vector<float> got = client.score(cases.prompts[0], a);
            const double e = rel_error(got.data(), ref.data(), ref.size());
            MESSAGE(quant_mode_name(q) << " " << a << ": rel err " << e << " (base " << e_base << ")");
            CHECK(e < 1.5 * e_base);
        }
    }
}

TEST_CASE("LoRA: a mixed batch (base + 3 adapters, 32 sequences) gives each sequence its tokens alone") {
    RankRuntime rt = build_base("tiny-llama2");
    add_fixture_adapters(*rt.engine, "tiny-llama2");
    EngineClient client(*rt.engine, nullptr, true);
    const std::vector<std::string> who = {"", "a4", "b16", "c8"};
    std::vector<ClientRequest> reqs;
    for (int s = 0; s < 32; ++s) {
        ClientRequest r;
        r.prompt = random_ids(3 + s % 7, 320, uint32_t(100 + s % 8));  // repeated prompts: prefix-cache hits
        r.max_tokens = 6;
        r.ignore_eos = true;
        r.lora = who[size_t(s) % who.size()];
        reqs.push_back(r);
    }
    const std::vector<ClientOutput> batch = client.run(reqs);
    REQUIRE(batch.size() == reqs.size());
    int differs = 0;
    for (size_t s = 0; s < reqs.size(); ++s) {
        CAPTURE(s);
        CHECK(batch[s].tokens == lora_greedy(client, reqs[s].prompt, reqs[s].lora, 6));
        if (!reqs[s].lora.empty()) differs += batch[s].tokens != lora_greedy(client, reqs[s].prompt, "", 6);
    }
    CHECK(differs >= 12);  // most adapted sequences leave the base's path
    for (const LoraInfo& i : rt.engine->loras().list()) CHECK(i.active == 0);
}

TEST_CASE("LoRA: the prefix cache keys on the adapter; one slot serves three adapters in turn (LRU)") {
    RankRuntime rt = build_base("tiny-llama2", 1);
    add_fixture_adapters(*rt.engine, "tiny-llama2");
    const LoraCases cases("tiny-llama2");
    EngineClient client(*rt.engine, nullptr, true);
    // A prompt of several full blocks, first under the base (its blocks enter the cache), then under a4.
    const std::vector<int32_t> prompt = random_ids(50, 320, 7);
    const std::vector<int32_t> base = lora_greedy(client, prompt, "", 4);
    const std::vector<int32_t> warm = lora_greedy(client, prompt, "a4", 4);
    CHECK(warm == lora_greedy(client, prompt, "a4", 4));
    RankRuntime cold_rt = build_base("tiny-llama2", 1);
    add_fixture_adapters(*cold_rt.engine, "tiny-llama2");
    EngineClient cold(*cold_rt.engine, nullptr, true);
    CHECK(warm == lora_greedy(cold, prompt, "a4", 4));
    CHECK(warm != base);
    // Slot reuse: each adapter evicts the previous one and still scores right.
    for (const std::string a : {"c8", "a4", "b16", "a4"}) {
        CAPTURE(a);
        const std::vector<float> ref = cases.logits(a, 0);
        const std::vector<float> got = client.score(cases.prompts[0], a);
        CHECK(rel_error(got.data(), ref.data(), ref.size()) < 1e-5);
        CHECK(rt.engine->loras().resident() == 1);
    }
}

TEST_CASE("LoRA: with every slot held, a request for another adapter waits for one, then runs with it") {
    // --max-loras 1: a4 holds the slot while its request runs; c8's request waits (queued, not refused) and
    // starts only after a4's last token, with c8; the base's request needs no slot and runs beside a4's.
    RankRuntime rt = build_base("tiny-llama2", 1);
    add_fixture_adapters(*rt.engine, "tiny-llama2");
    EngineClient client(*rt.engine, nullptr, true);
    const std::vector<std::string> who = {"a4", "c8", ""};
    std::vector<ClientRequest> reqs;
    for (size_t i = 0; i < who.size(); ++i) {
        ClientRequest r;
        r.prompt = random_ids(5, 320, uint32_t(300 + i));
        r.max_tokens = 6;
        r.ignore_eos = true;
        r.lora = who[i];
        reqs.push_back(r);
    }
    std::vector<std::pair<size_t, bool>> order;  // (request, its last event) as they came
    const std::vector<ClientOutput> out = client.run(reqs, [&order](size_t i, const ClientEvent& ev) {
        order.emplace_back(i, ev.finish != FinishReason::kNone);
        return true;
    });
    const auto at = [&order](size_t req, bool last) {
        return size_t(std::find(order.begin(), order.end(), std::pair{req, last}) - order.begin());
    };
    REQUIRE(at(0, true) < order.size());
    CHECK(at(1, false) > at(0, true));  // c8's first event after a4's last
    CHECK(at(2, false) < at(0, true));  // the base did not wait
    for (size_t i = 0; i < who.size(); ++i) {
        CAPTURE(i);
        CHECK(out[i].finish == FinishReason::kLength);
        CHECK(out[i].tokens == lora_greedy(client, reqs[i].prompt, who[i], 6));
        if (i < 2) CHECK(out[i].tokens != lora_greedy(client, reqs[i].prompt, "", 6));
    }
    // A waiting request can be cancelled: it ends with no token and never takes the slot.
    const int64_t a = client.submit(reqs[0]), c = client.submit(reqs[1]);
    std::vector<ClientEvent> events = client.poll();
    client.cancel(c);
    while (client.busy())
        for (ClientEvent& e : client.poll()) events.push_back(e);
    size_t a_tokens = 0, c_events = 0;
    for (const ClientEvent& e : events) {
        a_tokens += e.id == a && e.token >= 0;
        if (e.id != c) continue;
        ++c_events;
        CHECK(e.token < 0);
        CHECK(e.finish == FinishReason::kCancelled);
    }
    CHECK(a_tokens == 6);
    CHECK(c_events == 1);
    for (const LoraInfo& i : rt.engine->loras().list()) CHECK(i.active == 0);
}

TEST_CASE("LoRA: prompt logprobs under an adapter equal the adapter's own generate-side logprobs") {
    // Echo / prompt_logprobs / `lattice score --lora` score with the adapter: the logprob of each generated token,
    // scored as part of prompt + output, is the one generation reported for it (and not the base's).
    RankRuntime rt = build_base("tiny-llama2", 1);
    add_fixture_adapters(*rt.engine, "tiny-llama2");
    EngineClient client(*rt.engine, nullptr, true);
    for (const std::string a : {"a4", "b16", "c8"}) {
        CAPTURE(a);
        ClientRequest r;
        r.prompt = random_ids(5, 320, 400);
        r.max_tokens = 6;
        r.ignore_eos = true;
        r.lora = a;
        const ClientOutput gen = client.run({r})[0];
        std::vector<int32_t> all = r.prompt;
        all.insert(all.end(), gen.tokens.begin(), gen.tokens.end());
        const PromptLogprobs lp = client.prompt_logprobs(all, 0, a), base = client.prompt_logprobs(all, 0);
        REQUIRE(gen.logprobs.size() == 6);
        double moved = 0;
        for (size_t i = 0; i < gen.tokens.size(); ++i) {
            CAPTURE(i);
            CHECK(std::abs(lp.logprobs[r.prompt.size() + i] - gen.logprobs[i]) < 1e-4);
            moved = std::max(moved, double(std::abs(base.logprobs[r.prompt.size() + i] - gen.logprobs[i])));
        }
        CHECK(moved > 1e-2);  // the base scores them otherwise
    }
}

TEST_CASE("LoRA: bad adapters are refused at load, naming the fault; the others keep serving") {
    RankRuntime rt = build_base("tiny-llama2");
    LoraRegistry& reg = rt.engine->loras();
    reg.add("a4", lora_dir("tiny-llama2") + "/a4");
    const auto refused = [&](const std::string& name, const std::string& path, const std::string& what) {
        CAPTURE(name);
        CHECK_THROWS_WITH_AS(reg.add(name, path), doctest::Contains(what.c_str()), Error);
        CHECK(!reg.has(name));
    };
    // Another base's adapter: the shape is named.
    refused("other", lora_dir("tp3-base") + "/a4", "another base");
    refused("other", lora_dir("tp3-base") + "/a4", "q_proj");
    // Rank 16 over --max-lora-rank 8.
    LoraRegistry small(rt.model->config(), 2, 8);
    CHECK_THROWS_WITH_AS(small.add("b16", lora_dir("tiny-llama2") + "/b16"),
                         doctest::Contains("rank 16 exceeds --max-lora-rank 8"), Error);
    TempDir tmp("lattice_lora");
    const auto copy = [&](const std::string& name) {
        std::filesystem::copy(lora_dir("tiny-llama2") + "/a4", tmp / name);
        return tmp / name;
    };
    const auto set_config = [&](const std::string& dir, const std::string& from, const std::string& to) {
        std::ifstream f(dir + "/adapter_config.json");
        std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const size_t at = text.find(from);
        REQUIRE(at != std::string::npos);
        text.replace(at, from.size(), to);
        std::ofstream(dir + "/adapter_config.json") << text;
    };
    // A target module listed but missing from the tensors.
    const std::string missing = copy("missing");
    set_config(missing, "\"v_proj\"", "\"v_proj\", \"up_proj\"");
    refused("missing", missing, "up_proj of layer 0 is missing");
    // modules_to_save, refused by name.
    const std::string save = copy("save");
    set_config(save, "\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]");
    refused("save", save, "modules_to_save");
    // An unsupported target.
    const std::string embed = copy("embed");
    set_config(embed, "\"v_proj\"", "\"v_proj\", \"embed_tokens\"");
    refused("embed", embed, "target module 'embed_tokens' is not supported");
    // A truncated safetensors file.
    const std::string cut = copy("cut");
    std::filesystem::resize_file(cut + "/adapter_model.safetensors",
                                 std::filesystem::file_size(cut + "/adapter_model.safetensors") / 2);
    refused("cut", cut, "adapter_model.safetensors");
    // Unknown names at request time; a4 still serves.
    EngineClient client(*rt.engine, nullptr, true);
    CHECK_THROWS_WITH_AS(client.score({1, 5, 9}, "nope"), doctest::Contains("'nope' does not exist"), Error);
    const LoraCases cases("tiny-llama2");
    const std::vector<float> ref = cases.logits("a4", 0);
    const std::vector<float> got = client.score(cases.prompts[0], "a4");
    CHECK(rel_error(got.data(), ref.data(), ref.size()) < 1e-5);
    // Unload: gone for new requests.
    reg.remove("a4");
    CHECK_THROWS_WITH_AS(client.score({1, 5, 9}, "a4"), doctest::Contains("'a4' does not exist"), Error);
    CHECK_THROWS_WITH_AS(reg.remove("a4"), doctest::Contains("'a4' is not loaded"), Error);
}
