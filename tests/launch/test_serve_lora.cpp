// `lattice serve`'s LoRA routes without sockets or an engine (launch/server/lora_catalog.h, api.h): /v1/models
// lists each adapter with "parent" (the base); a request's "model" may name an adapter, an unknown name is a
// 404 naming it; POST /v1/load_lora_adapter checks the adapter before it answers (another base's adapter: 400
// naming the shape; the catalog unchanged), needs an API key (403 without), refuses a name twice; unload of
// an unknown name is a 404; the queued loads and unloads reach the engine's registry in order (apply()).
// The engine loop (launch/server/engine_loop.h) on the golden tiny-llama2 with its fixture adapter a4: a request
// the route took for a4 whose adapter is unloaded before the loop admits it is a 404 naming it (never run on the
// base); the same request for a4 while loaded, and for the base, run.
#include <doctest/doctest.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "launch/server/api.h"
#include "launch/server/engine_loop.h"
#include "launch/server/lora_catalog.h"
#include "launch/server/metrics.h"
#include "runtime/builder/build.h"
#include "tests/runtime/model/lora_test_util.h"
#include "tests/test_build.h"
#include "runtime/arch/config.h"
#include "tests/launch/serve_routes.h"
#include "tests/test_paths.h"

using namespace lattice;
using lattice::serve::LoraCatalog;
using lattice::serve::RouteContext;
using lattice::serve::Routed;
using lattice::serve::ServedModel;
using nlohmann::json;

namespace {

ModelConfig golden_config() {
    const std::string path = test::shared_dir() + "/golden/tiny-llama2/config.json";
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return parse_hf_config(ss.str(), path);
}

std::string fixture(const std::string& rel) {
    return testing::lora_dir(rel);
}

// The deltas the engine loop delivers for one request on tiny-llama2 (served as "tiny", adapter a4 seeded), the
// adapter unloaded first when `unload`: its last delta says how it ended.
std::vector<openai::Delta> loop_deltas(const std::string& model, bool unload) {
    BuildOptions opt = test::cpu_options(1);
    opt.engine.max_loras = 1;
    opt.engine.max_lora_rank = 16;
    auto src = open_model(testing::golden_dir("tiny-llama2"));
    RankRuntime rt = build(opt, *src);
    EngineClient client(*rt.engine, nullptr, true);
    client.loras().add("a4", fixture("tiny-llama2/a4"));
    LoraCatalog cat(client.loras(), "tiny");
    cat.seed("a4", fixture("tiny-llama2/a4"));
    serve::Inbox inbox;
    serve::Metrics metrics;
    metrics.set_model("tiny", 64);
    serve::LoopOptions lo;
    lo.loras = &cat;
    serve::EngineLoop loop(client, inbox, metrics, lo);
    auto ticket = std::make_shared<serve::Ticket>();
    ticket->request.model = model;
    ticket->request.client.prompt = {1, 5, 9};
    ticket->request.client.max_tokens = 3;
    ticket->request.prompts = {ticket->request.client.prompt};
    std::vector<openai::Delta> got;
    std::mutex mu;
    ticket->deliver = [&](openai::Delta&& d) {
        std::lock_guard lock(mu);
        got.push_back(std::move(d));
    };
    inbox.submit(ticket);  // the route took the name while a4 was loaded
    if (unload) cat.unload("a4");
    auto ended = [&] {
        std::lock_guard lock(mu);
        if (got.empty()) return false;
        return got.back().kind == openai::Delta::Kind::kError || got.back().kind == openai::Delta::Kind::kFinish;
    };
    loop.run([&] { return ended() ? 15 : 0; }, [] {});
    return got;
}

// A POST with the test's API key.
Routed post(const RouteContext& ctx, const std::string& path, const json& body) {
    return test::post(ctx, path, body.dump(), "Bearer k");
}

}  // namespace

TEST_CASE("serve LoRA routes: models list, adapter by model, 404 naming it, load / unload checked") {
    const ModelConfig cfg = golden_config();
    LoraRegistry reg(cfg, 2, 16);
    LoraCatalog cat(reg, "tiny");
    cat.seed("a4", fixture("tiny-llama2/a4"));
    ServedModel m = test::served_model("tiny", cfg.vocab, 64);
    m.loras = &cat;
    RouteContext ctx = test::serving(m);
    ctx.api_key = "k";
    const Routed list = test::get(ctx, "/v1/models", "Bearer k");
    REQUIRE(list.reply);
    const json cards = json::parse(list.reply->body)["data"];
    REQUIRE(cards.size() == 2);
    CHECK(cards[1]["id"] == "a4");
    CHECK(cards[1]["parent"] == "tiny");
    CHECK(json::parse(test::get(ctx, "/v1/models/a4", "Bearer k").reply->body)["parent"] == "tiny");
    const Routed ok = post(ctx, "/v1/completions", {{"model", "a4"}, {"prompt", {1, 2, 3}}});
    REQUIRE(ok.call);
    CHECK(ok.call->model == "a4");
    CHECK(ok.call->request.model == "a4");
    const Routed unknown = post(ctx, "/v1/completions", {{"model", "b16"}, {"prompt", {1, 2, 3}}});
    REQUIRE(unknown.reply);
    CHECK(unknown.reply->status == 404);
    CHECK(json::parse(unknown.reply->body)["error"]["message"].get<std::string>().find("\"b16\" does not exist") !=
          std::string::npos);
    // Loads: another base's adapter refused naming the shape; a good one added (then routable); twice refused.
    const Routed bad = post(ctx, "/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", fixture("tp3-base/a4")}});
    CHECK(bad.reply->status == 400);
    CHECK(bad.reply->body.find("another base") != std::string::npos);
    CHECK(!cat.has("x"));
    const Routed good =
        post(ctx, "/v1/load_lora_adapter", {{"lora_name", "b16"}, {"lora_path", fixture("tiny-llama2/b16")}});
    CHECK(good.reply->status == 200);
    CHECK(good.reply->body == "Success: LoRA adapter 'b16' added successfully.");
    CHECK(post(ctx, "/v1/completions", {{"model", "b16"}, {"prompt", {1, 2, 3}}}).call);
    CHECK(post(ctx, "/v1/load_lora_adapter", {{"lora_name", "b16"}, {"lora_path", fixture("tiny-llama2/b16")}})
              .reply->status == 400);
    CHECK(post(ctx, "/v1/load_lora_adapter", {{"lora_name", "q"}}).reply->status == 400);  // no lora_path
    CHECK(post(ctx, "/v1/load_lora_adapter", {{"lora_name", "tiny"}, {"lora_path", fixture("tiny-llama2/c8")}})
              .reply->status == 400);  // the base's name
    CHECK(post(ctx, "/v1/unload_lora_adapter", {{"lora_name", "zz"}}).reply->status == 404);
    CHECK(post(ctx, "/v1/unload_lora_adapter", {{"lora_name", "a4"}}).reply->status == 200);
    CHECK(!cat.has("a4"));
    // The engine thread's registry gets the queued load of b16 and the unload of a4, in order.
    reg.add("a4", fixture("tiny-llama2/a4"));
    cat.apply(reg);
    CHECK(reg.has("b16"));
    CHECK(!reg.has("a4"));
    // Without an API key the server reads no path it is given.
    RouteContext open = ctx;
    open.api_key = "";
    const Routed refused = test::post(open, "/v1/load_lora_adapter",
                                      json{{"lora_name", "c8"}, {"lora_path", fixture("tiny-llama2/c8")}}.dump());
    CHECK(refused.reply->status == 403);
}

TEST_CASE("serve LoRA metrics: requests, tokens and running per adapter, resident of max_loras") {
    serve::Metrics metrics;
    metrics.set_model("tiny", 64);
    serve::EngineGauges g;
    g.loras = {serve::LoraGauge{"sql", 3, 120, 1, true}, serve::LoraGauge{"chat", 1, 9, 0, false}};
    g.max_loras = 2;
    metrics.set_engine(g);
    const std::string text = metrics.render();
    CHECK(text.find("lattice:lora_requests_total{model_name=\"tiny\",lora_name=\"sql\"} 3") != std::string::npos);
    CHECK(text.find("lattice:lora_tokens_total{model_name=\"tiny\",lora_name=\"chat\"} 9") != std::string::npos);
    CHECK(text.find("lattice:lora_requests_running{model_name=\"tiny\",lora_name=\"sql\"} 1") != std::string::npos);
    CHECK(text.find("lattice:lora_resident{model_name=\"tiny\",max_loras=\"2\"} 1") != std::string::npos);
}

TEST_CASE("serve engine loop: a request for an adapter unloaded after its route took it is a 404, never the base") {
    const std::vector<openai::Delta> gone = loop_deltas("a4", true);
    REQUIRE(gone.size() == 1);
    CHECK(gone[0].kind == openai::Delta::Kind::kError);
    CHECK(gone[0].status == 404);
    CHECK(gone[0].message.find("'a4' does not exist") != std::string::npos);
    CHECK(gone[0].error_param == "model");
    CHECK(gone[0].error_code == "model_not_found");
    for (const char* model : {"a4", "tiny"}) {
        CAPTURE(model);
        const std::vector<openai::Delta> ran = loop_deltas(model, false);
        REQUIRE(!ran.empty());
        CHECK(ran.front().kind == openai::Delta::Kind::kAccepted);
        CHECK(ran.back().kind == openai::Delta::Kind::kFinish);
        CHECK(ran.back().completion_tokens == 3);
    }
}
