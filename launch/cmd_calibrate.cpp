// `lattice calibrate --model M --text FILE --out smooth.safetensors [--alpha 0.5] [--max-tokens N]`:
// SmoothQuant factors (runtime/model/smoothquant.h) from the activation maxima of a float forward over a
// text. The text is tokenized with the model's tokenizer and run in independent windows of
// --window tokens (each from position 0, no LM head); the weight column maxima are read from the
// checkpoint itself, so the factors belong to the original (unsmoothed) weights.
// Single rank, CPU, fp32 (the builder's make_local_model): calibration is an offline step; the
// resulting file is then loaded by every rank of any TP x PP layout (each applies the factors of its
// own layers).
#include <algorithm>
#include <chrono>
#include <iterator>
#include <memory>

#include "launch/cli.h"
#include "launch/cli_common.h"
#include "base/file.h"
#include "base/log.h"
#include "runtime/builder/build.h"
#include "runtime/model/smoothquant.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

constexpr int64_t kMaxTextBytes = 256ll << 20;

std::string read_text(const std::string& path) {
    std::string s = read_regular_file(path, kMaxTextBytes, "calibrate: --text");
    LATTICE_CHECK(!s.empty(), "calibrate: text file {} is empty", path);
    return s;
}

struct CalibrateArgs {
    std::string model, text, out;
    double alpha = 0.5;
    int64_t max_tokens = 8192;
    int64_t window = 512;
    int64_t max_batch_tokens = 256;
    int threads = 0;
};

int run_calibrate(const CalibrateArgs& args) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string model_path = args.model.empty() ? default_model_path() : args.model;
    LATTICE_CHECK(args.alpha >= 0.0 && args.alpha <= 1.0, "calibrate: --alpha {} outside [0, 1]", args.alpha);
    LATTICE_CHECK(args.max_tokens >= 1 && args.window >= 1, "calibrate: --max-tokens and --window must be >= 1");
    prepare_output_file(args.out, "--out", {model_path, args.text});
    auto src = open_model(model_path);
    auto tok = load_tokenizer(model_path);
    std::vector<int32_t> ids = tok->encode(read_text(args.text), tok->add_bos_default());
    LATTICE_CHECK(!ids.empty(), "calibrate: {} encodes to no tokens", args.text);
    if (int64_t(ids.size()) > args.max_tokens) ids.resize(size_t(args.max_tokens));
    for (int32_t id : ids)
        LATTICE_CHECK(id >= 0 && id < src->config().vocab,
                      "calibrate: tokenizer of {} produced id {} outside the "
                      "model's vocab {}",
                      model_path, id, src->config().vocab);

    BackendOptions bo;
    bo.kind = BackendKind::kCpu;
    bo.threads = usable_threads(args.threads);
    ModelOptions model_opt;  // float: the maxima of the original weights' activations
    model_opt.max_seq = std::min<int64_t>(args.window, src->config().max_position);
    model_opt.max_batch_tokens = args.max_batch_tokens;
    const LocalModel local = make_local_model(*src, bo, model_opt);
    const auto t1 = std::chrono::steady_clock::now();
    ActivationStats stats = collect_activation_stats(*local.model, ids, model_opt.max_seq);
    const auto t2 = std::chrono::steady_clock::now();
    SmoothFactors f = compute_smooth_factors(*src, stats, args.alpha);
    write_smooth_factors(args.out, f);
    const auto t3 = std::chrono::steady_clock::now();

    float lo = kMaxSmooth, hi = kMinSmooth;
    for (const auto* v : {&f.attn, &f.mlp})
        for (const auto& layer : *v)
            for (float s : layer) lo = std::min(lo, s), hi = std::max(hi, s);
    auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
    LOG_INFO(
        "calibrate: {} tokens of {} in windows of {} through {} ({} layers); alpha {}; factors in [{:.4g}, "
        "{:.4g}]; wrote {}; load {:.2f} s, forward {:.2f} s ({:.0f} tokens/s), factors {:.2f} s",
        ids.size(), args.text, model_opt.max_seq, model_path, f.attn.size(), args.alpha, lo, hi, args.out,
        secs(t1 - t0), secs(t2 - t1), double(ids.size()) / std::max(1e-9, secs(t2 - t1)), secs(t3 - t2));
    return 0;
}

}  // namespace

void add_calibrate_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<CalibrateArgs>();
    auto* cmd = app.add_subcommand("calibrate", "Compute SmoothQuant smoothing factors from a calibration text");
    cmd->add_option("-m,--model", args->model, "HF model directory or .gguf file (default: the built-in SmolLM2)")
        ->default_str("built-in");
    cmd->add_option("--text", args->text, "Calibration text file (UTF-8)")->required();
    cmd->add_option("--out", args->out, "Output .safetensors (model.layers.N.{attn,mlp}_smooth, f32 [hidden])")
        ->required();
    cmd->add_option("--alpha", args->alpha, "Migration strength: s = max|X|^alpha / max|W|^(1-alpha)")
        ->check(real_range(0.0, 1.0));
    cmd->add_option("--max-tokens", args->max_tokens, "Use at most this many tokens of the text")
        ->check(int_range(1, INT32_MAX));
    cmd->add_option("--window", args->window, "Tokens per independent forward window (context length)")
        ->check(int_range(1, INT32_MAX));
    cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Tokens per forward pass within a window")
        ->check(int_range(1, 1 << 20));
    cmd->add_option("-t,--threads", args->threads, "CPU threads (0: one per available core; capped at those)")
        ->check(int_range(0, kMaxThreadsFlag));
    cmd->footer(R"(Examples:
  lattice calibrate --text README.md --out smooth.safetensors --max-tokens 512
  lattice generate --quant w8a8 --smooth smooth.safetensors --prompt "Hello"
  lattice calibrate --model /models/llama-2-7b --text calib.txt --out smooth7b.safetensors --alpha 0.8)");
    cmd->callback([&run, args] { run = [args] { return run_calibrate(*args); }; });
}

}  // namespace lattice
