// Shared model-loading options and setup (see cli_common.h).
#include "launch/cli_common.h"

#include "base/file.h"
#include "base/log.h"
#include "base/clock.h"
#include "kernels/cpu/thread_pool.h"
#include "parallel/rank_agreement.h"
#include "parallel/world_session.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace lattice {

void ModelArgs::add_to(CLI::App* cmd) {
    cmd->add_option("-m,--model", model,
                    "HF model directory (config.json + safetensors), .gguf file, or a folder from lattice convert "
                    "(default: the built-in SmolLM2-135M-Instruct)")
        ->default_str("built-in");
    cmd->add_flag("--verify", verify,
                  "Converted checkpoint: check the SHA-256 of each rank's file before loading it (sizes always are)");
    cmd->add_flag("--random-weights", random_weights, "Fabricate weights of the model's shape from --seed-weights");
    cmd->add_option("--config", config_preset, "Built-in shape for --random-weights (tinyllama-1.1b, llama-2-7b, "
                                               "llama-2-70b, llama-3-8b, llama-3-70b, mixtral-8x7b, "
                                               "mixtral-tiny-8x1.1b)");
    cmd->add_option("--seed-weights", weight_seed, "Seed for --random-weights")->check(uint_range(0, UINT64_MAX));
    cmd->add_option("--quant", quant,
                    "Linear layers: auto | none | w8a16 | w8a8 | w4a16 | w4a8 (auto: for a checkpoint that is already "
                    "quantized, a 4-bit one (GGUF Q4_0/Q4_1/Q4_K(_M), AWQ, GPTQ) as w4a8 on the CPU and w4a16 on CUDA, "
                    "else w8a8, with --quant-head; none otherwise)")
        ->check(CLI::IsMember({"auto", "none", "w8a16", "w8a8", "w4a16", "w4a8"}));
    cmd->add_flag("--quant-head", quant_head, "Quantize the LM head too (embedding stays float)");
    cmd->add_option("--smooth", smooth,
                    "SmoothQuant factors from lattice calibrate (.safetensors), folded into the weights at load");
    cmd->add_option("-t,--threads", threads, "CPU threads per rank (0: one per available core; capped at those)")
        ->check(int_range(0, kMaxThreadsFlag));
    cmd->add_flag("--mlock", mlock, "Lock weights in memory");
    cmd->add_option("--max-seq", max_seq,
                    fmt::format("KV cache positions per sequence (0: min(max_position_embeddings, {}))", kDefaultMaxSeq))
        ->check(int_range(0, INT32_MAX));
    add_engine_options(cmd);
}

// The engine's options: steps, KV cache, speculative decoding, scheduling.
void ModelArgs::add_engine_options(CLI::App* cmd) {
    cmd->add_option("--max-batch-tokens", max_batch_tokens,
                    "Prompt tokens per step (the prompt chunk); each step also holds one decode token per running "
                    "sequence")
        ->check(int_range(1, 1 << 20));
    cmd->add_option("--kv-cache-gb", kv_cache_gb,
                    "KV cache per rank in GiB (0: 90% of free GPU memory after weights; CPU: min(2, 10% of available "
                    "memory))")
        ->check(real_range(0, 1 << 20));
    cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                    "KV cache elements: auto (the activation dtype: f32 on CPUs) | f32 | f16 | bf16 | int8 (one scale per "
                    "token and KV head: about half the bytes of f16, a quarter of f32)")
        ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "int8"}))
        ->capture_default_str();
    cmd->add_option("--speculative", speculative,
                    "Speculative decoding: none | ngram (prompt lookup: drafts copied from where the sequence's last "
                    "tokens occurred before) | draft:PATH (a small model of the same vocabulary drafts greedily, on "
                    "rank 0's CPU); the model checks the drafts in one step, its output distribution unchanged")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                if (v == "none" || v == "ngram" || (v.rfind("draft:", 0) == 0 && v.size() > 6)) return {};
                return "expected none, ngram or draft:PATH";
            },
            "none|ngram|draft:PATH"))
        ->capture_default_str();
    cmd->add_option("--num-speculative-tokens", num_speculative_tokens,
                    "Drafts per decoding sequence per step with --speculative (refused without it)")
        ->check(int_range(1, kMaxSpeculativeTokens))
        ->each([this](const std::string&) { num_speculative_given = true; })
        ->capture_default_str();
    cmd->add_option("--max-itl-ms", max_itl_ms,
                    "Latency target of a step that holds decodes, in ms: such a step takes fewer prompt tokens, as "
                    "many as the measured cost per token allows (at least 16); 0: none, the whole --max-batch-tokens "
                    "(default: 250 on CPUs, 50 on GPUs; lattice batch: 0, throughput first)")
        ->check(real_range(0, 1e7));
    cmd->add_option("--max-seqs", max_seqs, "Sequences running at once (continuous batching)")
        ->check(int_range(1, 1 << 16));
    cmd->add_option("--block-size", block_size, "KV cache positions per block")->check(int_range(1, 1 << 16));
    cmd->add_option("--lora", loras,
                    "LoRA adapter NAME=PATH (a PEFT folder or a llama.cpp GGUF LoRA file), applied unmerged; repeatable. "
                    "serve / batch: requests pick one by \"model\"; generate / chat: run with it (one)");
    cmd->add_option("--max-loras", max_loras, "LoRA adapters resident at once (least recently used ones leave)")
        ->check(int_range(1, 4095))
        ->capture_default_str();
    cmd->add_option("--max-lora-rank", max_lora_rank, "Largest LoRA rank accepted")
        ->check(int_range(1, 1 << 16))
        ->capture_default_str();
    cmd->add_flag("--no-prefix-cache", no_prefix_cache, "Do not reuse cached KV blocks of identical prompt prefixes");
    cmd->add_flag("--enforce-eager", enforce_eager,
                  "Run every step eagerly: no CUDA graphs for decode steps (on CUDA they are captured per batch-size "
                  "bucket by default; CPU runs eagerly anyway)");
    add_layout_options(cmd);
}

// Layout and device options.
void ModelArgs::add_layout_options(CLI::App* cmd) {
    cmd->add_option("--tp", tp, "Tensor-parallel ranks")->check(tp_flag_range());
    cmd->add_option("--pp", pp, "Pipeline-parallel stages")->check(pp_flag_range());
    cmd->add_option("--pp-layers", pp_layers, "Layers per pipeline stage, e.g. 20,20,21,19");
    cmd->add_option("--micro-batch", micro_batch, "Prompt tokens per pipeline micro-batch step (0: --max-batch-tokens)")
        ->check(int_range(0, 1 << 20));
    cmd->add_option("--comm-timeout", comm_timeout, "Seconds before a silent peer is declared dead (0.1 .. 1 week)")
        ->check(real_range(0.1, 7 * 86400.0));
    cmd->add_option("--start-timeout", start_timeout,
                    "Seconds the ranks wait for each other at start-up: creating their communicators and at the end "
                    "of every rank's model load (at least --comm-timeout; 0.1 .. 1 week)")
        ->check(real_range(0.1, 7 * 86400.0));
    cmd->add_flag("--no-shm-comm", no_shm_comm,
                  "CPU ranks on one machine all-reduce and all-gather through MPI instead of shared memory (for "
                  "comparison; default: shared memory)");
    cmd->add_option("--device", device,
                    "auto (CUDA when built with it and a GPU exists) | cpu | cuda | sim (simulated GPUs: the engine "
                    "and communication for real, each forward the planner's predicted time, no weights)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda", "sim"}));
    cmd->add_option("--sim-gpu", sim_gpu, "--device sim: the GPU simulated (a `lattice plan --gpu` name)")
        ->capture_default_str();
    cmd->add_option("--sim-link", sim_link, "--device sim: the link between its GPUs (a `lattice plan` link)")
        ->capture_default_str();
    cmd->add_option("--sim-step-ms", sim_step_ms, "--device sim: every stage step takes this long instead (0: predicted)")
        ->check(real_range(0, 1e6));
    cmd->add_option("--dtype", dtype,
                    "Compute type: CUDA f16 | bf16 (default bf16, the activations); CPU f32 | bf16 (default f32; bf16: "
                    "float linears rounded to bf16 and multiplied in bf16 pairs, the KV cache bf16 under "
                    "--kv-cache-dtype auto)")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}));
    cmd->add_option("--devices", devices, "CUDA device of each local rank, e.g. 0,1,2,3 (default: local rank)");
}

CLI::Validator int_range(int64_t lo, int64_t hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            int64_t v = 0;
            const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
                return fmt::format("{} is not an integer in [{}, {}]", s, lo, hi);
            return {};
        },
        fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator uint_range(uint64_t lo, uint64_t hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            uint64_t v = 0;
            const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
                return fmt::format("{} is not an integer in [{}, {}]", s, lo, hi);
            return {};
        },
        fmt::format("UINT in [{}, {}]", lo, hi));
}

CLI::Validator real_range(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            errno = 0;
            char* end = nullptr;
            const double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
            if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v < lo || v > hi)
                return fmt::format("{} is not a number in [{}, {}]", s, lo, hi);
            return {};
        },
        fmt::format("NUMBER in [{}, {}]", lo, hi));
}

CLI::Validator tp_flag_range() { return int_range(1, kMaxTp); }
CLI::Validator pp_flag_range() { return int_range(1, kMaxPp); }

int usable_threads(int requested) {
    const int cores = ThreadPool::available_cpus();
    if (requested <= cores) return requested;
    LOG_WARN("--threads {} is more than the {} cores this process may run on: using {}", requested, cores, cores);
    return cores;
}

void write_stdout(std::string_view s) {
    if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size())
        LATTICE_FAIL("stdout: write failed ({})", std::strerror(errno));
}

void flush_stdout() {
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        LATTICE_FAIL("stdout: write failed ({})", std::strerror(errno ? errno : EIO));
}

void print_stderr(std::string_view s) {
    if (std::fwrite(s.data(), 1, s.size(), stderr) != s.size()) std::clearerr(stderr);
}

int launcher_rank() {
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
        if (const char* v = std::getenv(var)) return std::atoi(v);
    return 0;
}

std::unique_ptr<Tokenizer> optional_tokenizer(const ModelArgs& args, const char* who, const char* without) {
    if (args.random_weights) return nullptr;
    try {
        return load_tokenizer(args.model);
    } catch (const Error& e) {
        LOG_WARN("{}: no tokenizer ({}): {}", who, e.message(), without);
        return nullptr;
    }
}

void check_not_input(const std::string& path, const char* flag, const std::vector<std::string>& inputs,
                     bool appended) {
    check_output_path(path, flag, appended);
    struct stat out {};
    if (::stat(path.c_str(), &out) == 0) {
        // Removing (or later replacing) an input would destroy what the run reads: a model file named
        // as --out, or model.safetensors inside the model folder.
        auto same = [&](const std::string& p) {
            struct stat in {};
            return ::stat(p.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino;
        };
        for (const std::string& in : inputs) {
            if (in.empty()) continue;
            bool hit = same(in);
            if (!hit && path_kind(in, "input") == PathKind::kDirectory)
                if (DIR* d = ::opendir(in.c_str())) {
                    while (const dirent* e = ::readdir(d))
                        if (!hit && e->d_name[0] != '.') hit = same(in + "/" + e->d_name);
                    ::closedir(d);
                }
            LATTICE_CHECK(!hit, "{} {} is an input of this run ({}): refusing to overwrite it", flag, path, in);
        }
    }
}

void prepare_output_file(const std::string& path, const char* flag, const std::vector<std::string>& inputs) {
    if (launcher_rank() != 0) return;
    check_not_input(path, flag, inputs);
    prepare_output(path, flag);
}

std::vector<int32_t> parse_id_list(const std::string& s, const char* what) {
    std::vector<int32_t> ids;
    std::string tok;
    std::stringstream ss(s);
    auto flush = [&] {
        if (tok.empty()) return;
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(tok, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        LATTICE_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "{}: \"{}\" is not an integer in [0, {}]", what,
                      tok, INT32_MAX);
        ids.push_back(int32_t(v));
        tok.clear();
    };
    for (char c : s) {
        if (c == ',' || c == ' ' || c == '\t' || c == '\n') flush();
        else tok.push_back(c);
    }
    flush();
    return ids;
}

OutputSettings& output_settings() {
    static OutputSettings s;
    return s;
}

int launcher_world_size() {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
        if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
    if (std::getenv("PMIX_RANK"))
        if (const char* v = std::getenv("SLURM_NTASKS")) return std::max(1, std::atoi(v));
    return 1;
}

bool started_by_mpi() {
    if (!kBuiltWithMpi) {
        // Without MPI every process would run alone: several started by mpirun would each do the whole job.
        if (const int n = launcher_world_size(); n > 1)
            LATTICE_FAIL("started as one of {} MPI ranks, but this lattice was built without MPI: run it alone", n);
        return false;
    }
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
}

void print_error_line(const char* kind, const std::string& message, const std::string& detail) {
    print_stderr(fmt::format("lattice: {}: {}\n", kind, output_settings().verbose ? detail : message));
    std::fflush(stderr);
}

namespace {
bool g_agreement_open = true;
}  // namespace

bool failure_agreement_open() { return g_agreement_open && launcher_world_size() > 1; }

int agree_and_report_failure(int code, const std::string& message, const std::string& detail) {
    g_agreement_open = false;
    const bool verbose = output_settings().verbose;
    if (code != 0 && verbose) print_error_line(code == 3 ? "internal error" : "error", message, detail);
    const RankAgreement v = agree_on_failure(code, message);
    if (v.peers_silent()) return -1;
    if (v.failed() && v.own_rank == 0 && !verbose)
        print_error_line(v.code == 3 ? "internal error" : "error",
                         v.failed_rank == 0 ? v.message : fmt::format("rank {}: {}", v.failed_rank, v.message),
                         detail);
    return v.code;
}

std::string default_model_path() {
    const char* kName = "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (const char* env = std::getenv("LATTICE_DEFAULT_MODEL")) return env;
    for (const std::string& dir : {std::string("models"), std::string(LATTICE_SOURCE_DIR) + "/models"}) {
        std::string p = dir + "/" + kName;
        if (path_kind(p, "default model") != PathKind::kMissing) return p;
    }
    LATTICE_FAIL("no --model given and the built-in default model {} is not in ./models or {}/models: run "
                 "scripts/setup.sh (it fetches it) or pass --model",
                 kName, LATTICE_SOURCE_DIR);
}

namespace {

// "20,20,21,19" -> layer counts; Error naming --pp-layers and the bad entry.
std::vector<int64_t> parse_counts(const std::string& s) {
    std::vector<int64_t> out;
    std::string tok;
    std::stringstream ss(s);
    while (std::getline(ss, tok, ',')) {
        int64_t v = 0;
        const auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
        LATTICE_CHECK(ec == std::errc() && p == tok.data() + tok.size() && v >= 1 && v <= 1024,
                      "--pp-layers {}: \"{}\" is not a layer count in [1, 1024] (give one count per stage, e.g. "
                      "20,20,21,19)",
                      s, tok);
        out.push_back(v);
    }
    LATTICE_CHECK(!out.empty(), "--pp-layers: give one layer count per stage, e.g. 20,20,21,19");
    return out;
}

}  // namespace

// Load progress on rank 0: on a terminal one line redrawn in place ("\r") a few times a second,
// otherwise (a log file, a pipe) one line every 5 s, so a fast load prints nothing; off with --quiet.
std::function<void(const LoadProgress&)> load_progress_printer() {
    if (output_settings().quiet) return {};
    struct State {
        SteadyClock::time_point start = SteadyClock::now(), last = SteadyClock::now();
        bool tty = ::isatty(2) == 1;
        bool drawn = false;
    };
    auto st = std::make_shared<State>();
    return [st](const LoadProgress& p) {
        if (process_identity().rank != 0 || log_level_ref() > LogLevel::kInfo) return;
        const auto now = SteadyClock::now();
        const bool done = p.tensors_done == p.tensors_total;
        const double since = std::chrono::duration<double>(now - st->last).count();
        if (done ? !st->drawn : since < (st->tty ? 0.25 : 5.0)) return;
        st->last = now;
        const double t = std::chrono::duration<double>(now - st->start).count();
        const double frac = p.elements_total > 0 ? double(p.elements_done) / double(p.elements_total) : 1.0;
        const double mib = double(p.bytes_read) / double(1 << 20);
        std::string line = fmt::format("loading: {:3.0f}% ({}/{} tensors, {:.1f}/{:.1f} M parameters), {:.0f} MiB read",
                                       100 * frac, p.tensors_done, p.tensors_total, double(p.elements_done) * 1e-6,
                                       double(p.elements_total) * 1e-6, mib);
        if (t > 0) line += fmt::format(" at {:.0f} MiB/s", mib / t);
        if (done)
            line += fmt::format(", {:.1f} s", t);
        else if (frac > 0.01)
            line += fmt::format(", ETA {:.0f} s", t * (1 - frac) / frac);
        st->drawn = true;
        if (st->tty)
            print_stderr(fmt::format("\r{:<100}{}", line, done ? "\n" : ""));
        else
            LOG_INFO("{}", line);  // a log line like the load's summary that follows
    };
}

void apply_dtype(BackendOptions& b, const std::string& dtype) {
    if (dtype.empty()) return;
    const BackendKind kind = resolve_backend_kind(b.kind);
    if (kind == BackendKind::kCuda) {
        LATTICE_CHECK(dtype != "f32", "--dtype f32: the CUDA backend computes in f16 or bf16");
        b.cuda_act = dtype == "f16" ? DType::kF16 : DType::kBF16;
    } else if (kind == BackendKind::kCpu) {
        LATTICE_CHECK(dtype != "f16",
                      "--dtype f16: the CPU backend computes in f32 or bf16 (f16 weights are widened to f32 exactly "
                      "by default)");
        b.cpu_bf16 = dtype == "bf16";
    }
}

// The flags as the builder's options (parsing only: what they mean is the builder's).
BuildOptions build_options(const ModelArgs& args) {
    BuildOptions opt;
    opt.quant_auto = args.quant == "auto";
    opt.model.quant = opt.quant_auto ? QuantMode::kNone : parse_quant_mode(args.quant);
    opt.model.quant_head = args.quant_head;
    opt.model.smooth_path = args.smooth;
    opt.model.max_seq = args.max_seq;
    opt.model.max_batch_tokens = args.max_batch_tokens;
    opt.model.block_size = args.block_size;
    opt.model.kv_dtype = parse_kv_dtype(args.kv_cache_dtype);
    opt.kv_cache_gb = args.kv_cache_gb;
    opt.engine.max_seqs = args.max_seqs;
    opt.engine.max_loras = args.max_loras;
    opt.engine.max_lora_rank = args.max_lora_rank;
    LATTICE_CHECK(!args.num_speculative_given || args.speculative != "none",
                  "--num-speculative-tokens needs --speculative ngram or draft:PATH (speculative decoding is off)");
    opt.engine.speculative_tokens = args.speculative != "none" ? args.num_speculative_tokens : 0;
    if (args.speculative.rfind("draft:", 0) == 0) opt.draft.path = args.speculative.substr(6);
    opt.max_itl_ms = args.max_itl_ms;
    opt.engine.prefix_caching = !args.no_prefix_cache;
    opt.engine.step_graphs = !args.enforce_eager;
    if (!args.pp_layers.empty()) opt.pp_layers = parse_counts(args.pp_layers);
    opt.micro_batch = args.micro_batch;
    opt.tp = args.tp;
    opt.pp = args.pp;
    // MPI only when asked for several ranks or launched by an MPI starter: a plain single-process
    // run neither pays for nor depends on MPI initialization.
    opt.mpi = started_by_mpi();
    opt.comm_timeout = args.comm_timeout;
    opt.start_timeout = args.start_timeout;
    opt.comm_shared_memory = !args.no_shm_comm;
    opt.backend.kind = parse_backend_kind(args.device);
    opt.sim = SimDeviceOptions{args.sim_gpu, args.sim_link, args.sim_step_ms};
    opt.backend.threads = usable_threads(args.threads);
    opt.model.on_progress = load_progress_printer();
    opt.backend.mlock = args.mlock;
    apply_dtype(opt.backend, args.dtype);
    if (!args.devices.empty())
        for (int32_t d : parse_id_list(args.devices, "--devices")) opt.devices.push_back(d);
    return opt;
}

std::pair<std::string, std::string> parse_lora_flag(const std::string& flag) {
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
        LATTICE_CHECK(eq > 0 && eq + 1 < flag.size(), "--lora {}: expected NAME=PATH", flag);
        return {flag.substr(0, eq), flag.substr(eq + 1)};
    }
    std::string p = flag;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return {p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1), flag};
}

std::string ModelArgs::run_lora(const char* command) const {
    LATTICE_CHECK(loras.size() <= 1, "{} runs with one adapter: give one --lora (serve and batch pick among several)",
                  command);
    return loras.empty() ? "" : parse_lora_flag(loras[0]).first;
}

RankRuntime load_model(const ModelArgs& args, const std::function<void(const WorldConfig&)>& on_context) {
    BuildOptions opt = build_options(args);
    ModelSpec spec{args.model, args.random_weights, args.config_preset, args.weight_seed, args.verify};
    if (!args.random_weights && spec.path.empty()) spec.path = default_model_path();
    // Under an MPI starter the builder checks the model and layout on every rank before MPI's first
    // collective and the ranks agree (a rank that failed earlier joins from main()); this front only
    // prints the verdict: one line from rank 0, the same exit code everywhere.
    LoadAgreement agreement;
    if (failure_agreement_open()) {
        agreement.world = launcher_world_size();
        agreement.rank = launcher_rank();
        agreement.agree = agree_and_report_failure;
    }
    opt.on_context = [on_context](const WorldConfig& w) {
        // When the launcher tears the job down because a rank died, say which one before exiting.
        if (w.world > 1) report_dead_peers_on_termination();
        if (w.rank != 0 || output_settings().quiet) set_log_level(LogLevel::kWarn);
        if (on_context) on_context(w);
    };
    RankRuntime rt = load(opt, spec, agreement);
    if (rt.engine->is_leader())
        for (const std::string& f : args.loras) {
            const auto [name, path] = parse_lora_flag(f);
            rt.engine->loras().add(name, path);
            LOG_INFO("LoRA adapter '{}' from {}", name, path);
        }
    return rt;
}

}  // namespace lattice
