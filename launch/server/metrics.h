// Prometheus metrics of `lattice serve` (GET /metrics, text exposition format 0.0.4).
//
// Written from two sides: the HTTP threads count responses by route and status and the connections;
// the engine thread observes time to first token and inter-token latency and publishes the engine's
// gauges (running / waiting sequences, KV blocks, preemptions, token totals) once per loop turn,
// because the Scheduler itself may only be read on the engine thread. One mutex guards it all: a
// few increments per token is nothing next to a forward pass.
// Names (all prefixed lattice_): http_requests_total{route,code}, requests_finished_total{reason},
// prompt_tokens_total, generation_tokens_total, prefix_cache_hit_tokens_total, preemptions_total,
// client_disconnects_total, requests_running, requests_waiting, kv_blocks_used, kv_blocks_total,
// http_connections, ready, time_to_first_token_seconds, inter_token_latency_seconds and
// request_queue_seconds (histograms; the queue: arrival in the engine to its first scheduling).
// Route labels come from a fixed set (unknown paths are "other"), so label cardinality is bounded.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lattice::serve {

struct EngineGauges {
    int64_t running = 0, waiting = 0;
    int64_t blocks_used = 0, blocks_total = 0;
    int64_t preemptions = 0, prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0;
};

// Cumulative histogram with fixed upper bounds (+Inf implied).
class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double x);
    void render(std::string& out, std::string_view name, std::string_view help) const;
    int64_t count() const { return count_; }

private:
    std::vector<double> bounds_;
    std::vector<int64_t> counts_;  // per bucket (not cumulative); last: above every bound
    double sum_ = 0;
    int64_t count_ = 0;
};

class Metrics {
public:
    Metrics();
    void count_response(std::string_view route, int status);
    void count_finish(std::string_view reason);
    void count_disconnect();
    void connection_opened();
    void connection_closed();
    void observe_ttft(double seconds);
    void observe_itl(double seconds);
    void observe_queue(double seconds);
    void set_engine(const EngineGauges& g);
    void set_ready(bool ready);
    std::string render() const;
    EngineGauges engine() const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> responses_;
    std::map<std::string, int64_t> finishes_;
    int64_t disconnects_ = 0, connections_ = 0;
    bool ready_ = false;
    EngineGauges engine_;
    Histogram ttft_, itl_, queue_;
};

}  // namespace lattice::serve
