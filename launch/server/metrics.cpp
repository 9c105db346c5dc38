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

void Histogram::render(std::string& out, std::string_view name, std::string_view help, std::string_view labels) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    const std::string sep = labels.empty() ? "" : ",";
    const std::string own = labels.empty() ? "" : fmt::format("{{{}}}", labels);
    int64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cum += counts_[i];
        out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds_[i], cum);
    }
    cum += counts_.back();
    out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n{}_sum{} {}\n{}_count{} {}\n", name, labels, sep, cum, name,
                       own, sum_, name, own, count_);
}

namespace {

// 1, 2, 5, 10, 20, 50, ... up to the first bound >= top (vLLM's buckets of token counts).
std::vector<double> one_two_five(int64_t top) {
    std::vector<double> b;
    for (double scale = 1;; scale *= 10)
        for (double m : {1.0, 2.0, 5.0}) {
            b.push_back(m * scale);
            if (m * scale >= double(top)) return b;
        }
}

// A label value as Prometheus's text format quotes it.
std::string quoted(std::string_view v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

}  // namespace

Metrics::Metrics()
    : label_("model_name=\"\""),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      queue_({0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}),
      e2e_({0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}),
      prompt_len_(one_two_five(4096)),
      gen_len_(one_two_five(4096)) {}

void Metrics::set_model(std::string_view name, int64_t max_model_len) {
    std::lock_guard lock(mu_);
    label_ = fmt::format("model_name=\"{}\"", quoted(name));
    prompt_len_ = Histogram(one_two_five(max_model_len));
    gen_len_ = Histogram(one_two_five(max_model_len));
}

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

void Metrics::observe_finished(std::string_view reason, double e2e_seconds, int64_t prompt_tokens,
                               int64_t generation_tokens) {
    std::lock_guard lock(mu_);
    ++finishes_[std::string(reason)];
    e2e_.observe(e2e_seconds);
    prompt_len_.observe(double(prompt_tokens));
    gen_len_.observe(double(generation_tokens));
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

// Per LoRA adapter (lattice's own names: vLLM exports only an info gauge): requests, tokens (prompt and
// generated, counted when a request ends), running requests, residency; and the slots in use.
void Metrics::render_loras(std::string& out) const {
    if (engine_.loras.empty() && engine_.max_loras == 0) return;
    int64_t resident = 0;
    const char* kinds[][3] = {{"lora_requests_total", "counter", "Requests admitted with the LoRA adapter."},
                              {"lora_tokens_total", "counter", "Prompt and generated tokens of its ended requests."},
                              {"lora_requests_running", "gauge", "Requests holding the adapter now."}};
    for (int k = 0; k < 3; ++k) {
        out += fmt::format("# HELP lattice:{} {}\n# TYPE lattice:{} {}\n", kinds[k][0], kinds[k][2], kinds[k][0],
                           kinds[k][1]);
        for (const LoraGauge& g : engine_.loras) {
            const int64_t v = k == 0 ? g.requests : k == 1 ? g.tokens : g.running;
            out += fmt::format("lattice:{}{{{},lora_name=\"{}\"}} {}\n", kinds[k][0], label_, g.name, v);
        }
    }
    for (const LoraGauge& g : engine_.loras) resident += g.resident;
    out += fmt::format("# HELP lattice:lora_resident Adapters resident in the model's slots (of max_loras).\n"
                       "# TYPE lattice:lora_resident gauge\nlattice:lora_resident{{{},max_loras=\"{}\"}} {}\n",
                       label_, engine_.max_loras, resident);
}

std::string Metrics::render() const {
    std::lock_guard lock(mu_);
    std::string out;
    auto own = [&](std::string_view name, std::string_view type, std::string_view help, auto v) {
        out += fmt::format("# HELP lattice_{} {}\n# TYPE lattice_{} {}\nlattice_{} {}\n", name, help, name, type, name, v);
    };
    auto vllm = [&](std::string_view name, std::string_view type, std::string_view help, auto v) {
        out += fmt::format("# HELP lattice:{} {}\n# TYPE lattice:{} {}\nlattice:{}{{{}}} {}\n", name, help, name, type, name,
                           label_, v);
    };
    out +=
        "# HELP lattice_http_requests_total HTTP responses by route and status code.\n"
        "# TYPE lattice_http_requests_total counter\n";
    for (const auto& [key, n] : responses_)
        out += fmt::format("lattice_http_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
    out +=
        "# HELP lattice:request_success_total Requests finished, by finish reason (abort: cancelled).\n"
        "# TYPE lattice:request_success_total counter\n";
    for (const auto& [reason, n] : finishes_)
        out += fmt::format("lattice:request_success_total{{{},finished_reason=\"{}\"}} {}\n", label_,
                           reason == "cancelled" ? "abort" : reason, n);
    vllm("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", engine_.prompt_tokens);
    vllm("generation_tokens_total", "counter", "Generated tokens.", engine_.generated_tokens);
    vllm("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", engine_.prompt_tokens);
    vllm("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", engine_.cached_tokens);
    vllm("spec_decode_num_draft_tokens_total", "counter", "Speculative drafts fed (--speculative).",
         engine_.drafted_tokens);
    vllm("spec_decode_num_accepted_tokens_total", "counter", "Speculative drafts accepted.", engine_.accepted_tokens);
    vllm("num_preemptions_total", "counter", "Sequences preempted (KV blocks ran out; recomputed later).",
         engine_.preemptions);
    vllm("num_requests_running", "gauge", "Sequences running (holding KV blocks).", engine_.running);
    vllm("num_requests_waiting", "gauge", "Sequences waiting to be admitted.", engine_.waiting);
    vllm("kv_cache_usage_perc", "gauge", "Fraction of the KV cache blocks in use (0-1).",
         engine_.blocks_total > 0 ? double(engine_.blocks_used) / double(engine_.blocks_total) : 0.0);
    render_loras(out);
    own("client_disconnects_total", "counter", "Requests cancelled because the client went away or stopped reading.",
        disconnects_);
    own("kv_blocks_used", "gauge", "KV cache blocks in use.", engine_.blocks_used);
    own("kv_blocks_total", "gauge", "KV cache blocks in the pool.", engine_.blocks_total);
    own("http_connections", "gauge", "Open HTTP connections.", connections_);
    own("ready", "gauge", "1 once the model is loaded on every rank.", ready_ ? 1 : 0);
    ttft_.render(out, "lattice:time_to_first_token_seconds", "Time from request arrival to its first token.", label_);
    itl_.render(out, "lattice:inter_token_latency_seconds", "Time between consecutive tokens of a request.", label_);
    queue_.render(out, "lattice:request_queue_time_seconds",
                  "Time from a request's arrival in the engine to its first scheduling (its priority's queue).", label_);
    e2e_.render(out, "lattice:e2e_request_latency_seconds", "Time from a request's arrival to its last token.", label_);
    prompt_len_.render(out, "lattice:request_prompt_tokens", "Prompt tokens of finished requests.", label_);
    gen_len_.render(out, "lattice:request_generation_tokens", "Generated tokens of finished requests.", label_);
    return out;
}

}  // namespace lattice::serve
