// Metrics (see metrics.h).
#include "launch/server/metrics.h"

#include <fmt/format.h>

namespace lattice::serve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
    size_t i = 0;
    while (i < bounds_.size() && x > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += x;
    ++count_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    int64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cum += counts_[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
    }
    cum += counts_.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void Metrics::count_response(std::string_view route, int status) {
    std::lock_guard lock(mu_);
    ++responses_[{std::string(route), status}];
}

void Metrics::count_finish(std::string_view reason) {
    std::lock_guard lock(mu_);
    ++finishes_[std::string(reason)];
}

void Metrics::count_disconnect() {
    std::lock_guard lock(mu_);
    ++disconnects_;
}

void Metrics::connection_opened() {
    std::lock_guard lock(mu_);
    ++connections_;
}

void Metrics::connection_closed() {
    std::lock_guard lock(mu_);
    --connections_;
}

void Metrics::observe_ttft(double seconds) {
    std::lock_guard lock(mu_);
    ttft_.observe(seconds);
}

void Metrics::observe_itl(double seconds) {
    std::lock_guard lock(mu_);
    itl_.observe(seconds);
}

void Metrics::observe_queue(double seconds) {
    std::lock_guard lock(mu_);
    queue_.observe(seconds);
}

void Metrics::set_engine(const EngineGauges& g) {
    std::lock_guard lock(mu_);
    engine_ = g;
}

void Metrics::set_ready(bool ready) {
    std::lock_guard lock(mu_);
    ready_ = ready;
}

EngineGauges Metrics::engine() const {
    std::lock_guard lock(mu_);
    return engine_;
}

std::string Metrics::render() const {
    std::lock_guard lock(mu_);
    std::string out;
    auto scalar = [&](std::string_view name, std::string_view type, std::string_view help, int64_t v) {
        out +=
            fmt::format("# HELP lattice_{} {}\n# TYPE lattice_{} {}\nlattice_{} {}\n", name, help, name, type, name, v);
    };
    out +=
        "# HELP lattice_http_requests_total HTTP responses by route and status code.\n"
        "# TYPE lattice_http_requests_total counter\n";
    for (const auto& [key, n] : responses_)
        out += fmt::format("lattice_http_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
    out +=
        "# HELP lattice_requests_finished_total Completion requests finished, by finish reason.\n"
        "# TYPE lattice_requests_finished_total counter\n";
    for (const auto& [reason, n] : finishes_)
        out += fmt::format("lattice_requests_finished_total{{reason=\"{}\"}} {}\n", reason, n);
    scalar("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", engine_.prompt_tokens);
    scalar("generation_tokens_total", "counter", "Generated tokens.", engine_.generated_tokens);
    scalar("prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.",
           engine_.cached_tokens);
    scalar("preemptions_total", "counter", "Sequences preempted (KV blocks ran out; recomputed later).",
           engine_.preemptions);
    scalar("client_disconnects_total", "counter", "Requests cancelled because the client went away or stopped reading.",
           disconnects_);
    scalar("requests_running", "gauge", "Sequences running (holding KV blocks).", engine_.running);
    scalar("requests_waiting", "gauge", "Sequences waiting to be admitted.", engine_.waiting);
    scalar("kv_blocks_used", "gauge", "KV cache blocks in use.", engine_.blocks_used);
    scalar("kv_blocks_total", "gauge", "KV cache blocks in the pool.", engine_.blocks_total);
    scalar("http_connections", "gauge", "Open HTTP connections.", connections_);
    scalar("ready", "gauge", "1 once the model is loaded on every rank.", ready_ ? 1 : 0);
    ttft_.render(out, "lattice_time_to_first_token_seconds", "Time from request arrival to its first token.");
    itl_.render(out, "lattice_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
    queue_.render(out, "lattice_request_queue_seconds",
                  "Time from a request's arrival in the engine to its first scheduling (its priority's queue).");
    return out;
}

}  // namespace lattice::serve
