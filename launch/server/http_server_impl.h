// The inside of HttpServer (http_server.h), shared by its two sources: http_server.cpp (listen,
// accept, the lifecycle and drain) and http_session.cpp (one connection: read, route, stream, close).
// Private to launch/server/: it includes Boost.Asio and Beast, which nothing outside these files does.
// Invariant: a session holds its server's Impl by reference; the io_context that runs the sessions'
// handlers is destroyed before the members declared above it, with the handlers (and so the
// sessions) it still holds. Members a session reads off the I/O threads are atomics or thread-safe.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "launch/server/http_server.h"

namespace lattice::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct HttpServer::Impl {
    ServerOptions opt;
    Inbox& inbox;
    Metrics& metrics;
    std::atomic<bool> draining{false}, stopped{false};
    std::atomic<bool> interrupt_renders{false};  // the route threads' jinja::RenderInterrupt flag
    std::atomic<int64_t> active{0}, connections{0};
    std::atomic<uint64_t> requests{0};
    std::unique_ptr<ServedModel> model_storage;
    std::atomic<const ServedModel*> model{nullptr};
    int port = 0;
    // Declared last: destroyed first, with the handlers (and so the sessions) it still holds.
    net::io_context ioc;
    // route() of every POST (chat templates rendered, prompts tokenized, grammars compiled), off the I/O
    // threads. Its queue is bounded by the connections: each has at most one request being routed.
    net::thread_pool route_pool{2};
    tcp::acceptor acceptor{ioc};
    net::steady_timer accept_retry{ioc};
    std::vector<std::thread> threads;
    std::chrono::steady_clock::time_point last_accept_warning{};
    int64_t accept_failures = 0;  // since the last warning

    Impl(ServerOptions o, Inbox& in, Metrics& m) : opt(std::move(o)), inbox(in), metrics(m) {}
    void accept();  // http_server.cpp: each connection a Session (start_session)
    void fit_connections_to_descriptors();
};

// Serves one accepted connection until it closes (http_session.cpp); the session keeps itself alive.
void start_session(tcp::socket s, HttpServer::Impl& srv);

}  // namespace lattice::serve
