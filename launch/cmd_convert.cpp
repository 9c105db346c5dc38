// `lattice convert --model M --out DIR --tp N --pp M --quant none|w8a16|w8a8|w4a16|w4a8|auto [--quant-head]
//                 [--kv-cache-dtype D] (the folder's default KV cache, in the manifest)
// [--smooth FILE] [--pp-layers a,b,..] [--progress auto|bar|lines|none] [--lora [NAME=]PATH [--lora-scale S]]`:
// a pre-sharded checkpoint,
// one file per rank, already quantized (runtime/converter/convert.h). Under mpirun the ranks convert in
// parallel (rank r writes files r, r + W, ...); any number of ranks works, one included.
// Progress (rank 0): a bar with bytes, rate and ETA on a terminal, a line every 5 s and per file
// otherwise. --lora merges one adapter into the weights before they are sharded and quantized
// (runtime/converter/lora_merge.h). The last line gives the folder, sizes, time and the peak resident memory (VmHWM).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "base/clock.h"
#include "base/log.h"
#include "base/memory.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/drain_signal.h"
#include "parallel/parallel_context.h"
#include "parallel/world_session.h"
#include "runtime/builder/build.h"
#include "runtime/converter/convert.h"

namespace lattice {

namespace {

struct ConvertArgs {
    std::string model, out, quant = "auto", smooth, pp_layers, progress = "auto", kv_cache_dtype = "auto", lora;
    int tp = 1, pp = 1;
    double lora_scale = 1.0;
    bool quant_head = false;
    double comm_timeout = 600;
};

std::string gib_text(int64_t b) {
    return fmt::format("{:.2f} GiB", to_gib(double(b)));
}

class Bar {
public:
    explicit Bar(const std::string& mode, bool quiet) {
        tty_ = mode == "bar" || (mode == "auto" && ::isatty(2));
        off_ = mode == "none" || quiet;
    }
    void update(const ConvertProgress& p) {
        if (off_) return;
        const double t = seconds_since(start_);
        const bool file_done = p.files_done != files_done_;
        files_done_ = p.files_done;
        if (!file_done && t - last_ < (tty_ ? 0.2 : 5.0)) return;
        last_ = t;
        const double rate = t > 0 ? double(p.bytes_done) / t : 0;
        const double left = rate > 0 ? double(p.bytes_total - p.bytes_done) / rate : 0;
        const std::string eta = fmt::format("{}:{:02}", int64_t(left) / 60, int64_t(left) % 60);
        if (tty_) {
            const int width = 30;
            const int fill = p.bytes_total > 0 ? int(width * double(p.bytes_done) / double(p.bytes_total)) : width;
            print_stderr(fmt::format("\r[{}{}] {} / {}  {:.1f} MB/s  ETA {}  file {}/{}  ", std::string(size_t(fill), '#'),
                       std::string(size_t(width - fill), '.'), gib_text(p.bytes_done), gib_text(p.bytes_total), rate / 1e6, eta,
                       p.files_done, p.files_total));
        } else {
            print_stderr(fmt::format("convert: {} / {} ({:.1f} MB/s, ETA {}), {} of {} files{}\n", gib_text(p.bytes_done),
                       gib_text(p.bytes_total), rate / 1e6, eta, p.files_done, p.files_total,
                       file_done ? ", finished " + p.file : ""));
        }
        std::fflush(stderr);
    }
    void end() {
        if (tty_ && !off_) print_stderr("\n");
    }

private:
    SteadyClock::time_point start_ = SteadyClock::now();
    double last_ = -1e9;
    int files_done_ = 0;
    bool tty_ = false, off_ = false;
};

int run_convert(const ConvertArgs& args) {
    // Several ranks only under an MPI starter; every rank then takes files of its own.
    ParallelContext ctx = make_local_context();
    if (started_by_mpi()) {  // never true in a build without MPI
        ctx = make_parallel_context(join_world().size, 1, args.comm_timeout);
        report_dead_peers_on_termination();
        if (ctx.world.rank != 0) set_log_level(LogLevel::kWarn);
    }
    ConvertOptions o;
    o.out = args.out;
    o.tp = args.tp;
    o.pp = args.pp;
    if (!args.pp_layers.empty())
        for (int32_t v : parse_id_list(args.pp_layers, "--pp-layers")) o.pp_layers.push_back(v);
    o.smooth_path = args.smooth;
    o.source_path = args.model;
    o.writer = "lattice 0.1.0";
    if (!args.lora.empty()) {
        const auto [name, path] = parse_lora_flag(args.lora);
        o.lora_name = name;
        o.lora_path = path;
        o.lora_scale = args.lora_scale;
    }
    ModelSpec spec;
    spec.path = args.model;
    std::unique_ptr<TensorSource> src = open_spec(spec);
    // As a CPU load with --quant auto would run it (auto_quant): W4A8 for a 4-bit checkpoint (GGUF Q4, AWQ,
    // GPTQ; its 4-bit linears kept as stored), W8A8 with an int8 head for another quantized one, else float.
    const QuantChoice quant = args.quant == "auto" ? auto_quant(*src, args.quant_head, int4_mode_for(BackendKind::kCpu))
                                                   : QuantChoice{parse_quant_mode(args.quant), args.quant_head};
    o.quant = quant.quant;
    o.quant_head = quant.quant_head;
    o.kv_cache_dtype = args.kv_cache_dtype;
    Bar bar(args.progress, ctx.world.rank != 0);
    o.on_progress = [&bar](const ConvertProgress& p) { bar.update(p); };
    install_drain_handlers();  // SIGTERM / SIGINT / SIGUSR1 stop it cleanly: no partial folder is left
    o.interrupted = [] { return drain_requested() != 0; };
    LOG_INFO("convert: {} -> {} (tp {} x pp {}, quant {}{}{}{}) on {} process(es)", src->describe(), args.out,
             args.tp, args.pp, quant_mode_name(o.quant), o.quant_head ? ", int8 head" : "",
             args.smooth.empty() ? "" : ", smoothed", o.lora_path.empty() ? "" : ", LoRA " + o.lora_path + " merged",
             ctx.world.world);
    ConvertResult r = convert_checkpoint(*src, o, *ctx.world_comm);
    bar.end();
    if (ctx.world.rank == 0) {
        int64_t total = 0;
        for (const auto& f : r.manifest.files) total += f.bytes;
        print_stdout("converted {} -> {}: {} files, {} in {:.1f} s; peak resident memory {:.0f} MiB (rank 0)\n",
                   src->describe(), r.folder, r.manifest.files.size() + 1, gib_text(total), r.seconds,
                   double(peak_resident_bytes()) / (1 << 20));
    }
    return 0;
}

}  // namespace

void add_convert_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<ConvertArgs>();
    auto* cmd = app.add_subcommand("convert", "Write a pre-sharded, pre-quantized checkpoint: one file per rank");
    cmd->add_option("-m,--model", args->model, "HF model directory or .gguf file")->required();
    cmd->add_option("--out", args->out, "Folder to create (must not exist)")->required();
    cmd->add_option("--tp", args->tp, "Tensor-parallel ranks of the layout")->check(tp_flag_range());
    cmd->add_option("--pp", args->pp, "Pipeline stages of the layout")->check(pp_flag_range());
    cmd->add_option("--pp-layers", args->pp_layers, "Layers per pipeline stage, e.g. 20,20,21,19");
    cmd->add_option("--quant", args->quant,
                    "none | w8a16 | w8a8 | w4a16 | w4a8 | auto (w4a8 for a 4-bit checkpoint: GGUF Q4_0 / Q4_1 / "
                    "Q4_K, AWQ, GPTQ; w8a8 with an int8 head for a Q8 GGUF; none otherwise)")
        ->check(CLI::IsMember({"auto", "none", "w8a16", "w8a8", "w4a16", "w4a8"}));
    cmd->add_flag("--quant-head", args->quant_head, "Quantize the LM head too");
    cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                    "The KV cache runs of the folder use unless they say otherwise: auto | f32 | f16 | bf16 | int8")
        ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "int8"}))
        ->capture_default_str();
    cmd->add_option("--smooth", args->smooth, "SmoothQuant factors (lattice calibrate) to fold into the weights");
    cmd->add_option("--lora", args->lora,
                    "[NAME=]PATH: a LoRA adapter (PEFT folder or GGUF LoRA file) merged into the weights (W + s B A, "
                    "before quantization)");
    cmd->add_option("--lora-scale", args->lora_scale, "Multiplies the adapter's scale (lora_alpha / r) when merged")
        ->check(real_range(-1e6, 1e6));
    cmd->add_option("--progress", args->progress, "auto (a bar on a terminal, lines otherwise) | bar | lines | none")
        ->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
    cmd->add_option("--comm-timeout", args->comm_timeout, "Seconds a rank waits for the others (under mpirun)")
        ->check(real_range(0.1, 7 * 24 * 3600.0));
    cmd->footer(R"(Examples:
  lattice convert --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out conv/ --tp 3 --quant w8a8
  mpirun -np 3 --oversubscribe lattice convert --model /models/llama-2-7b --out conv7b/ --tp 3
  lattice convert --model /models/llama-2-7b --lora /adapters/sql-lora --out conv7b-sql/ --quant w8a8
  lattice verify conv/)");
    cmd->callback([&run, args] { run = [args] { return run_convert(*args); }; });
}

}  // namespace lattice
