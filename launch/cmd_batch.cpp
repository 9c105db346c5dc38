// `lattice batch`: a JSONL file of requests through the engine, results appended to a JSONL file as
// they complete; resumable. Files in OpenAI's Batch format, as vLLM's `run-batch` reads and writes them.
//   input lines   {"custom_id": ID, "method": "POST", "url": "/v1/completions" | "/v1/chat/completions",
//                 "body": {completions or chat body, launch/openai/request.h}}: the url picks the
//                 endpoint (any other url, or a method other than POST, is an error record naming it;
//                 without a url a body with "messages" is a chat request), or a bare body
//                 {"prompt": ...} whose id is "line-N" (N its 1-based line number). Ids are unique
//                 within an input, else it is refused before the model loads (launch/batch_input.h).
//   output lines  {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id",
//                 "body": the JSON `lattice serve` returns for that request (launch/openai/response.h
//                 ResponseShaper: "text_completion" / "chat.completion", usage, "token_ids" when the
//                 body asks "return_token_ids" or the model has no tokenizer)}, "error": null}, or
//                 a body serve refuses: "response": {"status_code": 400 | 404, "request_id", "body":
//                 serve's error body}, "error": null (the same validation: launch/openai/call.h; the
//                 served name is the model path's last component, as serve's default, and "model"
//                 must match it as in serve); {"id", "custom_id", "response": null, "error": {"code",
//                 "message"}} for a line that is no request (bad JSON, id, method, url, size).
//                 Completion order. "stream" is ignored (a line's response is one body). echo with
//                 logprobs and prompt_logprobs score the prompts once the engine is idle, as serve.
//                 Every line's record carries its custom_id when it has one (batch_line_id).
// Crash safety: each output line is one write() of the whole line. A rerun with the same --output
// first cuts a partial last line (a job killed mid-write, a lost node), then skips every id already
// there: a job killed at any moment loses at most its in-flight requests.
// The output is bound to its input (launch/batch_input.h: a side file OUTPUT.input, the input's size
// and SHA-256): a rerun after the input was edited is refused naming both files, unless lines were
// only appended at its end (they run too); --restart empties the output and starts over.
// SIGTERM / SIGINT / SIGUSR1 (what Slurm sends first; SIGUSR1 is what mpirun forwards to every rank,
// launch/drain_signal.h): stop admitting, finish in-flight requests for up to
// --drain-seconds, abandon the rest (they run on the next rerun), flush, and exit kExitRequestsLeft
// (75) saying what is left. Exit 0 only when every input line has its output record.
// Only rank 0 reads the input and writes the output; the other ranks follow the engine.
// Limits per line, as the server's per body: at most kMaxLineBytes (8 MiB, serve's --max-body-bytes
// default) and JSON nesting 64 (base/json_limits.h), else an error record for that line. The output
// is locked while the job runs: a second job on it is refused naming the first one's pid.
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
#include "base/file.h"
#include "base/json_limits.h"
#include "launch/batch_input.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "launch/openai/call.h"
#include "launch/openai/request.h"
#include "launch/openai/response.h"
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
// Exit status of a run that stopped with requests left (a drain signal: Slurm's time limit or
// preemption): EX_TEMPFAIL of sysexits.h, "try again later", which is what a rerun does. It is not
// 1 (an error: rerunning the same input fails the same way) nor 0 (Slurm records COMPLETED), so
// launch/slurm/batch.sbatch requeues the job on it and only on it.
constexpr int kExitRequestsLeft = 75;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct BatchArgs {
    ModelArgs model;
    std::string input, output, stats_json, progress = "auto";
    double drain_seconds = 20;
    int64_t sync_lines = 64;
    double sync_seconds = 2;
    bool restart = false;
};

// The output file (base/file.h AppendFile: one write per line, a partial last line cut on open,
// locked against a second job) and the ids it already holds: read line by line, only the ids kept.
// A complete line that is not a record (a JSON object with "custom_id") cannot come from a crash (a
// crash tears only the last line, which is cut): the file was edited or damaged. The run refuses it,
// naming the line, rather than skip it: skipping would leave the line in the results for whoever
// reads them, and which request it held is unknown, so nothing here can repair it. Deleting the
// line and rerunning runs its request again. `restart`: every line is discarded instead (--restart).
class ResultFile {
public:
    ResultFile(const std::string& path, int64_t sync_lines, double sync_seconds, bool restart)
        : restart_(restart), file_(path, "--output", [this](std::string_view l, int64_t no) { read_line(l, no); }) {
        if (restart_ && discarded_ > 0) file_.truncate();
        if (!bad_lines_.empty()) {
            std::string more;
            if (bad_lines_.size() > 1)
                more = fmt::format(" (nor {} {})", bad_lines_.size() > 2 ? "are lines" : "is line",
                                   fmt::join(bad_lines_.begin() + 1, bad_lines_.end(), ", "));
            LATTICE_FAIL("--output {}: line {} is not a batch record{}: the file was edited or damaged (a crash "
                         "only tears the last line, which a rerun cuts); delete or repair the line and rerun (the "
                         "request of a deleted line runs again)",
                         path, bad_lines_[0], more);
        }
        file_.set_sync(sync_lines, sync_seconds);
    }
    const std::set<std::string>& done() const { return done_; }
    int64_t discarded() const { return discarded_; }  // lines emptied by `restart`
    int64_t cut_bytes() const { return file_.cut_bytes(); }
    void write(const json& line) {
        // Invalid UTF-8 in generated text (bytes no character completes) becomes U+FFFD, not an error.
        file_.append(line.dump(-1, ' ', false, json::error_handler_t::replace));
        done_.insert(line["custom_id"].dump());
    }
    void sync_if_due() { file_.sync_if_due(); }
    void close() { file_.close(); }

private:
    void read_line(std::string_view l, int64_t no) {
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
    std::set<std::string> done_;
    std::vector<int64_t> bad_lines_;  // the first ten
    bool restart_ = false;
    int64_t discarded_ = 0;
    AppendFile file_;  // last: its constructor calls read_line
};

// One input line in flight: its engine sequences (choice_requests order: prompt * best_of + i) feed
// one response body; the record is written when the last of them finishes.
struct Running {
    json custom_id;
    std::string hex;                                // of the record's "batch_req_" and "req_" ids
    std::unique_ptr<openai::ResponseShaper> shaper;  // the server's response body
    openai::ApiRequest request;                      // the parsed body (its prompts until it runs)
    bool logprobs = false;                           // its tokens' alternatives are asked for
    int64_t tokens = 0;
    int64_t prompt_tokens = 0;  // every prompt once (usage)
    bool abandoned = false;     // a sequence was cut by the drain: the line runs again on the next rerun
    Clock::time_point admitted;
    double ttft = -1;
};

class Progress {
public:
    Progress(const std::string& mode, int64_t total) : total_(total) {
        tty_ = mode == "bar" || (mode == "auto" && ::isatty(2));
        off_ = mode == "none";
    }
    void update(int64_t done, int64_t errors, int64_t tokens, bool force = false) {
        if (off_) return;
        const double t = since(start_);
        if (!force && t - last_ < (tty_ ? 0.2 : 5.0)) return;
        last_ = t;
        const double rate = t > 0 ? double(tokens) / t : 0, per = done > 0 ? t / double(done) : 0;
        const int64_t left = std::max<int64_t>(total_ - done, 0);
        const std::string eta =
            done > 0 ? fmt::format("{}:{:02}", int64_t(per * double(left)) / 60, int64_t(per * double(left)) % 60)
                     : "?";
        if (tty_) {
            const int width = 30, fill = total_ > 0 ? int(width * std::min<int64_t>(done, total_) / total_) : 0;
            fmt::print(stderr, "\r[{}{}] {}/{} done, {} errors, {:.1f} tok/s, ETA {}  ", std::string(size_t(fill), '#'),
                       std::string(size_t(width - fill), '.'), done, total_, errors, rate, eta);
        } else {
            fmt::print(stderr, "batch: {}/{} done, {} errors, {:.1f} tok/s, ETA {}\n", done, total_, errors, rate, eta);
        }
        std::fflush(stderr);
    }
    void end() {
        if (tty_ && !off_) fmt::print(stderr, "\n");
    }

private:
    int64_t total_;
    bool tty_ = false, off_ = false;
    Clock::time_point start_ = Clock::now();
    double last_ = -1e9;
};

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[size_t(std::min<double>(double(v.size() - 1), q * double(v.size() - 1) + 0.5))];
}

// What a batch run did, for the summary line and --stats-json.
struct BatchTotals {
    int64_t total = 0, already = 0, done = 0, errors = 0, prompt_tokens = 0, gen_tokens = 0, abandoned = 0;
    int64_t duplicates = 0;  // lines skipped: their custom_id belongs to an earlier line
    int64_t requests() const { return total - duplicates; }  // distinct ids of the input
    std::vector<double> ttfts, queues;  // per request: to its first token; in the engine's queue
    Clock::time_point first_admit{}, last_done{}, last_first_token{};
    double run_seconds() const {
        return first_admit == Clock::time_point{} ? 0 : std::chrono::duration<double>(last_done - first_admit).count();
    }
};

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

// The input file's requests through the engine client, results to the output file as they finish.
class BatchRun {
public:
    BatchRun(EngineClient& client, const std::string& input, ResultFile& out, int64_t vocab, std::string model)
        : client_(client),
          in_(input),
          out_(out),
          model_{std::move(model), client.tokenizer(), {vocab}, client.context(), {}} {
        LATTICE_CHECK(in_.good(), "--input {}: cannot open", input);
        model_.is_adapter = [this](const std::string& name) { return client_.is_leader() && client_.loras().has(name); };
        int64_t length = 0;
        for (std::string l; read_line_bounded(in_, l, kKeepBytes, length);) t_.total += !blank(l);
        in_.clear();
        in_.seekg(0);
        t_.already = t_.done = int64_t(out.done().size());
    }
    const BatchTotals& totals() const { return t_; }

    // Until the input is done (or drained) and nothing runs.
    void run(double drain_seconds, Progress& progress) {
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
    // Every input line has its output record (or repeats an earlier line's id). A drain that came just
    // as the last line was admitted leaves only blanks (or nothing) unread: that is complete too.
    bool complete() {
        if (input_left_ && (in_ >> std::ws).peek() == std::ifstream::traits_type::eof()) input_left_ = false;
        return !input_left_ && running_.empty() && scoring_.empty() && t_.abandoned == 0;
    }

private:
    EngineClient& client_;
    std::ifstream in_;
    ResultFile& out_;
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

void write_batch_stats(const std::string& path, const BatchTotals& t, const RankRuntime& rt, const SchedulerStats& s0,
                       const EngineClient& client) {
    const SchedulerStats& s1 = client.scheduler().stats();
    const double run_s = t.run_seconds();
    const double decode_s = std::chrono::duration<double>(t.last_done - t.last_first_token).count();
    const int64_t decode_n = t.gen_tokens - int64_t(t.ttfts.size());
    double ttft_sum = 0;
    for (double x : t.ttfts) ttft_sum += x;
    const std::string quant =
        std::string(quant_mode_name(rt.model->options().quant)) + (rt.model->options().quant_head ? "+head" : "");
    const json st = {{"load_seconds", rt.load_seconds},
                     {"run_seconds", run_s},
                     {"requests", t.requests()},
                     {"duplicate_lines", t.duplicates},
                     {"completed", t.done - t.already - t.errors},
                     {"errors", t.errors},
                     {"skipped_already_done", t.already},
                     {"abandoned", t.abandoned},
                     {"prompt_tokens", t.prompt_tokens},
                     {"generated_tokens", t.gen_tokens},
                     {"tokens_per_s", run_s > 0 ? double(t.gen_tokens) / run_s : 0.0},
                     // After the last request got its first token (meaningful when all start together).
                     {"decode_tokens_per_s", decode_s > 0 && decode_n > 0 ? double(decode_n) / decode_s : 0.0},
                     {"ttft_mean_s", t.ttfts.empty() ? 0.0 : ttft_sum / double(t.ttfts.size())},
                     {"ttft_p50_s", percentile(t.ttfts, 0.5)},
                     {"ttft_p90_s", percentile(t.ttfts, 0.9)},
                     {"ttft_p99_s", percentile(t.ttfts, 0.99)},
                     {"queue_p50_s", percentile(t.queues, 0.5)},
                     {"queue_p90_s", percentile(t.queues, 0.9)},
                     {"preemptions", s1.preemptions - s0.preemptions},
                     {"peak_kv_blocks", s1.peak_blocks},
                     {"kv_blocks", client.scheduler().pool().num_blocks()},
                     {"kv_blocks_free", client.scheduler().pool().num_free()},  // all, once every request ended
                     // The leader's engine: its forwards, and the time it was blocked handing plans over.
                     {"steps", rt.engine->counters().steps},
                     {"plan_wait_seconds", rt.engine->counters().plan_wait_seconds},
                     {"plan_blocked_seconds", rt.engine->counters().plan_blocked_seconds},
                     {"plan_cpu_seconds", rt.engine->counters().plan_cpu_seconds},
                     {"sim_overrun_seconds", rt.engine->counters().sim_overrun_seconds},
                     {"plans_sent", rt.engine->counters().plans_sent},
                     {"plan_bytes", rt.engine->counters().plan_bytes},
                     {"cached_prompt_tokens", s1.cached_tokens - s0.cached_tokens},
                     {"drafted_tokens", s1.drafted_tokens - s0.drafted_tokens},
                     {"accepted_tokens", s1.accepted_tokens - s0.accepted_tokens},
                     {"ranks", rt.world.world},
                     {"threads", rt.backend->threads()},
                     {"quant", quant}};
    AtomicWriter f(path, "--stats-json");
    f.write(st.dump(2) + "\n");
    f.commit();
}

// The "model" of a response whose request names none: what `lattice serve` calls the model by default.
std::string model_name(const ModelArgs& m) {
    if (m.random_weights) return m.config_preset.empty() ? "random" : m.config_preset;
    std::string p = m.model;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p.substr(p.rfind('/') + 1);  // npos + 1 == 0: the whole path
}

int run_batch(BatchArgs& args) {
    if (args.model.model.empty() && !args.model.random_weights) args.model.model = default_model_path();
    LATTICE_CHECK(!args.input.empty() && !args.output.empty(), "lattice batch needs --input FILE and --output FILE");
    // Files are checked before the (long) load: an unreadable input, an output that is an input.
    const std::string side = batch_input_file(args.output);
    if (launcher_rank() == 0) {
        open_regular_file(args.input, "--input");  // names a missing file, a folder or a FIFO
        check_not_input(args.output, "--output", {args.model.model, args.model.smooth, args.input}, true);
        check_not_input(side, "--output's input fingerprint", {args.model.model, args.model.smooth, args.input});
        if (!args.stats_json.empty())
            prepare_output_file(args.stats_json, "--stats-json",
                                {args.model.model, args.model.smooth, args.input, args.output, side});
    }
    // The output is opened (locked, checked, its done ids read) and bound to the input before the load
    // too: a file another job holds, a damaged one, or one whose input was edited, is refused at once.
    std::unique_ptr<ResultFile> out;
    if (launcher_rank() == 0) {
        out = std::make_unique<ResultFile>(args.output, args.sync_lines, args.sync_seconds, args.restart);
        if (out->discarded() > 0)
            fmt::print(stderr, "batch: --restart: discarded the {} lines of {}\n", out->discarded(), args.output);
        const BatchInputBinding bound = bind_batch_input(args.input, args.output, !out->done().empty());
        if (bound.appended_lines > 0)
            fmt::print(stderr, "batch: {}: {} line(s) appended at its end since the results in {}; they run too\n",
                       args.input, bound.appended_lines, args.output);
    }
    if (args.model.max_itl_ms < 0) args.model.max_itl_ms = 0;  // throughput first: whole prompt chunks in every step
    RankRuntime rt = load_model(args.model);
    install_drain_handlers();
    const std::unique_ptr<Tokenizer> tok =
        rt.world.rank == 0 ? optional_tokenizer(args.model, "batch", "prompts must be token ids, results carry no text")
                           : nullptr;
    EngineClient client(*rt.engine, tok.get());
    if (!client.is_leader()) {
        client.follow();
        return 0;
    }
    LATTICE_CHECK(out, "batch: the engine's leader is not the launcher's rank 0");
    if (out->cut_bytes() > 0)
        fmt::print(stderr, "batch: {}: dropped a partial last line ({} bytes) left by an interrupted run\n",
                   args.output, out->cut_bytes());
    BatchRun batch(client, args.input, *out, rt.model->config().vocab, model_name(args.model));
    Progress progress(args.progress, batch.totals().total);
    const SchedulerStats s0 = client.scheduler().stats();
    batch.run(args.drain_seconds, progress);
    client.shutdown();
    out->close();
    const BatchTotals& t = batch.totals();
    progress.update(t.done, t.errors, t.gen_tokens, true);
    progress.end();
    if (!args.stats_json.empty()) write_batch_stats(args.stats_json, t, rt, s0, client);
    if (!batch.complete()) {
        fmt::print(stderr,
                   "batch: stopped by signal {}: {} of {} requests done, {} left; rerun with the same --output "
                   "to finish them (exit {})\n",
                   drain_requested(), t.done, t.requests(), t.requests() - t.done, kExitRequestsLeft);
        return kExitRequestsLeft;
    }
    fmt::print(stderr, "batch: {} of {} requests done ({} errors, {} from earlier runs{}), {} tokens in {:.2f} s\n",
               t.done, t.requests(), t.errors, t.already,
               t.duplicates > 0
                   ? fmt::format("; {} lines skipped: their custom_id belongs to an earlier line", t.duplicates)
                   : "",
               t.gen_tokens, t.run_seconds());
    return 0;
}

}  // namespace

void add_batch_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<BatchArgs>();
    auto* cmd = app.add_subcommand("batch", "Run a JSONL file of requests (OpenAI batch shape); resumable");
    args->model.add_to(cmd);
    cmd->add_option("--input", args->input, "Requests, one JSON object per line")->required();
    cmd->add_option("--output", args->output,
                    "Results, appended as they complete (rerun to resume; OUTPUT.input binds them to the input)")
        ->required();
    cmd->add_option("--stats-json", args->stats_json, "Write run statistics as JSON to this file");
    cmd->add_option("--progress", args->progress,
                    "auto (a bar on a terminal, a line every 5 s otherwise) | bar | "
                    "lines | none")
        ->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
    cmd->add_option("--drain-seconds", args->drain_seconds,
                    "On SIGTERM/SIGINT, finish in-flight requests for at most this long, then exit 75 "
                    "(requests left; exit 0 once every line has its record) (default 20)")
        ->check(CLI::Range(0.0, 86400.0));
    cmd->add_option("--sync-lines", args->sync_lines,
                    "Flush results to the disk (fdatasync) at least every this many lines (default 64)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->add_option("--sync-seconds", args->sync_seconds,
                    "... and once a result has waited this many seconds (default 2)")
        ->check(CLI::Range(0.0, 3600.0));
    cmd->add_flag("--restart", args->restart,
                  "Discard the results already in --output and run every line again (after the input was edited)");
    cmd->footer(R"(Resuming: a rerun with the same --output skips every id it holds. The input must be the one
those results came from (OUTPUT.input records its size and SHA-256): lines appended at its end
run too; an input edited otherwise (a line inserted, changed or removed) is refused, naming both
files: give the edited input a new --output, or add --restart to start over.

Examples:
  lattice batch --input requests.jsonl --output results.jsonl
  mpirun -np 2 --oversubscribe lattice batch --pp 2 --threads 1 --input requests.jsonl --output results.jsonl
  lattice batch --model /models/llama-2-7b --quant w8a8 --input big.jsonl --output out.jsonl --progress lines)");
    cmd->callback([&run, args] { run = [args] { return run_batch(*args); }; });
}

}  // namespace lattice
