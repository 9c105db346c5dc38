// HttpServer (see http_server.h): listening, accepting, the lifecycle (ready, drain, stop) and the
// I/O threads. Each accepted connection is a Session (http_session.cpp); the state both share is
// HttpServer::Impl (http_server_impl.h). These files are the only ones that include Beast.
#include "launch/server/http_server.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "launch/server/http_server_impl.h"

namespace lattice::serve {

void HttpServer::Impl::accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
        if (!acceptor.is_open()) return;
        if (!ec) {
            start_session(std::move(s), *this);
            return accept();
        }
        // Out of descriptors and the like: try again shortly rather than spin, and say so at most
        // every 10 s (with how often it happened), not once per attempt.
        ++accept_failures;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_accept_warning >= std::chrono::seconds(10)) {
            LOG_WARN("serve: accept failed {} time(s) since the last warning: {}", accept_failures, ec.message());
            last_accept_warning = now;
            accept_failures = 0;
        }
        accept_retry.expires_after(std::chrono::milliseconds(100));
        accept_retry.async_wait([this](beast::error_code e) {
            if (!e && acceptor.is_open()) accept();
        });
    });
}

HttpServer::HttpServer(ServerOptions opt, Inbox& inbox, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(opt), inbox, metrics)) {}

HttpServer::~HttpServer() {
    stop();
}

// Each connection holds a descriptor: with a low `ulimit -n`, --max-connections above what is left
// would make accept() fail (EMFILE) instead of answering the excess with 503. Lower it to fit (the
// descriptors open now, plus a reserve for the model's files, MPI and logs), and say so.
void HttpServer::Impl::fit_connections_to_descriptors() {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    int64_t open_now = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (const dirent* e = ::readdir(d)) open_now += e->d_name[0] != '.';
        ::closedir(d);
    }
    constexpr int64_t kReserve = 32;
    const int64_t room = std::max<int64_t>(1, int64_t(rl.rlim_cur) - open_now - kReserve);
    if (opt.max_connections <= room) return;
    LOG_WARN("serve: --max-connections {} lowered to {}: this process may open {} files (ulimit -n), {} are open; "
             "more connections get 503",
             opt.max_connections, room, int64_t(rl.rlim_cur), open_now);
    opt.max_connections = room;
}

void HttpServer::start() {
    Impl& s = *impl_;
    s.fit_connections_to_descriptors();
    LATTICE_CHECK(s.opt.threads >= 1 && s.opt.threads <= 64, "--http-threads must be in [1, 64], got {}",
                  s.opt.threads);
    LATTICE_CHECK(s.opt.port >= 0 && s.opt.port <= 65535, "--port must be in [0, 65535], got {}", s.opt.port);
    beast::error_code ec;
    tcp::resolver resolver(s.ioc);
    const auto found = resolver.resolve(s.opt.host, std::to_string(s.opt.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    LATTICE_CHECK(!ec && !found.empty(), "--host {}: cannot resolve it ({})", s.opt.host, ec.message());
    const tcp::endpoint ep = found.begin()->endpoint();
    auto check = [&](const char* what) {
        LATTICE_CHECK(!ec, "cannot listen on {}:{}: {} failed ({})", s.opt.host, s.opt.port, what, ec.message());
    };
    s.acceptor.open(ep.protocol(), ec);
    check("socket");
    s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    check("SO_REUSEADDR");
    s.acceptor.bind(ep, ec);
    check("bind");
    s.acceptor.listen(net::socket_base::max_listen_connections, ec);
    check("listen");
    s.port = s.acceptor.local_endpoint().port();
    s.accept();
    for (int i = 0; i < s.opt.threads; ++i)
        s.threads.emplace_back([&s] {
            for (;;) {
                try {
                    s.ioc.run();
                    return;
                } catch (const std::exception& e) {
                    LOG_ERROR("serve: I/O thread: {}", e.what());
                }
            }
        });
}

int HttpServer::port() const {
    return impl_->port;
}

std::string HttpServer::url() const {
    const std::string& h = impl_->opt.host;
    return fmt::format("http://{}:{}", h.find(':') != std::string::npos ? "[" + h + "]" : h, impl_->port);
}

void HttpServer::set_ready(ServedModel model) {
    impl_->model_storage = std::make_unique<ServedModel>(std::move(model));
    impl_->model.store(impl_->model_storage.get());
    impl_->metrics.set_ready(true);
}

void HttpServer::begin_drain() {
    Impl& s = *impl_;
    s.draining = true;
    s.interrupt_renders = true;
}

int64_t HttpServer::active() const {
    return impl_->active;
}

bool HttpServer::wait_idle(Clock::time_point deadline) const {
    while (impl_->active > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return impl_->active == 0;
}

void HttpServer::stop() {
    Impl& s = *impl_;
    if (s.stopped.exchange(true)) return;
    s.interrupt_renders = true;
    s.route_pool.join();  // routes in progress finish (their answers are dropped with the I/O threads)
    s.ioc.stop();
    for (std::thread& t : s.threads) t.join();
    s.threads.clear();
    beast::error_code ec;
    s.acceptor.close(ec);  // no I/O thread runs: new connections are refused from here on
}

}  // namespace lattice::serve
