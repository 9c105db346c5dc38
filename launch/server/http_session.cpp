// One connection of `lattice serve` (http_server.h): a Session on its own strand reads a request,
// routes it (GET on the I/O thread, POST on the route pool), writes the reply or streams the
// engine's deltas, watches for the client going away, and closes. http_server.cpp accepts the
// connections and runs the server's lifecycle; http_server_impl.h is the state both share.
// Layout: reading (header, body, limits), routing, the engine's answers, writing (replies, chunked
// streams), the disconnect watch, timers and closing.
// Session invariants: every member is touched on the session's strand only (the socket's
// executor); at most one write and one read-side operation (the request read, or the disconnect
// watch while a request runs) are outstanding; `ticket_` is set exactly while the engine owes this
// connection deltas; `in_request_` while a completion request's response is unfinished (counted in
// active()). Deltas of an older ticket are dropped by pointer identity.
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <memory>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "launch/server/http_framing.h"
#include "launch/server/http_server_impl.h"
#include "runtime/tokenizer/jinja.h"

namespace lattice::serve {

namespace {

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket s, HttpServer::Impl& srv) : sock_(std::move(s)), srv_(srv), timer_(sock_.get_executor()) {
        ++srv_.connections;
        srv_.metrics.connection_opened();
    }
    ~Session() {
        if (ticket_) srv_.inbox.cancel(std::move(ticket_));
        end_request();
        --srv_.connections;
        srv_.metrics.connection_closed();
    }

    void start() {
        net::dispatch(sock_.get_executor(), [self = shared_from_this()] {
            if (self->srv_.connections > self->srv_.opt.max_connections) {
                self->route_ = "other";
                Reply r = error_reply(503, "too many open connections (--max-connections)");
                r.headers.emplace_back("Retry-After", "1");
                self->send_reply(std::move(r), true);
            } else {
                self->read_request();
            }
        });
    }

private:
    using Self = std::shared_ptr<Session>;

    // ---- reading ----
    void read_request() {
        ++gen_;
        route_ = "other";
        ticket_.reset();
        shaper_.reset();
        head_sr_.reset();
        head_.reset();
        streaming_ = chunked_ = head_sent_ = stream_done_ = last_sent_ = false;
        pending_.clear();
        parser_.emplace();
        parser_->body_limit(uint64_t(srv_.opt.max_body_bytes));
        parser_->header_limit(16 * 1024);
        arm_timer();
        http::async_read_header(sock_, buf_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
    }

    void on_header(beast::error_code ec) {
        if (ec) return on_read(ec);
        auto& req = parser_->get();
        // RFC 9112 6.3 (http_framing.h): a request whose framing could be read two ways: 400, and close.
        std::optional<std::string_view> te;
        if (req.find(http::field::transfer_encoding) != req.end()) {
            const auto v = req[http::field::transfer_encoding];
            te = std::string_view(v.data(), v.size());
        }
        if (auto refusal = framing_refusal(te, req.find(http::field::content_length) != req.end(), parser_->chunked()))
            return send_reply(error_reply(400, *refusal), true);
        if (beast::iequals(req[http::field::expect], "100-continue")) {  // the client waits for our go-ahead
            cont_.emplace(http::status::continue_, req.version());
            http::async_write(sock_, *cont_, [self = shared_from_this()](beast::error_code ec, size_t) {
                self->cont_.reset();
                if (ec) return self->close();
                self->read_body();
            });
            return;
        }
        read_body();
    }

    void read_body() {
        http::async_read(sock_, buf_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        cancel_timer();
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
            ec == net::error::connection_reset || closed_)
            return close();
        if (ec == http::error::body_limit) {
            route_ = label_of_parsed();
            return send_reply(error_reply(413,
                                          fmt::format("the request body is larger than this server takes "
                                                      "(--max-body-bytes {})",
                                                      srv_.opt.max_body_bytes),
                                          "", "request_too_large"),
                              true);
        }
        if (ec == http::error::header_limit)
            return send_reply(error_reply(431, "the request header is too large"), true);
        if (ec.category() == beast::http::make_error_code(http::error::bad_method).category())
            return send_reply(error_reply(400, "malformed HTTP request: " + ec.message()), true);
        if (ec) return close();
        handle();
    }

    std::string label_of_parsed() {
        if (!parser_) return "other";  // the request line is in the message once parsed, even if the header failed
        RouteInput in;
        const auto t = parser_->get().target();
        const std::string target(t.data(), t.size());
        in.target = target;
        in.method = "-";
        return route(in, RouteContext{}).route;
    }

    // A request as route() takes it, owned: it may be routed on the route pool, off this strand.
    struct Request {
        std::string method, target, authorization, body;
        RouteContext ctx;
    };

    // route(), never throwing: a bug or out of memory fails this request, the server goes on.
    static Routed route_safely(const Request& q) {
        try {
            return route(RouteInput{q.method, q.target, q.authorization, q.body}, q.ctx);
        } catch (const std::exception& e) {
            LOG_ERROR("serve: internal error on {}: {}", q.target, e.what());
            Routed r;
            r.route = "other";
            r.reply = error_reply(500, "internal error");
            return r;
        }
    }

    void handle() {
        auto& req = parser_->get();
        version_ = req.version();
        keep_alive_ = req.keep_alive();
        const auto m = req.method_string();
        const auto t = req.target();
        const auto a = req[http::field::authorization];
        auto q = std::make_shared<Request>(Request{std::string(m.data(), m.size()), std::string(t.data(), t.size()),
                                                   std::string(a.data(), a.size()), std::move(req.body()), {}});
        parser_.reset();
        q->ctx.api_key = srv_.opt.api_key;
        q->ctx.model = srv_.model.load();
        q->ctx.draining = srv_.draining;
        q->ctx.metrics = &srv_.metrics;
        q->ctx.request_number = ++srv_.requests;
        // GET routes (health, metrics, the model card) answer at once. A POST may render a chat template,
        // tokenize a long prompt or compile a grammar: it is routed on the route pool, so that the I/O
        // threads go on serving every other connection meanwhile (GET /health included); counted as
        // active so that a drain waits for it, and its template render is interrupted when the server
        // drains (it would only be refused).
        if (q->method != "POST") return routed(route_safely(*q));
        ++srv_.active;
        net::post(srv_.route_pool, [self = shared_from_this(), q] {
            if (self->srv_.opt.route_hook) self->srv_.opt.route_hook();
            Routed r;
            {
                const jinja::RenderInterrupt interrupt(&self->srv_.interrupt_renders);
                r = route_safely(*q);
            }
            if (self->srv_.draining) refuse_when_draining(r);
            net::post(self->sock_.get_executor(), [self, q, r = std::move(r)]() mutable {
                --self->srv_.active;
                if (self->closed_) return;
                self->routed(std::move(r));
            });
        });
    }

    // A request routed while the drain began: it is not in flight (the engine would refuse it), and a
    // render interrupted by the drain failed it with a 400; either is a 503 (the message kept).
    static void refuse_when_draining(Routed& r) {
        if (r.call) {
            r.call.reset();
            r.reply = error_reply(503, "the server is shutting down and takes no new requests");
        } else if (r.reply && r.reply->status == 400) {
            const auto j = nlohmann::json::parse(r.reply->body, nullptr, false);
            const bool named = j.is_object() && j.contains("error") && j["error"].is_object() &&
                               j["error"].contains("message") && j["error"]["message"].is_string();
            r.reply = error_reply(503, named ? j["error"]["message"].get<std::string>() : "the server is shutting down");
        } else {
            return;
        }
        r.reply->headers.emplace_back("Retry-After", "5");
    }

    void routed(Routed r) {
        route_ = r.route;
        if (r.reply) return send_reply(std::move(*r.reply), !keep_alive_);
        in_request_ = true;
        ++srv_.active;
        shaper_.emplace(*r.call);
        streaming_ = shaper_->streaming();
        ticket_ = std::make_shared<Ticket>();
        ticket_->request = std::move(r.call->request);
        std::weak_ptr<Session> weak = shared_from_this();
        const Ticket* id = ticket_.get();
        ticket_->deliver = [weak, id](openai::Delta&& d) {
            if (Self s = weak.lock())
                net::post(s->sock_.get_executor(),
                          [s, id, d = std::move(d)]() mutable { s->on_delta(id, std::move(d)); });
        };
        srv_.inbox.submit(ticket_);
        watch_disconnect();
    }

    // ---- the engine's answers ----
    void on_delta(const Ticket* id, openai::Delta&& d) {
        if (closed_ || !ticket_ || ticket_.get() != id) return;
        switch (d.kind) {
            case openai::Delta::Kind::kError:
                ticket_.reset();
                if (!head_sent_) {
                    Reply r = error_reply(d.status, d.message, d.error_param, d.error_code);
                    // A 503 from the engine (queue full, shutting down): when to ask again, as the
                    // loading 503 says.
                    if (d.status == 503) r.headers.emplace_back("Retry-After", "1");
                    return send_reply(std::move(r), !keep_alive_);
                }
                pending_ += shaper_->stream_error(d.status, d.message);
                keep_alive_ = false;
                stream_done_ = true;
                return pump();
            case openai::Delta::Kind::kAccepted:
                if (!streaming_) return;
                start_stream();
                return append(shaper_->accepted());
            case openai::Delta::Kind::kTokens:
                return append(shaper_->tokens(d));
            case openai::Delta::Kind::kFinish: {
                if (closed_) return;
                ticket_.reset();
                std::string last = shaper_->finish(d);
                if (!streaming_) {
                    Reply rep;
                    rep.body = std::move(last);
                    return send_reply(std::move(rep), !keep_alive_);
                }
                pending_ += last;
                stream_done_ = true;
                return pump();
            }
        }
    }

    void append(std::string s) {
        if (s.empty() || closed_) return;
        pending_ += s;
        if (int64_t(pending_.size() + inflight_.size()) > srv_.opt.stream_buffer_bytes)
            return abort("the client does not read its stream (--stream-buffer-bytes)");
        pump();
    }

    // ---- writing ----
    void start_stream() {
        head_.emplace(http::status::ok, version_);
        head_->set(http::field::server, "lattice");
        head_->set(http::field::content_type, "text/event-stream");
        head_->set(http::field::cache_control, "no-cache");
        chunked_ = version_ >= 11;
        if (chunked_) head_->chunked(true);
        if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the stream is the end of the connection
        head_->keep_alive(keep_alive_ && !srv_.draining);
        head_sr_.emplace(*head_);
        head_sent_ = true;
        srv_.metrics.count_response(route_, 200);
        writing_ = true;
        arm_timer();
        http::async_write_header(sock_, *head_sr_,
                                 [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
    }

    void pump() {
        if (writing_ || closed_ || !head_sent_) return;
        if (!pending_.empty()) {
            inflight_ = std::move(pending_);
            pending_.clear();
            writing_ = true;
            arm_timer();
            auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); };
            if (chunked_)
                net::async_write(sock_, http::make_chunk(net::buffer(inflight_)), std::move(done));
            else
                net::async_write(sock_, net::buffer(inflight_), std::move(done));
            return;
        }
        if (stream_done_ && !last_sent_) {
            last_sent_ = true;
            if (!chunked_) return stream_finished();
            writing_ = true;
            arm_timer();
            net::async_write(sock_, http::make_chunk_last(),
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
        }
    }

    void on_written(beast::error_code ec) {
        cancel_timer();
        writing_ = false;
        inflight_.clear();
        if (ec) return abort("writing to the client failed");
        if (last_sent_) return stream_finished();
        pump();
    }

    void stream_finished() {
        end_request();
        if (!keep_alive_ || srv_.draining) return linger_close();
        next_request();
    }

    void send_reply(Reply r, bool close_after) {
        close_after = close_after || srv_.draining;
        srv_.metrics.count_response(route_, r.status);
        res_.emplace(http::int_to_status(unsigned(r.status)), version_);
        res_->result(unsigned(r.status));
        res_->set(http::field::server, "lattice");
        res_->set(http::field::content_type, r.content_type);
        for (auto& [k, v] : r.headers) res_->set(k, v);
        res_->body() = std::move(r.body);
        res_->keep_alive(!close_after);
        res_->prepare_payload();
        writing_ = true;
        arm_timer();
        http::async_write(sock_, *res_, [self = shared_from_this(), close_after](beast::error_code ec, size_t) {
            self->cancel_timer();
            self->writing_ = false;
            self->res_.reset();
            self->end_request();
            if (ec) return self->close();
            if (close_after) return self->linger_close();
            self->next_request();
        });
    }

    void next_request() {
        if (watching_) {  // nothing else is outstanding here: this cancels only the disconnect watch
            beast::error_code ec;
            sock_.cancel(ec);
            watching_ = false;
        }
        read_request();
    }

    // ---- the client going away ----
    void watch_disconnect() {
        watching_ = true;
        sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), g = gen_](beast::error_code ec) {
            if (ec || g != self->gen_ || !self->watching_ || self->closed_) return;
            self->watching_ = false;
            if (!self->in_request_) return;
            char c;
            const ssize_t n = ::recv(self->sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return self->abort("the client closed the connection");
            if (n < 0) return self->watch_disconnect();
            // n > 0: the client pipelined its next request; write errors will tell if it leaves.
        });
    }

    void abort(const char* why) {
        if (ticket_) {
            LOG_DEBUG("serve: cancelling a request: {}", why);
            srv_.inbox.cancel(std::move(ticket_));
            ticket_.reset();
            srv_.metrics.count_disconnect();
        }
        close();
    }

    void end_request() {
        if (!in_request_) return;
        in_request_ = false;
        --srv_.active;
    }

    // ---- timers and closing ----
    void arm_timer() {
        const uint64_t g = ++timer_gen_;
        timer_.expires_after(std::chrono::milliseconds(int64_t(srv_.opt.client_timeout_s * 1000)));
        timer_.async_wait([self = shared_from_this(), g](beast::error_code ec) {
            if (!ec && g == self->timer_gen_) self->abort("client timeout");
        });
    }
    void cancel_timer() {
        ++timer_gen_;
        timer_.cancel();
    }

    // After a response that ends the connection: stop sending, then read and drop what the client
    // still sends (a bounded amount, for a bounded time) so that closing does not reset the
    // connection before the client has read our answer.
    void linger_close() {
        if (closed_) return;
        beast::error_code ec;
        sock_.shutdown(tcp::socket::shutdown_send, ec);
        if (ec) return close();
        const uint64_t g = ++timer_gen_;
        timer_.expires_after(std::chrono::seconds(2));
        timer_.async_wait([self = shared_from_this(), g](beast::error_code ec) {
            if (!ec && g == self->timer_gen_) self->close();
        });
        drain_socket();
    }
    void drain_socket() {
        sock_.async_read_some(net::buffer(sink_), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->drained_ += n;
            if (ec || self->drained_ > (4u << 20)) return self->close();
            self->drain_socket();
        });
    }

    void close() {
        if (closed_) return;
        closed_ = true;
        if (ticket_) {
            srv_.inbox.cancel(std::move(ticket_));
            ticket_.reset();
        }
        cancel_timer();
        beast::error_code ec;
        sock_.shutdown(tcp::socket::shutdown_both, ec);
        sock_.close(ec);
        end_request();
    }

    tcp::socket sock_;
    HttpServer::Impl& srv_;
    net::steady_timer timer_;
    beast::flat_buffer buf_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::response<http::empty_body>> cont_;
    std::optional<http::response<http::string_body>> res_;
    std::optional<http::response<http::empty_body>> head_;
    std::optional<http::response_serializer<http::empty_body>> head_sr_;
    std::shared_ptr<Ticket> ticket_;
    std::optional<openai::ResponseShaper> shaper_;
    std::string route_ = "other", pending_, inflight_;
    std::array<char, 4096> sink_{};
    size_t drained_ = 0;
    unsigned version_ = 11;
    uint64_t gen_ = 0, timer_gen_ = 0;
    bool keep_alive_ = true, in_request_ = false, streaming_ = false, chunked_ = false, head_sent_ = false;
    bool stream_done_ = false, last_sent_ = false, writing_ = false, watching_ = false, closed_ = false;
};

}  // namespace

void start_session(tcp::socket s, HttpServer::Impl& srv) {
    std::make_shared<Session>(std::move(s), srv)->start();
}

}  // namespace lattice::serve
