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
// Limits per line, as the server's per body: at most 8 MiB (serve's --max-body-bytes default) and
// JSON nesting 64 (base/json_limits.h), else an error record for that line. The output is locked
// while the job runs: a second job on it is refused naming the first one's pid.
// This file is the command (arguments, the checks before the load, the summary, --stats-json);
// launch/batch_run.h runs the lines through the engine and writes the output.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file.h"
#include "launch/batch_input.h"
#include "launch/batch_run.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

using nlohmann::json;

// Exit status of a run that stopped with requests left (a drain signal: Slurm's time limit or
// preemption): EX_TEMPFAIL of sysexits.h, "try again later", which is what a rerun does. It is not
// 1 (an error: rerunning the same input fails the same way) nor 0 (Slurm records COMPLETED), so
// launch/slurm/batch.sbatch requeues the job on it and only on it.
constexpr int kExitRequestsLeft = 75;

struct BatchArgs {
    ModelArgs model;
    std::string input, output, stats_json, progress = "auto";
    double drain_seconds = 20;
    int64_t sync_lines = 64;
    double sync_seconds = 2;
    bool restart = false;
};

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[size_t(std::min<double>(double(v.size() - 1), q * double(v.size() - 1) + 0.5))];
}

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
    std::unique_ptr<BatchResultFile> out;
    if (launcher_rank() == 0) {
        out = std::make_unique<BatchResultFile>(args.output, args.sync_lines, args.sync_seconds, args.restart);
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
    BatchProgress progress(args.progress, batch.totals().total);
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
