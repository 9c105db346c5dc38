// `lattice generate`: prefill a prompt, decode new tokens, print them; timings to stderr and
// optionally JSON (--stats-json) for scripts and benchmarks.
// The prompt: --prompt TEXT (-p), --prompt - or a redirected stdin with no prompt flag (stdin),
// --prompt-file FILE, or --prompt-ids 1,2,3 (launch/generate_common.h: size limit, UTF-8, one
// trailing newline dropped). Only rank 0 reads it: the other ranks follow the engine.
// Output on stdout (rank 0), one of:
//   text       streamed as it is generated, flushed per token; with --batch N > 1 each sequence
//              after a header line `--- sequence I ---` (I from 0), printed when all are done;
//   ids        --print-ids, or a model without a tokenizer: one line of space-separated ids per sequence;
//   --json     one JSON object per line per sequence: {"index", "text" (with a tokenizer),
//              "token_ids", "finish_reason": "stop" | "length", "usage":
//              {"prompt_tokens", "completion_tokens"}, "seed", "logprobs" (with --logprobs: the
//              log-softmax of the model's raw logits for each chosen token, before penalties,
//              temperature and truncation)}.
// Sequence I samples with seed + I ("seed" in its JSON); the seed is --seed, else random and printed
// on stderr (`seed: N`, unless greedy: temperature 0 draws nothing) and in --stats-json and --json,
// so a run is repeated with --seed N.
// Stop strings (--stop), the context budget and finish reasons are the engine client's
// (runtime/engine/client.h), the same as batch's and serve's. A context that fills up (the model's,
// or --max-seq) ends the output with finish_reason length, said on stderr; a prompt that leaves no
// room at all is an error.
// Every write to stdout is checked (a full disk or closed descriptor is an error naming stdout);
// --stats-json is written atomically, and a previous file there is removed when the run starts, so a
// run that dies leaves none behind.
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/generate_common.h"

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/memory.h"
#include "runtime/engine/client.h"
#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>

namespace lattice {

namespace {

struct GenerateArgs {
    ModelArgs model;
    std::string prompt_ids;
    std::string prompt;
    std::string prompt_file;
    std::string system;
    bool chat = false;
    int64_t max_new_tokens = 32;
    SamplingArgs sampling;
    bool ignore_eos = false;
    bool print_ids = false;
    bool json = false;
    bool logprobs = false;
    std::string stats_json;
    int64_t batch = 1;
};

// Decode rate counts the tokens produced by decode steps (the first token of each sequence comes
// from its prefill).
int64_t decode_tokens(const GenerateStats& s) { return std::max<int64_t>(0, s.generated_tokens - s.sequences); }

double decode_rate(const GenerateStats& s) {
    const int64_t steps = decode_tokens(s);
    return steps > 0 && s.decode_seconds > 0 ? double(steps) / s.decode_seconds : 0.0;
}

// The decode count printed is the one the rate divides (the line used to print all generated tokens).
void print_stats(const GenerateStats& s) {
    std::string line = fmt::format(
        "prefill: {} tokens in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.2f} tok/s), {} generated",
        s.prompt_tokens, s.prefill_seconds, s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0.0,
        decode_tokens(s), s.decode_seconds, decode_rate(s), s.generated_tokens);
    if (s.sequences > 1) line += fmt::format(" over {} sequences", s.sequences);
    if (s.drafted_tokens > 0)
        line += fmt::format("; speculative: {} of {} drafts accepted ({:.0f}%)", s.accepted_tokens, s.drafted_tokens,
                            100.0 * double(s.accepted_tokens) / double(s.drafted_tokens));
    line += "\n";
    print_stderr(line);
}

// The per-step time breakdown of every rank (engine.h's StepBreakdown), seconds over the run.
nlohmann::json breakdown_json(const GenerateStats& s) {
    auto parts = [](const StepBreakdown& b) {
        return nlohmann::json{{"compute", b.compute},
                              {"communication", b.communication},
                              {"pipeline_bubble", b.pipeline_bubble},
                              {"sampling", b.sampling},
                              {"host_overhead", b.host_overhead}};
    };
    nlohmann::json per_rank = nlohmann::json::array();
    for (const StepBreakdown& b : s.per_rank) {
        nlohmann::json r = parts(b);
        r["rank"] = b.rank;
        r["tp_rank"] = b.tp_rank;
        r["pp_rank"] = b.pp_rank;
        r["steps"] = b.steps;
        r["wall_seconds"] = b.wall;
        r["plan_wait"] = b.plan_wait;
        per_rank.push_back(std::move(r));
    }
    if (s.per_rank.empty()) return nlohmann::json::object();
    const StepBreakdown& r0 = s.per_rank.front();
    return {{"steps", r0.steps},
            {"wall_seconds", r0.wall},
            {"rank0", parts(r0)},
            {"plan_wait_seconds", r0.plan_wait},  // the leader's: blocked handing plans over (part of host_overhead)
            {"plan_blocked_seconds", r0.plan_blocked},  // of which waiting for a follower (a full queue)
            {"plan_bytes", r0.plan_bytes},        // the leader's encoded plans, per follower
            {"per_rank", std::move(per_rank)}};
}

void write_stats(const std::string& path, const GenerateStats& s, const RankRuntime& rt, const ModelArgs& args,
                 uint64_t seed) {
    nlohmann::json j = {
        {"prompt_tokens", s.prompt_tokens},
        {"prefill_seconds", s.prefill_seconds},
        {"generated_tokens", s.generated_tokens},
        {"decode_seconds", s.decode_seconds},
        {"prefill_tokens_per_s", s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0.0},
        {"decode_tokens_per_s", decode_rate(s)},
        {"sequences", s.sequences},
        {"seed", seed},
        {"idle_seconds_rank0", s.idle_seconds},
        {"compute_seconds_rank0", s.compute_seconds},
        {"bubble_rank0",
         s.prefill_seconds + s.decode_seconds > 0 ? s.idle_seconds / (s.prefill_seconds + s.decode_seconds) : 0.0},
        {"threads", rt.backend->threads()},
        {"ranks", rt.world.world},
        {"tp", args.tp},
        {"pp", args.pp},
        {"quant", quant_mode_name(rt.model->options().quant)},
        {"quant_head", rt.model->options().quant_head},
        {"preemptions", s.preemptions},
        {"peak_kv_blocks", s.peak_kv_blocks},
        {"drafted_tokens", s.drafted_tokens},
        {"accepted_tokens", s.accepted_tokens},
        {"backend", rt.backend->name()},
        {"weight_bytes_per_rank", rt.model->weight_bytes()},
        {"streamed_weight_bytes_per_rank", rt.model->streamed_weight_bytes()},  // read once per decode step
        {"load_seconds", rt.load_seconds},
        {"checkpoint_bytes_read_per_rank", rt.checkpoint_bytes_read},
        {"rss_bytes_rank0", resident_bytes()},
        {"breakdown", breakdown_json(s)}};
    AtomicWriter f(path, "--stats-json");
    f.write(j.dump(2) + "\n");
    f.commit();
}

// The prompt text from --prompt, --prompt-file or stdin; "" when --prompt-ids gives ids instead.
std::string prompt_text(const GenerateArgs& args) {
    const int given = int(!args.prompt.empty()) + int(!args.prompt_file.empty()) + int(!args.prompt_ids.empty());
    LATTICE_CHECK(given <= 1, "give one prompt: --prompt TEXT, --prompt-file FILE or --prompt-ids 1,2,3");
    if (args.prompt == "-") return read_prompt_stdin();
    if (!args.prompt.empty()) {
        check_utf8(args.prompt, "--prompt");
        return args.prompt;
    }
    if (!args.prompt_file.empty()) return read_prompt_file(args.prompt_file, "--prompt-file");
    if (!args.prompt_ids.empty()) return {};
    LATTICE_CHECK(stdin_is_redirected(),
                  "no prompt: give --prompt TEXT, --prompt-file FILE, --prompt - (stdin) or --prompt-ids 1,2,3, or "
                  "pipe the prompt into stdin");
    return read_prompt_stdin();
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool chat, const std::string& system) {
    if (!chat) return tok.encode(text, tok.add_bos_default(), false);
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", text});
    return encode_chat(tok, msgs, "--chat");
}

// Rank 0's output of the finished run: JSON lines, the streamed text's end, whole texts or ids.
void print_outputs(const GenerateArgs& args, const std::vector<ClientOutput>& outs, bool show_text, bool stream,
                   uint64_t seed) {
    for (size_t i = 0; i < outs.size(); ++i) {
        const ClientOutput& o = outs[i];
        if (args.json) {
            nlohmann::json j = {{"index", i}};
            if (show_text) j["text"] = o.text;
            j["token_ids"] = o.tokens;
            j["finish_reason"] = std::string(finish_reason_name(o.finish));
            j["usage"] = {{"prompt_tokens", o.prompt_tokens}, {"completion_tokens", int64_t(o.tokens.size())}};
            j["seed"] = seed + i;
            if (args.logprobs) j["logprobs"] = o.logprobs;
            // Invalid UTF-8 in generated text (bytes no character completes) becomes U+FFFD.
            write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        } else if (stream) {
            write_stdout("\n");
        } else if (show_text) {
            if (args.batch > 1) write_stdout(fmt::format("--- sequence {} ---\n", i));
            write_stdout(o.text + "\n");
        } else {
            write_stdout(fmt::format("{}\n", fmt::join(o.tokens, " ")));
        }
    }
    flush_stdout();
}

// Rank 0, before the (long) load: the prompt read, checked and tokenized; the tokenizer when the
// output needs text or --stop needs it.
struct PreparedPrompt {
    ClientRequest request;
    std::unique_ptr<Tokenizer> tok;
    bool text_prompt = false;
};

PreparedPrompt prepare_prompt(GenerateArgs& args) {
    PreparedPrompt p;
    if (!args.stats_json.empty())
        prepare_output_file(args.stats_json, "--stats-json", {args.model.model, args.model.smooth});
    const std::string text = prompt_text(args);
    p.text_prompt = !text.empty();
    if (p.text_prompt) {
        LATTICE_CHECK(!args.model.random_weights, "a text prompt needs a model with a tokenizer (use --prompt-ids)");
        p.tok = load_tokenizer(args.model.model);
        p.request.prompt = encode_prompt(*p.tok, text, args.chat, args.system);
    } else {
        LATTICE_CHECK(!args.chat, "--chat needs a text prompt (--prompt, --prompt-file or stdin)");
        p.request.prompt = parse_id_list(args.prompt_ids, "--prompt-ids");
        if (!args.model.random_weights && (args.json || !args.sampling.stop.empty()))
            p.tok = optional_tokenizer(args.model, "generate", "no text in the output, --stop cannot apply");
    }
    LATTICE_CHECK(!p.request.prompt.empty(), "the prompt is empty");
    p.request.lora = args.model.run_lora("generate");
    LATTICE_CHECK(args.sampling.stop.empty() || p.tok, "--stop needs a model with a tokenizer");
    p.request.sampling = args.sampling.resolve();
    p.request.stop = args.sampling.stop;
    p.request.grammar = args.sampling.grammar();
    LATTICE_CHECK(!p.request.grammar || p.tok,
                  "structured output (--json-schema, --json-object, --regex, --choice) needs a model with a tokenizer");
    p.request.ignore_eos = args.ignore_eos;
    return p;
}

int run_generate(GenerateArgs& args) {
    if (args.model.model.empty() && !args.model.random_weights) args.model.model = default_model_path();
    PreparedPrompt p;
    if (launcher_rank() == 0) p = prepare_prompt(args);  // everything from the user is checked before the load
    RankRuntime rt = load_model(args.model);
    const bool rank0 = rt.world.rank == 0;
    EngineClient client(*rt.engine, p.tok.get());
    const uint64_t seed = p.request.sampling.seed;
    std::vector<ClientRequest> reqs;
    if (rank0) {
        const int64_t n = args.max_new_tokens, prompt_tokens = int64_t(p.request.prompt.size());
        // An error (no room at all) is the run's: every rank learns it from run() below.
        const int64_t room = prompt_tokens < client.context() ? client.budget(prompt_tokens, n) : n;
        if (room < n)
            LOG_WARN("the context of {} positions leaves room for {} of the {} new tokens asked for after the prompt "
                     "of {} tokens: the output stops there",
                     client.context(), room, n, prompt_tokens);
        if (p.request.sampling.temperature > 0)  // (greedy does not draw: its seed changes nothing)
            print_stderr(args.batch > 1 ? fmt::format("seed: {} (sequence i: {} + i)\n", seed, seed)
                                        : fmt::format("seed: {}\n", seed));
        for (int64_t i = 0; i < args.batch; ++i) {
            reqs.push_back(p.request);
            reqs.back().max_tokens = n;
            reqs.back().sampling.seed = seed + uint64_t(i);  // distinct streams per sequence, reproducible
        }
    } else {
        reqs.resize(size_t(args.batch));
    }
    // Text is shown for a text prompt or --json, streamed when it is one sequence of plain text.
    const bool show_text = rank0 && p.tok && !args.print_ids && (p.text_prompt || args.json);
    const bool stream = show_text && !args.json && args.batch == 1;
    GenerateStats total;
    const std::vector<ClientOutput> outs = client.run(
        reqs,
        [&](size_t, const ClientEvent& ev) {
            if (stream && !ev.text.empty()) {
                write_stdout(ev.text);
                flush_stdout();
            }
            return true;
        },
        &total);
    if (!rank0) return 0;
    print_outputs(args, outs, show_text, stream, seed);
    for (size_t i = 0; i < outs.size(); ++i)
        if (outs[i].context_full)
            print_stderr(
                fmt::format("generate: {}the context of {} positions is full after {} new tokens: the output is cut "
                            "(finish_reason length; raise --max-seq, up to {})\n",
                            args.batch > 1 ? fmt::format("sequence {}: ", i) : "", client.context(),
                            outs[i].tokens.size(), rt.model->config().max_position));
    print_stats(total);
    if (!args.stats_json.empty()) write_stats(args.stats_json, total, rt, args.model, seed);
    return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<GenerateArgs>();
    auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt");
    args->model.add_to(cmd);
    cmd->add_option("-p,--prompt", args->prompt,
                    "Prompt text (tokenized with the model's tokenizer); - reads stdin, as does a piped stdin without "
                    "any prompt option");
    cmd->add_option("--prompt-file", args->prompt_file, "Read the prompt text from this file (UTF-8)");
    cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, e.g. 1,2,3");
    cmd->add_flag("--chat", args->chat, "Wrap the prompt in the model's chat template as a user turn");
    cmd->add_option("--system", args->system, "System message for --chat")->needs("--chat");
    cmd->add_option("-n,--max-new-tokens", args->max_new_tokens, "Tokens to generate")
        ->check(int_range(0, INT32_MAX))
        ->capture_default_str();
    args->sampling.add_to(cmd);
    cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-sequence token");
    auto* ids = cmd->add_flag("--print-ids", args->print_ids, "Print generated ids, space-separated, one line per sequence");
    auto* json = cmd->add_flag("--json", args->json,
                               "Print one JSON object per sequence (text, token_ids, finish_reason, usage, seed)");
    json->excludes(ids);
    cmd->add_flag("--logprobs", args->logprobs, "Add each chosen token's log-probability to the --json output")
        ->needs(json);
    cmd->add_option("--stats-json", args->stats_json, "Write timings (and the seed) as JSON to this file");
    cmd->add_option("--batch", args->batch, "Generate this many sequences of the prompt at once (pipelined decode)")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    cmd->footer(
        "Examples:\n"
        "  lattice generate -p \"The sky is blue because\" -n 64\n"
        "  echo \"Write a haiku about the sea\" | lattice generate --chat --temperature 0.7 --seed 42\n"
        "  lattice generate --prompt-file prompt.txt --json --logprobs --stop $'\\n\\n' --batch 4 --temperature 1");
    cmd->callback([&run, args] { run = [args] { return run_generate(*args); }; });
}

}  // namespace lattice
