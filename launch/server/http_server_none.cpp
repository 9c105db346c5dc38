// HttpServer for a build without Boost (configure found no Boost.Asio/Beast headers, as on the bare
// GPU machine of benchmarks/gpu/check.sh): `lattice serve` fails at once with an error that says
// why; every other command is unaffected. The real server is http_server.cpp.
#include "base/error.h"
#include "launch/server/http_server.h"

namespace lattice::serve {

struct HttpServer::Impl {};

namespace {
[[noreturn]] void no_boost() {
    LATTICE_FAIL(
        "lattice serve is not in this build: configure found no Boost (Boost.Asio/Beast headers; "
        "apt install libboost-dev, then reconfigure)");
}
}  // namespace

HttpServer::HttpServer(ServerOptions, Inbox&, Metrics&) {
    no_boost();
}
HttpServer::~HttpServer() = default;
void HttpServer::start() {
    no_boost();
}
int HttpServer::port() const {
    no_boost();
}
std::string HttpServer::url() const {
    no_boost();
}
void HttpServer::set_ready(ServedModel) {
    no_boost();
}
void HttpServer::begin_drain() {
    no_boost();
}
int64_t HttpServer::active() const {
    no_boost();
}
bool HttpServer::wait_idle(Clock::time_point) const {
    no_boost();
}
void HttpServer::stop() {}

}  // namespace lattice::serve
