// The HTTP side of `lattice serve`: Boost.Beast over Boost.Asio on its own I/O threads (the engine
// keeps rank 0's main thread). Beast parses every request; nothing here parses HTTP by hand.
//
// Per connection (a Session on its own strand): read a request (header, then body, within
// --max-body-bytes: 413 beyond; the whole request within the client timeout), route it
// (launch/server/api.h): GET routes on the I/O thread, every POST on a pool of two route threads of
// its own, so that no chat template render, prompt tokenizing or grammar compile ever runs on an I/O
// thread (GET /health and /metrics answer whatever is being routed). Requests answered at once are
// written and the connection is kept alive (HTTP/1.1) or closed. Completion requests become a Ticket submitted to the engine thread
// (exchange.h); while one runs, the socket is watched for the client going away (EOF), which
// cancels it, and so does a client whose unsent response data passes --stream-buffer-bytes or
// whose writes stall for the client timeout: a slow reader costs its own request, never the
// engine or other streams. Streams go out as chunked server-sent events, one write at a time,
// everything that arrived meanwhile coalesced into the next chunk.
// Lifecycle: start() binds and listens before the model loads (GET /health answers 503
// "loading", /v1 routes 503); set_ready() once every rank holds the model; begin_drain() on a
// drain signal: the listener stays open, GET /health answers 503 "draining" with Retry-After, new
// generation requests get 503, requests in flight run to their end, and template renders still
// being routed are interrupted (jinja::RenderInterrupt: they would only be refused, with a 503);
// stop() interrupts what is left, ends the I/O threads, drops every connection and closes the
// listener.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "launch/server/api.h"
#include "launch/server/exchange.h"
#include "launch/server/metrics.h"

namespace lattice::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: any free port (printed by the caller)
    std::string api_key;
    int64_t max_body_bytes = 8 << 20;
    int64_t stream_buffer_bytes = 1 << 20;  // per connection: response data not yet taken by the socket
    double client_timeout_s = 60;           // a request must arrive, and each write complete, within this
    int threads = 1;
    int64_t max_connections = 1024;  // each has at most one request being routed: the route queue's bound
    std::function<void()> route_hook;  // tests: runs on the route pool before each route there
};

class HttpServer {
public:
    HttpServer(ServerOptions opt, Inbox& inbox, Metrics& metrics);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds and listens (Error naming host and port when it cannot) and starts the I/O threads.
    void start();
    int port() const;
    std::string url() const;
    // Once: the model is ready on every rank.
    void set_ready(ServedModel model);
    // Drain: /health 503 "draining", new generation requests 503, renders being routed interrupted;
    // the listener stays open and requests in flight go on.
    void begin_drain();
    // Completion requests whose response is not fully written yet.
    int64_t active() const;
    // Waits (polling) until active() == 0 or the deadline; true when idle.
    bool wait_idle(Clock::time_point deadline) const;
    // Ends the I/O threads; open connections are dropped. Idempotent.
    void stop();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace lattice::serve
