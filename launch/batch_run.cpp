// The engine side of `lattice batch`: the output file, the progress line and the run that feeds the
// input's lines to the engine client (batch_run.h says what each is; launch/cmd_batch.cpp is the
// command and describes the input and output formats). Layout: file-local helpers (line limits, a
// bounded line reader, a line in flight), then BatchResultFile, BatchProgress, BatchRun::Impl (admit,
// submit, score, apply events, write records) and BatchRun's forwarding members.
// Limits per line, as the server's per body: at most kMaxLineBytes (8 MiB, serve's --max-body-bytes
// default) and JSON nesting 64 (base/json_limits.h), else an error record for that line.
#include "launch/batch_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "base/error.h"
#include "base/json_limits.h"
#include "launch/batch_input.h"
#include "launch/drain_signal.h"
#include "launch/openai/call.h"
#include "launch/openai/request.h"
#include "launch/openai/response.h"
#include "runtime/engine/client.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int64_t kMaxLineBytes = int64_t(8) << 20;
constexpr size_t kKeepBytes = size_t(kMaxLineBytes) + 1;  // what is read of a line: one byte past the limit

bool blank(const std::string& l) {
    return l.find_first_not_of(" \t\r") == std::string::npos;
}

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Reads one line (without its '\n') keeping at most `keep` bytes of it; `length` is the whole line's.
// False at the end of the input with nothing read. A line of 60 MB costs `keep` bytes, not 60 MB (and
// not the doubling growth of a std::getline string).
bool read_line_bounded(std::istream& in, std::string& line, size_t keep, int64_t& length) {
    line.clear();
    length = 0;
    char buf[1 << 16];
    bool any = false;
    for (;;) {
        in.getline(buf, sizeof(buf));
        const std::streamsize n = in.gcount();  // extracted, the '\n' included when found
        any |= n > 0;
        const bool full = in.fail() && !in.eof() && n == std::streamsize(sizeof(buf) - 1);
        const size_t stored = size_t(n) - (full || in.eof() ? 0 : 1);
        length += int64_t(stored);
        if (line.size() < keep) line.append(buf, std::min(stored, keep - line.size()));
        if (full) {  // no '\n' within the buffer: the line goes on
            in.clear();
            continue;
        }
        if (in.eof()) in.clear(std::ios::eofbit);  // a last line without '\n'
        return any;
    }
}

}  // namespace

BatchResultFile::BatchResultFile(const std::string& path, int64_t sync_lines, double sync_seconds, bool restart)
    : restart_(restart), file_(path, "--output", [this](std::string_view l, int64_t no) { read_line(l, no); }) {
    if (restart_ && discarded_ > 0) file_.truncate();
    if (!bad_lines_.empty()) {
        std::string more;
        if (bad_lines_.size() > 1)
            more = fmt::format(" (nor {} {})", bad_lines_.size() > 2 ? "are lines" : "is line",
                               fmt::join(bad_lines_.begin() + 1, bad_lines_.end(), ", "));
        LATTICE_FAIL(
            "--output {}: line {} is not a batch record{}: the file was edited or damaged (a crash "
            "only tears the last line, which a rerun cuts); delete or repair the line and rerun (the "
            "request of a deleted line runs again)",
            path, bad_lines_[0], more);
    }
    file_.set_sync(sync_lines, sync_seconds);
}

void BatchResultFile::write(const json& line) {
    // Invalid UTF-8 in generated text (bytes no character completes) becomes U+FFFD, not an error.
    file_.append(line.dump(-1, ' ', false, json::error_handler_t::replace));
    done_.insert(line["custom_id"].dump());
}

void BatchResultFile::read_line(std::string_view l, int64_t no) {
    if (restart_) {
        ++discarded_;
        return;
    }
    const json j = json::parse(l, nullptr, false);
    if (j.is_object() && j.contains("custom_id"))
        done_.insert(j["custom_id"].dump());
    else if (bad_lines_.size() < 10)
        bad_lines_.push_back(no);
}

BatchProgress::BatchProgress(const std::string& mode, int64_t total) : total_(total) {
    tty_ = mode == "bar" || (mode == "auto" && ::isatty(2));
    off_ = mode == "none";
}

void BatchProgress::update(int64_t done, int64_t errors, int64_t tokens, bool force) {
    if (off_) return;
    const double t = since(start_);
    if (!force && t - last_ < (tty_ ? 0.2 : 5.0)) return;
    last_ = t;
    const double rate = t > 0 ? double(tokens) / t : 0, per = done > 0 ? t / double(done) : 0;
    const int64_t left = std::max<int64_t>(total_ - done, 0);
    const std::string eta =
        done > 0 ? fmt::format("{}:{:02}", int64_t(per * double(left)) / 60, int64_t(per * double(left)) % 60) : "?";
    if (tty_) {
        const int width = 30, fill = total_ > 0 ? int(width * std::min<int64_t>(done, total_) / total_) : 0;
        fmt::print(stderr, "\r[{}{}] {}/{} done, {} errors, {:.1f} tok/s, ETA {}  ", std::string(size_t(fill), '#'),
                   std::string(size_t(width - fill), '.'), done, total_, errors, rate, eta);
    } else {
        fmt::print(stderr, "batch: {}/{} done, {} errors, {:.1f} tok/s, ETA {}\n", done, total_, errors, rate, eta);
    }
    std::fflush(stderr);
}

void BatchProgress::end() {
    if (tty_ && !off_) fmt::print(stderr, "\n");
}

// BatchRun's state and steps (batch_run.h).
class BatchRun::Impl {
    // One input line in flight: its engine sequences (choice_requests order: prompt * best_of + i) feed
    // one response body; the record is written when the last of them finishes.
    struct Running {
        json custom_id;
        std::string hex;                                 // of the record's "batch_req_" and "req_" ids
        std::unique_ptr<openai::ResponseShaper> shaper;  // the server's response body
        openai::ApiRequest request;                      // the parsed body (its prompts until it runs)
        bool logprobs = false;                           // its tokens' alternatives are asked for
        int64_t tokens = 0;
        int64_t prompt_tokens = 0;  // every prompt once (usage)
        bool abandoned = false;     // a sequence was cut by the drain: the line runs again on the next rerun
        Clock::time_point admitted;
        double ttft = -1;
    };

public:
    Impl(EngineClient& client, const std::string& input, BatchResultFile& out, int64_t vocab, std::string model)
        : client_(client),
          in_(input),
          out_(out),
          model_{std::move(model), client.tokenizer(), {vocab}, client.context(), {}} {
        LATTICE_CHECK(in_.good(), "--input {}: cannot open", input);
        model_.is_adapter = [this](const std::string& name) {
            return client_.is_leader() && client_.loras().has(name);
        };
        int64_t length = 0;
        for (std::string l; read_line_bounded(in_, l, kKeepBytes, length);) t_.total += !blank(l);
        in_.clear();
        in_.seekg(0);
        t_.already = t_.done = int64_t(out.done().size());
    }
    const BatchTotals& totals() const { return t_; }

    void run(double drain_seconds, BatchProgress& progress) {
        for (;;) {
            if (drain_requested() && !client_.draining()) {
                fmt::print(stderr, "\nbatch: signal {}: no new requests; finishing {} in flight (up to {:.0f} s)\n",
                           drain_requested(), running_.size(), drain_seconds);
                client_.drain(drain_seconds);
            }
            admit();
            while (!scoring_.empty() && !client_.busy() && !client_.draining()) score_next();
            if (!client_.busy() && !(input_left_ && !client_.draining())) break;
            for (const ClientEvent& ev : client_.poll()) apply(ev);
            out_.sync_if_due();
            progress.update(t_.done, t_.errors, t_.gen_tokens);
        }
    }

private:
    // A fresh hex for a record's ids: a per-run random nonce and a counter (unique across reruns).
    std::string next_hex() { return fmt::format("{:016x}{:08x}", nonce_, ++records_); }

    void record_error(const json& id, const char* code, const std::string& msg) {
        out_.write(json{{"id", "batch_req_" + next_hex()},
                        {"custom_id", id},
                        {"response", nullptr},
                        {"error", {{"code", code}, {"message", msg}}}});
        ++t_.errors;
        ++t_.done;
    }

    // The server's limits on a request body, per line: a line of 60 MB or of 20 MB of "[" would cost
    // gigabytes in the parser before any check. "" when within them.
    std::string over_limits(const std::string& line) const {
        if (line_bytes_ > kMaxLineBytes)
            return fmt::format("line {}: {} bytes, more than the {} a request may have", line_no_, line_bytes_,
                               kMaxLineBytes);
        try {
            check_json_limits(line, fmt::format("line {}", line_no_), JsonLimits{});
        } catch (const Error& e) {
            return e.message();
        }
        return {};
    }

    // The endpoint of a Batch-format line: true for chat. Error naming a bad "method" or "url".
    bool chat_endpoint(const json& j, const json& body) const {
        if (j.contains("method"))
            LATTICE_CHECK(j["method"] == "POST", "line {}: \"method\" {}: a batch request must be \"POST\"", line_no_,
                          j["method"].dump());
        if (!j.contains("url")) return body.is_object() && body.contains("messages");
        LATTICE_CHECK(j["url"] == "/v1/completions" || j["url"] == "/v1/chat/completions",
                      "line {}: \"url\" {}: lattice batch runs \"/v1/completions\" and \"/v1/chat/completions\"",
                      line_no_, j["url"].dump());
        return j["url"] == "/v1/chat/completions";
    }

    // One non-blank input line: an error record, a skip (done earlier, a duplicate id) or a submission.
    void admit_line(const std::string& line) {
        json id = batch_line_id(line, line_no_);
        if (const std::string why = over_limits(line); !why.empty()) {
            if (!out_.done().count(id.dump())) record_error(id, "request_too_large", why);
            return;
        }
        const json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            if (!out_.done().count(id.dump()))
                record_error(id, "invalid_json", fmt::format("line {}: not a JSON object", line_no_));
            return;
        }
        const bool wrapped = j.contains("body");
        if (!seen_.insert(id.dump()).second) {  // the id's record belongs to its first line
            fmt::print(stderr, "batch: line {}: custom_id {} already used by an earlier line; skipped\n", line_no_,
                       id.dump());
            ++t_.duplicates;
            return;
        }
        if (out_.done().count(id.dump())) return;  // finished by an earlier run
        if (!(id.is_string() || id.is_number_integer())) {
            record_error(id, "invalid_custom_id",
                         fmt::format("line {}: \"custom_id\" must be a string or an integer", line_no_));
            return;
        }
        if (!wrapped && j.contains("custom_id")) {
            record_error(id, "invalid_request",
                         fmt::format("line {}: a line with \"custom_id\" needs its request in \"body\"", line_no_));
            return;
        }
        const json& body = wrapped ? j["body"] : j;
        bool chat = false;
        try {
            chat = wrapped ? chat_endpoint(j, body) : body.contains("messages");
        } catch (const Error& e) {
            record_error(id, e.message().find("\"method\"") != std::string::npos ? "invalid_method" : "invalid_url",
                         e.message());
            return;
        }
        try {
            submit(id, body, chat);
        } catch (const Error& e) {
            record_error(id, "invalid_request", fmt::format("line {}: {}", line_no_, e.message()));
        }
    }

    // A request as the server would take it (launch/openai/call.h: serve's validation, its 400 / 404
    // answers written as the record's response), to the engine; one whose prompts are scored (echo,
    // prompt_logprobs) waits until the engine is idle, as in serve.
    void submit(const json& id, const json& body, bool chat) {
        Running r;
        r.custom_id = id;
        r.hex = next_hex();
        openai::Prepared p = openai::prepare_call(
            body, chat, model_, fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", r.hex), int64_t(std::time(nullptr)));
        if (p.refusal) return record_refusal(r, *p.refusal);
        openai::ApiCall& call = *p.call;
        call.request.stream = false;  // a line's response is one body
        call.request.include_usage = false;
        r.shaper = std::make_unique<openai::ResponseShaper>(call);
        r.logprobs = call.request.logprobs >= 0;
        for (const std::vector<int32_t>& q : call.request.prompts) r.prompt_tokens += int64_t(q.size());
        r.request = std::move(call.request);
        if (openai::scores_prompt(r.request) || (r.request.echo && r.request.client.max_tokens == 0)) {
            scoring_.push_back(std::move(r));
            return;
        }
        start(std::move(r));
    }

    void start(Running r) {
        r.admitted = Clock::now();
        int64_t request = 0;
        try {
            std::vector<ClientRequest> choices = openai::choice_requests(r.request);
            if (!r.request.model.empty() && client_.is_leader() && client_.loras().has(r.request.model))
                for (ClientRequest& c : choices) c.lora = r.request.model;  // a line picks an adapter by "model"
            request = client_.submit(std::move(choices), r.request.best_of);
        } catch (const Error& e) {  // what the engine refuses, serve answers 400
            return record_refusal(r, openai::Refusal{400, e.message(), openai::error_param(e.message()), ""});
        }
        if (t_.first_admit == Clock::time_point{}) t_.first_admit = r.admitted;
        t_.prompt_tokens += r.prompt_tokens;
        r.request.prompts.clear();
        running_.emplace(request, std::move(r));
    }

    // The next scored line (the engine is idle): its prompts' deltas, then its record (max_tokens 0) or its run.
    void score_next() {
        Running r = std::move(scoring_.front());
        scoring_.pop_front();
        const openai::ApiRequest& q = r.request;
        const Tokenizer* tok = client_.tokenizer();
        for (size_t i = 0; i < q.prompts.size(); ++i) {
            PromptLogprobs lp = client_.prompt_logprobs(q.prompts[i], std::max(q.logprobs, q.prompt_logprobs),
                                                        model_.is_adapter(q.model) ? q.model : "");
            openai::Delta d;
            d.echo = true;
            d.text = tok ? tok->decode(q.prompts[i]) : "";
            d.tokens = q.prompts[i];
            if (q.client.max_tokens == 0) d.finish_reason = "length";
            d.logprobs = std::move(lp.logprobs);
            d.top = std::move(lp.top);
            d.ranks = std::move(lp.ranks);
            for (int64_t k = 0; k < q.best_of; ++k) {
                d.index = int64_t(i) * q.best_of + k;
                r.shaper->tokens(d);
            }
        }
        if (q.client.max_tokens != 0) return start(std::move(r));
        openai::Delta f;
        f.kind = openai::Delta::Kind::kFinish;
        f.prompt_tokens = r.prompt_tokens;
        t_.prompt_tokens += r.prompt_tokens;
        write_result(r, r.shaper->finish(f));
    }

    void write_result(const Running& r, const std::string& body) {
        const json response = {{"status_code", 200}, {"request_id", "req_" + r.hex}, {"body", json::parse(body)}};
        out_.write(
            json{{"id", "batch_req_" + r.hex}, {"custom_id", r.custom_id}, {"response", response}, {"error", nullptr}});
        t_.last_done = Clock::now();
        ++t_.done;
    }

    // What serve answers 400 / 404: the record's response carries that status and serve's error body
    // (OpenAI's Batch output for a request the API refused).
    void record_refusal(const Running& r, const openai::Refusal& why) {
        const json response = {
            {"status_code", why.status}, {"request_id", "req_" + r.hex}, {"body", json::parse(why.body())}};
        out_.write(
            json{{"id", "batch_req_" + r.hex}, {"custom_id", r.custom_id}, {"response", response}, {"error", nullptr}});
        ++t_.errors;
        ++t_.done;
    }

    // Admits input lines while the engine has little waiting.
    void admit() {
        constexpr int64_t kWantWaiting = 16;
        std::string line;
        while (input_left_ && !client_.draining() && client_.scheduler().waiting() < kWantWaiting) {
            if (!read_line_bounded(in_, line, kKeepBytes, line_bytes_)) {
                input_left_ = false;
                break;
            }
            ++line_no_;
            if (!blank(line)) admit_line(line);
        }
    }

    void apply(const ClientEvent& ev) {
        auto it = running_.find(ev.id);
        if (it == running_.end()) return;
        Running& r = it->second;
        if (ev.queue_seconds >= 0) t_.queues.push_back(ev.queue_seconds);
        if (ev.token >= 0) {
            if (r.ttft < 0) {
                r.ttft = std::chrono::duration<double>(Clock::now() - r.admitted).count();
                t_.ttfts.push_back(r.ttft);
                t_.last_first_token = Clock::now();
            }
            ++r.tokens;
        }
        r.shaper->tokens(openai::token_delta(ev, r.logprobs));
        r.abandoned |= ev.finish == FinishReason::kCancelled;  // cut by the drain: it runs on the next rerun
        if (!ev.last_of_request) return;
        if (r.abandoned) {
            ++t_.abandoned;
        } else {
            t_.gen_tokens += r.tokens;
            write_result(r, r.shaper->finish(openai::finish_delta(ev)));
        }
        running_.erase(it);
    }

public:
    bool complete() {
        if (input_left_ && (in_ >> std::ws).peek() == std::ifstream::traits_type::eof()) input_left_ = false;
        return !input_left_ && running_.empty() && scoring_.empty() && t_.abandoned == 0;
    }

private:
    EngineClient& client_;
    std::ifstream in_;
    BatchResultFile& out_;
    openai::ModelInfo model_;      // the served model as serve would name it (its "model" check, its context)
    std::deque<Running> scoring_;  // lines whose prompts are scored once the engine is idle (echo, prompt_logprobs)
    uint64_t nonce_ = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    int64_t records_ = 0;
    std::map<int64_t, Running> running_;  // by the client's request id
    std::set<std::string> seen_;          // ids of this input (duplicates are skipped)
    int64_t line_no_ = 0;
    int64_t line_bytes_ = 0;  // the current line's length (its text is kept up to kKeepBytes)
    bool input_left_ = true;
    BatchTotals t_;
};

BatchRun::BatchRun(EngineClient& client, const std::string& input, BatchResultFile& out, int64_t vocab,
                   std::string model)
    : impl_(std::make_unique<Impl>(client, input, out, vocab, std::move(model))) {}
BatchRun::~BatchRun() = default;
const BatchTotals& BatchRun::totals() const {
    return impl_->totals();
}
void BatchRun::run(double drain_seconds, BatchProgress& progress) {
    impl_->run(drain_seconds, progress);
}
bool BatchRun::complete() {
    return impl_->complete();
}

}  // namespace lattice
