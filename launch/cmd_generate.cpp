// `lattice generate`: prefill a prompt, decode new tokens, print them; timings to stderr and
// optionally JSON (--stats-json) for scripts and benchmarks. Every write to stdout is checked (a full
// disk or closed descriptor is an error naming stdout); --stats-json is written atomically, and a
// previous file there is removed when the run starts, so a run that dies leaves none behind. A prompt
// that fills the context is an error when tokens were asked for; one that leaves room for fewer
// than --max-new-tokens gets a warning on stderr.
#include "launch/cli.h"
#include "launch/cli_common.h"

#include "base/error.h"
#include "runtime/tokenizer/chat_template.h"
#include "base/memory.h"
#include "runtime/tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "base/log.h"

#include <memory>

namespace lattice {

namespace {

struct GenerateArgs {
    ModelArgs model;
    std::string prompt_ids;
    std::string prompt;
    std::string system;
    bool chat = false;
    int64_t max_new_tokens = 32;
    float temperature = 0.0f;
    int64_t top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
    bool ignore_eos = false;
    bool print_ids = false;
    std::string stats_json;
    int64_t batch = 1;
};

// Decode rate counts the tokens produced by decode steps (the first token of each sequence comes
// from its prefill).
double decode_rate(const GenerateStats& s) {
    const int64_t steps = s.generated_tokens - s.sequences;
    return steps > 0 && s.decode_seconds > 0 ? double(steps) / s.decode_seconds : 0.0;
}

void print_stats(const GenerateStats& s) {
    std::string line = fmt::format(
        "prefill: {} tokens in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.2f} tok/s)", s.prompt_tokens,
        s.prefill_seconds, s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0.0,
        s.generated_tokens, s.decode_seconds, decode_rate(s));
    if (s.sequences > 1) line += fmt::format(" over {} sequences", s.sequences);
    line += "\n";
    print_stderr(line);
}

void write_stats(const std::string& path, const GenerateStats& s, const Built& lm, const ModelArgs& a) {
    nlohmann::json j = {{"prompt_tokens", s.prompt_tokens},
                        {"prefill_seconds", s.prefill_seconds},
                        {"generated_tokens", s.generated_tokens},
                        {"decode_seconds", s.decode_seconds},
                        {"prefill_tokens_per_s", s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0.0},
                        {"decode_tokens_per_s", decode_rate(s)},
                        {"sequences", s.sequences},
                        {"idle_seconds_rank0", s.idle_seconds},
                        {"compute_seconds_rank0", s.compute_seconds},
                        {"bubble_rank0", s.prefill_seconds + s.decode_seconds > 0
                                             ? s.idle_seconds / (s.prefill_seconds + s.decode_seconds)
                                             : 0.0},
                        {"threads", lm.backend->threads()},
                        {"ranks", lm.world.world},
                        {"tp", a.tp},
                        {"pp", a.pp},
                        {"quant", quant_mode_name(lm.model->options().quant)},
                        {"quant_head", lm.model->options().quant_head},
                        {"preemptions", s.preemptions},
                        {"peak_kv_blocks", s.peak_kv_blocks},
                        {"backend", lm.backend->name()},
                        {"weight_bytes_per_rank", lm.model->weight_bytes()},
                        {"load_seconds", lm.load_seconds},
                        {"checkpoint_bytes_read_per_rank", lm.checkpoint_bytes_read},
                        {"rss_bytes_rank0", resident_bytes()}};
    AtomicWriter f(path, "--stats-json");
    f.write(j.dump(2) + "\n");
    f.commit();
}

// The context left after the prompt: an error when none is left for the tokens asked for, a
// warning when fewer than asked for fit (the output stops at the end of the context).
void check_room(const Built& lm, int64_t prompt_tokens, int64_t max_new_tokens) {
    const int64_t ctx = lm.model->max_seq(), room = ctx - prompt_tokens;
    if (max_new_tokens == 0 || prompt_tokens > ctx) return;  // nothing asked for / the generator refuses it
    LATTICE_CHECK(room > 0,
                  "the prompt of {} tokens fills the whole context of {} positions: no room for new tokens (shorten "
                  "it, or raise --max-seq up to max_position_embeddings {})",
                  prompt_tokens, ctx, lm.model->config().max_position);
    if (room < max_new_tokens && lm.world.rank == 0)
        LOG_WARN(
            "the context of {} positions leaves room for {} of the {} new tokens asked for after the prompt of {} "
            "tokens: the output stops there",
            ctx, room, max_new_tokens, prompt_tokens);
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool chat, const std::string& system) {
    if (!chat) return tok.encode(text, tok.add_bos_default(), false);
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", text});
    LATTICE_CHECK(tok.chat_template_kind() != ChatTemplateKind::kNone,
                  "--chat: the model's tokenizer ({}) has no recognised chat template", tok.source());
    // The rendered template spells special tokens (and the BOS text, where the family has one).
    return tok.encode(tok.chat_template().render(msgs, true), false, true);
}

}  // namespace

void add_generate_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<GenerateArgs>();
    auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt");
    args->model.add_to(cmd);
    cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, e.g. 1,2,3");
    cmd->add_option("--prompt", args->prompt, "Prompt text (tokenized with the model's tokenizer)");
    cmd->add_flag("--chat", args->chat, "Wrap --prompt in the model's chat template as a user turn");
    cmd->add_option("--system", args->system, "System message for --chat")->needs("--chat");
    cmd->add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate")->check(int_range(0, INT32_MAX));
    cmd->add_option("--temperature", args->temperature, "0: greedy")->check(real_range(0.0, 1e6));
    cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0: all)")->check(int_range(0, INT32_MAX));
    cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass (1: all)")->check(real_range(1e-6, 1.0));
    cmd->add_option("--seed", args->seed, "Sampling seed")->check(uint_range(0, UINT64_MAX));
    cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-sequence token");
    cmd->add_flag("--print-ids", args->print_ids, "Print generated ids, space-separated, on one line");
    cmd->add_option("--stats-json", args->stats_json, "Write timings as JSON to this file");
    cmd->add_option("--batch", args->batch, "Generate this many sequences of the prompt at once (pipelined decode)")
        ->check(CLI::Range(1, 1024));
    cmd->callback([&run, args] {
        run = [args] {
            GenerateArgs& a = *args;
            GenerateRequest req;
            LATTICE_CHECK(a.prompt.empty() != a.prompt_ids.empty(), "give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
            if (a.model.model.empty() && !a.model.random_weights) a.model.model = default_model_path();
            if (!a.stats_json.empty())
                prepare_output_file(a.stats_json, "--stats-json", {a.model.model, a.model.smooth});
            std::unique_ptr<Tokenizer> tok;
            if (!a.prompt.empty()) {
                LATTICE_CHECK(!a.model.random_weights, "--prompt needs a model with a tokenizer (use --prompt-ids)");
                tok = load_tokenizer(a.model.model);
                req.prompt = encode_prompt(*tok, a.prompt, a.chat, a.system);
                req.stop_ids = tok->eog_ids();
            } else {
                LATTICE_CHECK(!a.chat, "--chat needs --prompt TEXT");
                req.prompt = parse_id_list(a.prompt_ids, "--prompt-ids");
            }
            LATTICE_CHECK(!req.prompt.empty(), "the prompt is empty");
            req.max_new_tokens = a.max_new_tokens;
            req.sampling = SamplingParams{a.temperature, a.top_k, a.top_p, a.seed};
            req.sampling.validate();
            req.ignore_eos = a.ignore_eos;
            Built lm = load_model(a.model);
            check_room(lm, int64_t(req.prompt.size()), req.max_new_tokens);
            if (a.batch > 1) {
                std::vector<GenerateRequest> reqs(static_cast<size_t>(a.batch), req);
                GenerateStats total;
                std::vector<GenerateResult> rs = lm.engine->generate_batch(reqs, {}, &total);
                if (lm.world.rank == 0) {
                    for (const auto& r : rs) {
                        if (tok && !a.print_ids)
                            write_stdout(tok->decode(r.tokens) + "\n");
                        else
                            write_stdout(fmt::format("{}\n", fmt::join(r.tokens, " ")));
                    }
                    flush_stdout();
                    print_stats(total);
                    if (!a.stats_json.empty()) write_stats(a.stats_json, total, lm, a.model);
                }
                return 0;
            }
            const bool stream_text = tok && !a.print_ids && lm.world.rank == 0;
            std::unique_ptr<StreamDecoder> stream;
            if (stream_text) stream = std::make_unique<StreamDecoder>(*tok);
            GenerateResult res = lm.engine->generate(req, [&](int32_t id) {
                if (!stream || (!a.ignore_eos && (lm.model->config().is_eos(id) || tok->is_eog(id)))) return;
                write_stdout(stream->push(id));
                flush_stdout();
            });
            if (lm.world.rank == 0) {
                if (stream)
                    write_stdout(stream->finish() + "\n");
                else
                    write_stdout(fmt::format("{}\n", fmt::join(res.tokens, " ")));
                flush_stdout();
                print_stats(res.stats);
                if (!a.stats_json.empty()) write_stats(a.stats_json, res.stats, lm, a.model);
            }
            return 0;
        };
    });
}

}  // namespace lattice
