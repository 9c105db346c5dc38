// `lattice batch`: a JSONL file of requests through the engine, results appended to a JSONL file as
// they complete; resumable.
//   input lines   {"custom_id": ID, "body": {completions or chat body, launch/openai_request.h}}
//                 (OpenAI's batch-file shape: "method"/"url" are accepted; a "url" ending in
//                 /chat/completions or a body with "messages" is a chat request), or a bare body
//                 {"prompt": ...} whose id is "line-N" (N its 1-based line number: a string, so it can
//                 never collide with an integer custom_id of another line).
//   output lines  {"custom_id", "text", "token_ids", "finish_reason", "usage": {prompt_tokens,
//                 completion_tokens}} ("text" absent for a model without a tokenizer), or
//                 {"custom_id", "error": {"message"}} for a line that cannot run. Completion order.
//                 A line repeating an earlier line's custom_id is skipped with a warning on stderr.
// Crash safety: each output line is one write() of the whole line. A rerun with the same --output
// first cuts a partial last line (a job killed mid-write, a lost node), then skips every id already
// there: a job killed at any moment loses at most its in-flight requests.
// SIGTERM / SIGINT / SIGUSR1 (what Slurm sends first; SIGUSR1 is what mpirun forwards to every rank,
// launch/drain_signal.h): stop admitting, finish in-flight requests for up to
// --drain-seconds, abandon the rest (they run on the next rerun), flush, exit 0 saying what is left.
// Only rank 0 reads the input and writes the output; the other ranks follow the engine.
// Limits per line, as the server's per body: at most kMaxLineBytes (8 MiB, serve's --max-body-bytes
// default) and JSON nesting 64 (base/json_limits.h), else an error record for that line. The output
// is locked while the job runs: a second job on it is refused naming the first one's pid.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "base/error.h"
#include "launch/cli.h"
#include "base/file.h"
#include "base/json_limits.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "launch/openai_request.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int64_t kMaxLineBytes = int64_t(8) << 20;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct BatchArgs {
    ModelArgs model;
    std::string input, output, stats_json, progress = "auto";
    double drain_seconds = 20;
};

// The output file (base/file.h AppendFile: one write per line, a partial last line cut on open) and
// the ids it already holds.
class ResultFile {
public:
    explicit ResultFile(const std::string& path) : file_(path, "--output") {
        for (const std::string& l : file_.lines()) {
            const json j = json::parse(l, nullptr, false);
            if (j.is_object() && j.contains("custom_id")) done_.insert(j["custom_id"].dump());
        }
    }
    const std::set<std::string>& done() const { return done_; }
    int64_t cut_bytes() const { return file_.cut_bytes(); }
    void write(const json& line) {
        // Invalid UTF-8 in generated text (bytes no character completes) becomes U+FFFD, not an error.
        file_.append(line.dump(-1, ' ', false, json::error_handler_t::replace));
        done_.insert(line["custom_id"].dump());
    }
    void close() { file_.close(); }

private:
    AppendFile file_;
    std::set<std::string> done_;
};

struct Running {
    json custom_id;
    std::string text;
    std::vector<int32_t> tokens;
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

// The input file's requests through the engine client, results to the output file as they finish.
class BatchRun {
public:
    BatchRun(EngineClient& client, const std::string& input, ResultFile& out, int64_t vocab)
        : client_(client), in_(input), out_(out), limits_{vocab} {
        LATTICE_CHECK(in_.good(), "--input {}: cannot open", input);
        for (std::string l; std::getline(in_, l);) t_.total += l.find_first_not_of(" \t\r") != std::string::npos;
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
            if (!client_.busy() && !(input_left_ && !client_.draining())) break;
            for (const ClientEvent& ev : client_.poll()) apply(ev);
            progress.update(t_.done, t_.errors, t_.gen_tokens);
        }
    }

private:
    void record_error(const json& id, const std::string& msg) {
        out_.write(json{{"custom_id", id}, {"error", {{"message", msg}}}});
        ++t_.errors;
        ++t_.done;
    }

    // One non-blank input line: an error record, a skip (done earlier, a duplicate id) or a submission.
    void admit_line(const std::string& line) {
        json id = fmt::format("line-{}", line_no_);
        // The server's limits on a request body, per line: a line of 60 MB or of 20 MB of "[" would
        // cost gigabytes in the parser before any check.
        std::string too_big;
        if (int64_t(line.size()) > kMaxLineBytes) {
            too_big = fmt::format("line {}: {} bytes, more than the {} a request may have", line_no_, line.size(),
                                  kMaxLineBytes);
        } else {
            try {
                check_json_limits(line, fmt::format("line {}", line_no_), JsonLimits{});
            } catch (const Error& e) {
                too_big = e.message();
            }
        }
        if (!too_big.empty()) {
            if (!out_.done().count(id.dump())) record_error(id, too_big);
            return;
        }
        const json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            if (!out_.done().count(id.dump())) record_error(id, fmt::format("line {}: not a JSON object", line_no_));
            return;
        }
        const bool wrapped = j.contains("body");
        if (wrapped && j.contains("custom_id")) id = j["custom_id"];
        if (!seen_.insert(id.dump()).second) {  // the id's record belongs to its first line
            fmt::print(stderr, "batch: line {}: custom_id {} already used by an earlier line; skipped\n", line_no_,
                       id.dump());
            ++t_.duplicates;
            return;
        }
        if (out_.done().count(id.dump())) return;  // finished by an earlier run
        try {
            LATTICE_CHECK(id.is_string() || id.is_number_integer(), "\"custom_id\" must be a string or an integer");
            const json& body = wrapped ? j["body"] : j;
            const bool chat = (j.contains("url") && j["url"].is_string() &&
                               j["url"].get<std::string>().ends_with("/chat/completions")) ||
                              (body.is_object() && body.contains("messages"));
            ApiRequest req = parse_api_request(body, chat, client_.tokenizer(), limits_);
            const int64_t prompt_tokens = int64_t(req.client.prompt.size());
            Running r;
            r.custom_id = id;
            r.admitted = Clock::now();
            const int64_t eid = client_.submit(std::move(req.client));
            if (t_.first_admit == Clock::time_point{}) t_.first_admit = r.admitted;
            t_.prompt_tokens += prompt_tokens;
            running_.emplace(eid, std::move(r));
        } catch (const Error& e) {
            record_error(id, fmt::format("line {}: {}", line_no_, e.message()));
        }
    }

    // Admits input lines while the engine has little waiting.
    void admit() {
        constexpr int64_t kWantWaiting = 16;
        std::string line;
        while (input_left_ && !client_.draining() && client_.scheduler().waiting() < kWantWaiting) {
            if (!std::getline(in_, line)) {
                input_left_ = false;
                break;
            }
            ++line_no_;
            if (line.find_first_not_of(" \t\r") != std::string::npos) admit_line(line);
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
            r.tokens.push_back(ev.token);
        }
        r.text += ev.text;
        if (ev.finish == FinishReason::kNone) return;
        if (ev.finish == FinishReason::kCancelled) {  // cut by the drain: it runs on the next rerun
            ++t_.abandoned;
        } else {
            json j = {{"custom_id", r.custom_id}};
            if (client_.tokenizer()) j["text"] = r.text;
            j["token_ids"] = r.tokens;
            j["finish_reason"] = std::string(finish_reason_name(ev.finish));
            j["usage"] = {{"prompt_tokens", ev.prompt_tokens}, {"completion_tokens", ev.completion_tokens}};
            out_.write(j);
            t_.gen_tokens += int64_t(r.tokens.size());
            t_.last_done = Clock::now();
            ++t_.done;
        }
        running_.erase(it);
    }

    EngineClient& client_;
    std::ifstream in_;
    ResultFile& out_;
    ApiLimits limits_;
    std::map<int64_t, Running> running_;  // by the client's id
    std::set<std::string> seen_;          // ids of this input (duplicates are skipped)
    int64_t line_no_ = 0;
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
                     {"plans_sent", rt.engine->counters().plans_sent},
                     {"plan_bytes", rt.engine->counters().plan_bytes},
                     {"cached_prompt_tokens", s1.cached_tokens - s0.cached_tokens},
                     {"ranks", rt.world.world},
                     {"threads", rt.backend->threads()},
                     {"quant", quant}};
    AtomicWriter f(path, "--stats-json");
    f.write(st.dump(2) + "\n");
    f.commit();
}

int run_batch(BatchArgs& a) {
    if (a.model.model.empty() && !a.model.random_weights) a.model.model = default_model_path();
    LATTICE_CHECK(!a.input.empty() && !a.output.empty(), "lattice batch needs --input FILE and --output FILE");
    // Files are checked before the (long) load: an unreadable input, an output that is an input.
    if (launcher_rank() == 0) {
        open_regular_file(a.input, "--input");  // names a missing file, a folder or a FIFO
        check_not_input(a.output, "--output", {a.model.model, a.model.smooth, a.input});
        if (!a.stats_json.empty())
            prepare_output_file(a.stats_json, "--stats-json", {a.model.model, a.model.smooth, a.input, a.output});
    }
    RankRuntime rt = load_model(a.model);
    install_drain_handlers();
    const std::unique_ptr<Tokenizer> tok =
        rt.world.rank == 0 ? optional_tokenizer(a.model, "batch", "prompts must be token ids, results carry no text")
                           : nullptr;
    EngineClient client(*rt.engine, tok.get());
    if (!client.is_leader()) {
        client.follow();
        return 0;
    }
    ResultFile out(a.output);
    if (out.cut_bytes() > 0)
        fmt::print(stderr, "batch: {}: dropped a partial last line ({} bytes) left by an interrupted run\n", a.output,
                   out.cut_bytes());
    BatchRun batch(client, a.input, out, rt.model->config().vocab);
    Progress progress(a.progress, batch.totals().total);
    const SchedulerStats s0 = client.scheduler().stats();
    batch.run(a.drain_seconds, progress);
    client.shutdown();
    out.close();
    const BatchTotals& t = batch.totals();
    progress.update(t.done, t.errors, t.gen_tokens, true);
    progress.end();
    if (!a.stats_json.empty()) write_batch_stats(a.stats_json, t, rt, s0, client);
    if (drain_requested())
        fmt::print(stderr,
                   "batch: stopped by signal {}: {} of {} requests done, {} left; rerun with the same --output "
                   "to finish them\n",
                   drain_requested(), t.done, t.requests(), t.requests() - t.done);
    else
        fmt::print(stderr, "batch: {} of {} requests done ({} errors, {} from earlier runs{}), {} tokens in {:.2f} s\n",
                   t.done, t.requests(), t.errors, t.already,
                   t.duplicates > 0 ? fmt::format("; {} lines skipped: their custom_id belongs to an earlier line",
                                                  t.duplicates)
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
    cmd->add_option("--output", args->output, "Results, appended as they complete (rerun to resume)")->required();
    cmd->add_option("--stats-json", args->stats_json, "Write run statistics as JSON to this file");
    cmd->add_option("--progress", args->progress,
                    "auto (a bar on a terminal, a line every 5 s otherwise) | bar | "
                    "lines | none")
        ->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
    cmd->add_option("--drain-seconds", args->drain_seconds,
                    "On SIGTERM/SIGINT, finish in-flight requests for at most this long (default 20)")
        ->check(CLI::Range(0.0, 86400.0));
    cmd->footer(R"(Examples:
  lattice batch --input requests.jsonl --output results.jsonl
  mpirun -np 2 --oversubscribe lattice batch --pp 2 --threads 1 --input requests.jsonl --output results.jsonl
  lattice batch --model /models/llama-2-7b --quant w8a8 --input big.jsonl --output out.jsonl --progress lines)");
    cmd->callback([&run, args] { run = [args] { return run_batch(*args); }; });
}

}  // namespace lattice
