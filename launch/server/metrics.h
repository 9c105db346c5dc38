// Prometheus metrics of `lattice serve` (GET /metrics, text exposition format 0.0.4).
//
// Written from two sides: the HTTP threads count responses by route and status and the connections;
// the engine thread observes time to first token and inter-token latency and publishes the engine's
// gauges (running / waiting sequences, KV blocks, preemptions, token totals) once per loop turn,
// because the Scheduler itself may only be read on the engine thread. One mutex guards it all: a
// few increments per token is nothing next to a forward pass.
// Names. What vLLM also measures carries vLLM's name with the prefix `lattice:` instead of `vllm:`,
// its type and its `model_name` label, so that a vLLM Grafana dashboard works after one prefix
// substitution (docs/metrics.md has the table): num_requests_running, num_requests_waiting,
// kv_cache_usage_perc (gauges); prompt_tokens_total, generation_tokens_total, num_preemptions_total,
// prefix_cache_queries_total and prefix_cache_hits_total (tokens), request_success_total
// {finished_reason: stop | length | abort} (counters); time_to_first_token_seconds,
// inter_token_latency_seconds, e2e_request_latency_seconds, request_queue_time_seconds (arrival in the
// engine to first scheduling), request_prompt_tokens, request_generation_tokens (histograms, of
// finished requests). What vLLM does not have keeps the prefix lattice_: http_requests_total{route,
// code}, client_disconnects_total, kv_blocks_used, kv_blocks_total, http_connections, ready.
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

// One LoRA adapter's counts (runtime/engine/lora_registry.h LoraInfo).
struct LoraGauge {
    std::string name;
    int64_t requests = 0, tokens = 0, running = 0;
    bool resident = false;
};

struct EngineGauges {
    std::vector<LoraGauge> loras;  // registered adapters, by name
    int64_t max_loras = 0;
    int64_t running = 0, waiting = 0;
    int64_t blocks_used = 0, blocks_total = 0;
    int64_t preemptions = 0, prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0;
    int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding
};

// Cumulative histogram with fixed upper bounds (+Inf implied).
class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double x);
    // `labels`: rendered before `le` in each bucket (e.g. model_name="m"), or empty.
    void render(std::string& out, std::string_view name, std::string_view help, std::string_view labels) const;
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
    // Once the model is loaded (before any request): its served name (every lattice: metric's model_name
    // label, as vLLM's) and its context, which sizes the token-count histograms' buckets (1-2-5 steps
    // up to it, as vLLM's).
    void set_model(std::string_view name, int64_t max_model_len);
    void count_response(std::string_view route, int status);
    void count_finish(std::string_view reason);
    void count_disconnect();
    void connection_opened();
    void connection_closed();
    void observe_ttft(double seconds);
    void observe_itl(double seconds);
    void observe_queue(double seconds);
    // A finished request: its finish reason (stop | length | cancelled: vLLM's "abort"), its time from
    // arrival to the last token, its prompt and generated token counts.
    void observe_finished(std::string_view reason, double e2e_seconds, int64_t prompt_tokens,
                          int64_t generation_tokens);
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
    std::string label_;  // model_name="..."
    void render_loras(std::string& out) const;
    Histogram ttft_, itl_, queue_, e2e_, prompt_len_, gen_len_;
};

}  // namespace lattice::serve
