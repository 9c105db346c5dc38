// `lattice serve`: the OpenAI-compatible HTTP server over the request engine.
//   rank 0   listens as soon as the rank grid exists (GET /health: 503 "loading"), builds its model
//            shard, waits for every rank (a world barrier), then serves: the HTTP I/O on its own
//            threads (launch/server/http_server.h), the engine on the main thread
//            (launch/server/engine_loop.h), joined by an Inbox of tickets (launch/server/exchange.h).
//   others   build their shard, pass the barrier and follow the leader's step plans until its shutdown.
// Prints one line "lattice serve: listening on http://HOST:PORT" on stdout when bound (--port 0
// picks a free port: scripts read it there).
// SIGTERM / SIGINT / SIGUSR1 (launch/drain_signal.h): drain (GET /health answers 503 "draining" with
// Retry-After, new requests 503, the listener open), finish in-flight requests for up to
// --drain-seconds (cut after that, with a 503 error to their clients), give the connections a few
// seconds to take their last bytes, exit 0.
// The API key comes from --api-key or, better (the command line is visible to every user of the
// machine), the environment variable LATTICE_API_KEY.
#include <fmt/format.h>

#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "launch/server/engine_loop.h"
#include "launch/server/http_server.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

struct ServeArgs {
    ModelArgs model;
    serve::ServerOptions server;
    serve::LoopOptions loop;
    std::string served_name;
};

std::string default_served_name(const ModelArgs& m) {
    if (m.random_weights) return m.config_preset.empty() ? "random" : m.config_preset;
    std::string p = m.model;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
}

int run_serve(ServeArgs& args) {
    if (args.model.model.empty() && !args.model.random_weights) args.model.model = default_model_path();
    if (args.server.api_key.empty())
        if (const char* k = std::getenv("LATTICE_API_KEY")) {
            // Set but empty is a mistake more often than a wish (an unexpanded variable in a job script):
            // it would serve without authentication.
            LATTICE_CHECK(*k != '\0', "LATTICE_API_KEY is set but empty: that would serve without authentication; "
                                       "set a key, or unset LATTICE_API_KEY to serve without one");
            args.server.api_key = k;
        }
    if (args.served_name.empty()) args.served_name = default_served_name(args.model);
    // Every request passes through the engine's waiting queue (admitted at the next step), so 0 would refuse all.
    LATTICE_CHECK(args.loop.max_queue >= 1, "--max-queue must be >= 1, got {}", args.loop.max_queue);

    // Declared before the server: its I/O threads use them until it stops.
    serve::Inbox inbox;
    serve::Metrics metrics;
    std::unique_ptr<serve::LoraCatalog> loras;  // (outlives the server, whose threads read it)
    std::unique_ptr<serve::HttpServer> server;
    RankRuntime rt = load_model(args.model, [&](const WorldConfig& w) {
        if (w.rank != 0) return;
        server = std::make_unique<serve::HttpServer>(args.server, inbox, metrics);
        server->start();
        print_stdout("lattice serve: listening on {}\n", server->url());
        flush_stdout();
    });
    install_drain_handlers();
    if (rt.world.world > 1) rt.world_comm->barrier();  // every rank holds its shard and KV cache
    const std::unique_ptr<Tokenizer> tok =
        rt.world.rank == 0 ? optional_tokenizer(args.model, "serve",
                                                "prompts must be token ids, responses carry token_ids and no text")
                           : nullptr;
    EngineClient client(*rt.engine, tok.get());
    if (!client.is_leader()) {
        client.follow();
        return 0;
    }
    serve::ServedModel sm;
    sm.name = args.served_name;
    sm.tokenizer = tok.get();
    sm.limits = openai::ApiLimits{rt.model->config().vocab};
    sm.context = client.context();
    sm.created = int64_t(std::time(nullptr));
    loras = std::make_unique<serve::LoraCatalog>(client.loras(), sm.name);
    for (const LoraInfo& i : client.loras().list()) loras->seed(i.name, i.path);
    sm.loras = loras.get();
    args.loop.loras = loras.get();
    metrics.set_model(sm.name, sm.context);
    server->set_ready(sm);
    LOG_INFO("serve: ready: model \"{}\" on {} rank(s), context {}, KV cache {} blocks, at {}", sm.name, rt.world.world,
             client.context(), client.scheduler().pool().num_blocks(), server->url());

    serve::EngineLoop loop(client, inbox, metrics, args.loop);
    loop.run([] { return drain_requested(); }, [&] { server->begin_drain(); });
    // The last responses may still be on their way out.
    const bool flushed = server->wait_idle(serve::Clock::now() + std::chrono::seconds(5));
    server->stop();
    inbox.clear();
    client.shutdown();
    const serve::LoopTotals& t = loop.totals();
    print_stderr(fmt::format(
        "lattice serve: stopped by signal {}: {} request(s) served, {} refused, {} cancelled by clients, {} cut at the "
        "drain deadline{}\n",
        drain_requested(), t.requests, t.refused, t.cancelled, t.cut_by_drain,
        flushed ? "" : "; some responses were still being written"));
    return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<ServeArgs>();
    auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, models, metrics)");
    args->model.add_to(cmd);
    serve::ServerOptions& s = args->server;
    cmd->add_option("--host", s.host, "Address to listen on (default 127.0.0.1: this machine only)");
    cmd->add_option("--port", s.port, "TCP port (default 8000; 0: any free port, printed)")
        ->check(CLI::Range(0, 65535));
    cmd->add_option("--api-key", s.api_key,
                    "Require \"Authorization: Bearer KEY\" on /v1 routes (or set LATTICE_API_KEY: the command line is "
                    "visible to other users)")
        ->check([](const std::string& v) {
            return v.empty() ? std::string("an empty --api-key would serve without authentication; leave it out instead")
                             : std::string();
        });
    cmd->add_option("--served-model-name", args->served_name,
                    "The name clients pass as \"model\" (default: the model file or folder's name)");
    cmd->add_option("--max-queue", args->loop.max_queue, "Requests waiting for the engine at most (>= 1); more get 503")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body (413 beyond)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
    cmd->add_option("--stream-buffer-bytes", s.stream_buffer_bytes,
                    "Response data held for a client that does not read; beyond it the request is cancelled")
        ->check(CLI::Range(int64_t(1024), int64_t(1) << 32));
    cmd->add_option("--client-timeout", s.client_timeout_s,
                    "Seconds a client has to send a request, and to take each piece of a response")
        ->check(CLI::Range(0.1, 86400.0));
    cmd->add_option("--http-threads", s.threads, "I/O threads (the engine has the main thread)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--max-connections", s.max_connections, "Open connections at most (503 beyond)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    cmd->add_option("--drain-seconds", args->loop.drain_seconds,
                    "On SIGTERM/SIGINT/SIGUSR1, finish in-flight requests for at most this long (default 30)")
        ->check(CLI::Range(0.0, 86400.0));
    cmd->footer(R"(Examples:
  lattice serve --port 8000                     # the built-in model on 127.0.0.1:8000
  mpirun -np 3 --oversubscribe lattice serve --tp 3 --threads 1
  launch/lattice-mpirun --tp 8 -- lattice serve --model /models/llama-70b --quant w8a8 --host 0.0.0.0)");
    cmd->callback([&run, args] { run = [args] { return run_serve(*args); }; });
}

}  // namespace lattice
