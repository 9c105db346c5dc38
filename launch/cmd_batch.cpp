// `lattice batch`: a JSONL file of requests through the engine, results appended to a JSONL file as
// they complete; resumable.
//   input lines   {"custom_id": ID, "body": {completions or chat body, launch/openai_request.h}}
//                 (OpenAI's batch-file shape: "method"/"url" are accepted; a "url" ending in
//                 /chat/completions or a body with "messages" is a chat request), or a bare body
//                 {"prompt": ...} whose id is its line number (1-based).
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
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "base/error.h"
#include "launch/cli.h"
#include "base/file.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "launch/openai_request.h"
#include "runtime/engine/text_stream.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct BatchArgs {
    ModelArgs model;
    std::string input, output, stats_json, progress = "auto";
    double drain_seconds = 20;
};

// The output file: append-only, one write per line, recovered on open.
class ResultFile {
public:
    explicit ResultFile(const std::string& path) : path_(path) {
        struct stat st {};
        if (::stat(path.c_str(), &st) == 0) LATTICE_CHECK(S_ISREG(st.st_mode), "--output {}: not a regular file", path);
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        LATTICE_CHECK(fd_ >= 0, "--output {}: cannot open ({})", path, std::strerror(errno));
        recover();
    }
    ~ResultFile() {
        if (fd_ >= 0) ::close(fd_);
    }
    const std::set<std::string>& done() const { return done_; }
    int64_t cut_bytes() const { return cut_; }
    void write(const json& line) {
        // Invalid UTF-8 in generated text (bytes no character completes) becomes U+FFFD, not an error.
        const std::string s = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
        size_t off = 0;
        while (off < s.size()) {
            const ssize_t n = ::write(fd_, s.data() + off, s.size() - off);
            if (n < 0 && errno == EINTR) continue;
            LATTICE_CHECK(n > 0, "--output {}: write failed ({})", path_, std::strerror(errno));
            off += size_t(n);
        }
        done_.insert(line["custom_id"].dump());
    }
    void close() {
        LATTICE_CHECK(::fsync(fd_) == 0 || errno == EINVAL, "--output {}: flush failed ({})", path_,
                      std::strerror(errno));
        LATTICE_CHECK(::close(fd_) == 0, "--output {}: close failed ({})", path_, std::strerror(errno));
        fd_ = -1;
    }

private:
    void recover() {
        std::ifstream f(path_, std::ios::binary);
        std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const size_t end = all.rfind('\n');
        const size_t keep = end == std::string::npos ? 0 : end + 1;
        if (keep < all.size()) {  // a line cut short by a crash: drop it, it reruns
            LATTICE_CHECK(::ftruncate(fd_, off_t(keep)) == 0, "--output {}: cannot cut the partial last line ({})",
                          path_, std::strerror(errno));
            cut_ = int64_t(all.size() - keep);
        }
        size_t pos = 0;
        while (pos < keep) {
            const size_t nl = all.find('\n', pos);
            const json j = json::parse(all.begin() + int64_t(pos), all.begin() + int64_t(nl), nullptr, false);
            if (j.is_object() && j.contains("custom_id")) done_.insert(j["custom_id"].dump());
            pos = nl + 1;
        }
    }
    std::string path_;
    int fd_ = -1;
    std::set<std::string> done_;
    int64_t cut_ = 0;
};

struct Running {
    json custom_id;
    int64_t prompt_tokens = 0;
    std::vector<int32_t> tokens;
    std::unique_ptr<TextStream> text;
    std::string finish = "length";
    bool written = false;
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
    Engine& engine = *rt.engine;
    if (!engine.is_leader()) {
        engine.follow();
        return 0;
    }
    const std::unique_ptr<Tokenizer> tok =
        optional_tokenizer(a.model, "batch", "prompts must be token ids, results carry no text");
    const ApiLimits limits{rt.model->max_seq(), rt.model->config().vocab};
    std::ifstream in(a.input);
    LATTICE_CHECK(in.good(), "--input {}: cannot open", a.input);
    int64_t total = 0;
    for (std::string l; std::getline(in, l);) total += l.find_first_not_of(" \t\r") != std::string::npos;
    in.clear();
    in.seekg(0);
    ResultFile out(a.output);
    if (out.cut_bytes() > 0)
        fmt::print(stderr, "batch: {}: dropped a partial last line ({} bytes) left by an interrupted run\n", a.output,
                   out.cut_bytes());
    const int64_t already = int64_t(out.done().size());
    Progress progress(a.progress, total);
    std::map<int64_t, Running> running;  // engine id -> request
    std::set<std::string> seen;          // ids of this input (duplicates are errors)
    int64_t line_no = 0, done = already, errors = 0, prompt_tokens = 0, gen_tokens = 0, abandoned = 0;
    std::vector<double> ttfts;
    const SchedulerStats s0 = engine.scheduler().stats();
    Clock::time_point first_admit{}, last_done{}, last_first_token{};
    bool admitting = true, input_left = true;
    Clock::time_point drain_deadline{};
    auto record_error = [&](const json& id, const std::string& msg) {
        out.write(json{{"custom_id", id}, {"error", {{"message", msg}}}});
        ++errors;
        ++done;
    };
    auto finish = [&](Running& r) {
        json j = {{"custom_id", r.custom_id}};
        if (r.text) {
            r.text->finish();  // whatever was held back joins the text
            j["text"] = r.text->text();
        }
        j["token_ids"] = r.tokens;
        j["finish_reason"] = r.finish;
        j["usage"] = {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", int64_t(r.tokens.size())}};
        out.write(j);
        r.written = true;
        gen_tokens += int64_t(r.tokens.size());
        last_done = Clock::now();
        ++done;
    };
    // Admits input lines while the engine has little waiting.
    auto admit = [&] {
        const int64_t want_waiting = 16;
        std::string line;
        while (input_left && admitting && engine.scheduler().waiting() < want_waiting) {
            if (!std::getline(in, line)) {
                input_left = false;
                break;
            }
            ++line_no;
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            json id = line_no;
            const json j = json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object()) {
                if (!out.done().count(id.dump())) record_error(id, fmt::format("line {}: not a JSON object", line_no));
                continue;
            }
            const bool wrapped = j.contains("body");
            if (wrapped && j.contains("custom_id")) id = j["custom_id"];
            if (!seen.insert(id.dump()).second) {  // the id's record belongs to its first line
                fmt::print(stderr, "batch: line {}: custom_id {} already used by an earlier line; skipped\n", line_no,
                           id.dump());
                continue;
            }
            if (out.done().count(id.dump())) continue;  // finished by an earlier run
            try {
                LATTICE_CHECK(id.is_string() || id.is_number_integer(), "\"custom_id\" must be a string or an integer");
                const json& body = wrapped ? j["body"] : j;
                const bool chat = (j.contains("url") && j["url"].is_string() &&
                                   j["url"].get<std::string>().ends_with("/chat/completions")) ||
                                  (body.is_object() && body.contains("messages"));
                ApiRequest req = parse_api_request(body, chat, tok.get(), limits);
                Running r;
                r.custom_id = id;
                r.prompt_tokens = int64_t(req.engine.prompt.size());
                if (tok) r.text = std::make_unique<TextStream>(*tok, req.stop);
                r.admitted = Clock::now();
                if (first_admit == Clock::time_point{}) first_admit = r.admitted;
                const int64_t eid = engine.add(std::move(req.engine));
                prompt_tokens += r.prompt_tokens;
                running.emplace(eid, std::move(r));
            } catch (const Error& e) {
                record_error(id, fmt::format("line {}: {}", line_no, e.message()));
            }
        }
    };
    for (;;) {
        if (drain_requested() && admitting) {
            admitting = false;
            drain_deadline = Clock::now() + std::chrono::milliseconds(int64_t(a.drain_seconds * 1000));
            fmt::print(stderr, "\nbatch: signal {}: no new requests; finishing {} in flight (up to {:.0f} s)\n",
                       drain_requested(), running.size(), a.drain_seconds);
        }
        if (!admitting && !running.empty() && Clock::now() > drain_deadline) {
            for (auto& [eid, r] : running) engine.cancel(eid);  // abandoned: they run on the next rerun
            abandoned = int64_t(running.size());
            running.clear();
        }
        admit();
        if (!engine.busy() && !(input_left && admitting)) break;
        for (const TokenEvent& ev : engine.step()) {
            auto it = running.find(ev.id);
            if (it == running.end()) continue;  // finished early by a stop string, or abandoned
            Running& r = it->second;
            if (ev.token >= 0) {
                if (r.ttft < 0) {
                    r.ttft = since(r.admitted);
                    ttfts.push_back(r.ttft);
                    last_first_token = Clock::now();
                }
                r.tokens.push_back(ev.token);
                if (r.text && r.text->push(ev.token).stop) {
                    r.finish = "stop";
                    engine.cancel(ev.id);
                    finish(r);
                    running.erase(it);
                    continue;
                }
            }
            if (ev.finish != FinishReason::kNone) {
                r.finish = ev.finish == FinishReason::kStop ? "stop" : "length";
                finish(r);
                running.erase(it);
            }
        }
        progress.update(done, errors, gen_tokens);
    }
    engine.shutdown();
    out.close();
    progress.update(done, errors, gen_tokens, true);
    progress.end();
    const double run_s =
        first_admit == Clock::time_point{} ? 0 : std::chrono::duration<double>(last_done - first_admit).count();
    const SchedulerStats& s1 = engine.scheduler().stats();
    if (!a.stats_json.empty()) {
        json st = {{"load_seconds", rt.load_seconds},
                   {"run_seconds", run_s},
                   {"requests", total},
                   {"completed", done - already - errors},
                   {"errors", errors},
                   {"skipped_already_done", already},
                   {"abandoned", abandoned},
                   {"prompt_tokens", prompt_tokens},
                   {"generated_tokens", gen_tokens},
                   {"tokens_per_s", run_s > 0 ? double(gen_tokens) / run_s : 0.0},
                   // After the last request got its first token (meaningful when all start together).
                   {"decode_tokens_per_s", [&] {
                        const double d = std::chrono::duration<double>(last_done - last_first_token).count();
                        const int64_t n = gen_tokens - int64_t(ttfts.size());
                        return d > 0 && n > 0 ? double(n) / d : 0.0;
                    }()},
                   {"ttft_mean_s", ttfts.empty() ? 0.0 : [&] {
                        double s = 0;
                        for (double t : ttfts) s += t;
                        return s / double(ttfts.size());
                    }()},
                   {"ttft_p50_s", percentile(ttfts, 0.5)},
                   {"ttft_p90_s", percentile(ttfts, 0.9)},
                   {"preemptions", s1.preemptions - s0.preemptions},
                   {"peak_kv_blocks", s1.peak_blocks},
                   {"kv_blocks", engine.scheduler().pool().num_blocks()},
                   {"cached_prompt_tokens", s1.cached_tokens - s0.cached_tokens},
                   {"ranks", rt.world.world},
                   {"threads", rt.backend->threads()},
                   {"quant", std::string(quant_mode_name(rt.model->options().quant)) + (rt.model->options().quant_head ? "+head" : "")}};
        AtomicWriter f(a.stats_json, "--stats-json");
        f.write(st.dump(2) + "\n");
        f.commit();
    }
    const int64_t left = total - done;
    if (drain_requested())
        fmt::print(stderr,
                   "batch: stopped by signal {}: {} of {} requests done, {} left; rerun with the same --output "
                   "to finish them\n",
                   drain_requested(), done, total, left);
    else
        fmt::print(stderr, "batch: {} of {} requests done ({} errors, {} from earlier runs), {} tokens in {:.2f} s\n",
                   done, total, errors, already, gen_tokens, run_s);
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
