// Options shared by every command that loads a model (generate, score, serve ...) and their
// translation into the builder's options (the builder makes the rank's backend, model and layout,
// runtime/builder/load.h; launch/ prints what it reports); the range checks
// every numeric flag uses; checked writes to stdout; output files prepared before a run.
#pragma once

#include "runtime/builder/build.h"
#include "runtime/builder/load.h"
#include "runtime/tokenizer/tokenizer.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

struct ModelArgs {
    std::string model;
    std::string config_preset;  // --config NAME with --random-weights
    bool random_weights = false;
    uint64_t weight_seed = 1234;
    std::string quant = "auto";
    bool quant_head = false;
    std::string smooth;  // SmoothQuant factor file from `lattice calibrate`
    bool verify = false;  // converted checkpoint: check this rank's file's SHA-256 before loading
    int threads = 0;
    bool mlock = false;
    int64_t max_seq = 0;
    int64_t max_batch_tokens = 256;
    int tp = 1, pp = 1;
    std::string pp_layers;  // "20,20,21,19"
    int64_t micro_batch = 0;
    double comm_timeout = 60.0;
    double start_timeout = 600.0;
    bool no_shm_comm = false;
    double kv_cache_gb = 0;       // 0: the builder's default (runtime/builder/build.h)
    std::string kv_cache_dtype = "auto";  // runtime/backend/backend.h KvDtype
    std::string speculative = "none";     // none | ngram (runtime/engine/speculative.h)
    int64_t num_speculative_tokens = 4;
    bool num_speculative_given = false;   // --num-speculative-tokens on the command line (needs --speculative)
    int64_t max_seqs = 64;
    double max_itl_ms = -1;       // latency target of a step with decodes; -1: the device's default
    int64_t block_size = 16;
    bool no_prefix_cache = false;
    bool enforce_eager = false;
    std::string device = "auto";  // auto | cpu | cuda | sim
    std::string sim_gpu = "a100-pcie-40gb", sim_link = "pcie4";  // --device sim (sim_device.h)
    double sim_step_ms = 0;
    std::string dtype;            // --dtype: CUDA f16 | bf16 (empty: bf16), CPU f32 | bf16 (empty: f32)
    std::string devices;          // CUDA ordinals per local rank, e.g. 0,1,2,3
    // LoRA adapters (docs/lora.md): --lora NAME=PATH (or PATH: named by its last component), registered on
    // rank 0 once the model is loaded; --max-loras resident at once, --max-lora-rank the largest rank.
    std::vector<std::string> loras;
    int64_t max_loras = 4;
    int64_t max_lora_rank = 64;

    void add_to(CLI::App* cmd);
    // The adapter generate and chat run with: the one --lora's name, "" without; an Error for several.
    std::string run_lora(const char* command) const;

private:
    void add_engine_options(CLI::App* cmd);
    void add_layout_options(CLI::App* cmd);
};

// Builds this rank's model from the options (runtime/builder/load.h: checked and, under an MPI
// starter, agreed on by every rank first); MPI joins when tp * pp > 1 or when an MPI starter
// launched this process (read from the environment here, in launch/).
// `on_context` runs once the rank grid exists, before any weight is read (`lattice serve` listens
// from there on, answering "loading").
RankRuntime load_model(const ModelArgs& a, const std::function<void(const WorldConfig&)>& on_context = {});
// "NAME=PATH" -> {NAME, PATH}; "PATH" -> {its last component, PATH}.
std::pair<std::string, std::string> parse_lora_flag(const std::string& flag);

// --dtype for the backend b.kind reaches: CUDA f16 | bf16 (default bf16), CPU f32 | bf16 (default f32); the other
// one refused by name; "" keeps the defaults (generate, serve, batch and info's estimate).
void apply_dtype(BackendOptions& b, const std::string& dtype);

// Command-line output settings (main.cpp's global --verbose / --quiet).
// verbose: errors keep their [host rank file:line] origin and every failing rank prints its own line.
// quiet: INFO logs and load progress off (warnings and errors stay).
struct OutputSettings {
    bool verbose = false;
    bool quiet = false;
};
OutputSettings& output_settings();

// ---- One line per error, also under MPI ---------------------------------------------------------
// An error that every rank meets (a bad argument, a missing or malformed model, a layout the model
// cannot take) is printed once, by rank 0, and every rank exits with the same code after finalizing
// MPI. The ranks agree (parallel/rank_agreement.h; launch/ only prints the line) at one point,
// before the first collective after MPI start-up: the load of a model (load_model: the builder's
// checked load, runtime/builder/load.h, once the checkpoint was opened and checked) or, for a rank
// that failed before it, main()'s error path; a command that needs no model agrees when it ends.
// Only a failure on some ranks alone, later, is printed by its rank and aborts the job.
//
// Thrown on every rank once the ranks agreed on a failure (the builder's AgreedFailure): rank 0 has
// printed the one line; main() only finalizes MPI and exits with `code`.
using ReportedFailure = AgreedFailure;
// The number of ranks the MPI starter launched (1 without one).
int launcher_world_size();
// True when an MPI starter (mpirun, srun with PMI/PMIx) launched this process: the command then
// joins the MPI world. In a build without MPI an Error when the starter launched several ranks
// (each would do the whole job alone), else false.
bool started_by_mpi();
// True until this process passed (or gave up) the agreement: an error now can still be agreed on.
bool failure_agreement_open();
// This rank's share of the agreement (parallel/rank_agreement.h agree_on_failure): code 0 (fine) or
// the exit code and one-line message of its failure (`detail`: the same with its origin, printed
// with --verbose). Initializes MPI when it is not yet. Returns the agreed code (0: no rank failed),
// having printed the culprit's line on rank 0, or -1 when the peers did not answer within the hang
// guard (then the caller reports alone and aborts).
int agree_and_report_failure(int code, const std::string& message, const std::string& detail);
// One error line on stderr: "lattice: <kind>: <message>" (--verbose: the detailed form).
void print_error_line(const char* kind, const std::string& message, const std::string& detail);

// The built-in default model (SmolLM2-135M-Instruct Q4_1, fetched by scripts/setup.sh into models/):
// $LATTICE_DEFAULT_MODEL, else ./models/..., else <source tree>/models/...; Error if none exists.
std::string default_model_path();

// "1,2,3" or "1 2 3" -> ids; throws Error naming the bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const char* what);

// CLI11 checks naming the flag and its range ("--threads: -1 is not an integer in [0, 65536]").
// Parsing is strict (std::from_chars / strtod: no sign on unsigned values, no wrap-around, nothing
// after the number, finite reals), unlike CLI11's own conversion, which lets "-1" into a uint64.
CLI::Validator int_range(int64_t lo, int64_t hi);
CLI::Validator uint_range(uint64_t lo, uint64_t hi);
CLI::Validator real_range(double lo, double hi);
constexpr int kMaxThreadsFlag = 65536;  // --threads bound (then capped at the usable cores)
// Every --tp and --pp flag's check: [1, kMaxTp] and [1, kMaxPp] (parallel/world_config.h, whose
// check_layout_sizes is the library's one check of the same bounds).
CLI::Validator tp_flag_range();
CLI::Validator pp_flag_range();

// Threads for a CPU backend: `requested` (0: all usable cores) capped, with a warning, at the cores
// this process may run on: more threads than cores only slows every op down.
int usable_threads(int requested);

// Writes to stdout; throws Error naming stdout when the bytes cannot be written (a full disk, a
// closed descriptor). flush_stdout() also reports what a buffered write met.
void write_stdout(std::string_view s);
void flush_stdout();
// Diagnostics to stderr: a failed write is ignored (there is nowhere left to report it), never thrown.
void print_stderr(std::string_view s);
template <typename... Args>
void print_stdout(fmt::format_string<Args...> f, Args&&... args) {
    write_stdout(fmt::format(f, std::forward<Args>(args)...));
}

// This process's rank as the MPI starter announced it in the environment (0 without one): the rank
// that prepares output files before MPI is initialized.
int launcher_rank();
// On the launcher's rank 0: checks that `path` may be written atomically (absent or a regular file)
// and is none of the run's `inputs` (files, or folders whose files count), then removes a previous
// file there (base/file.h prepare_output). `flag` names it in errors.
// The model's tokenizer for the commands that can run without one (batch, serve: prompts as token
// ids): null for random weights, or with a warning "<who>: no tokenizer (why): <without>" when the
// model has none.
std::unique_ptr<Tokenizer> optional_tokenizer(const ModelArgs& a, const char* who, const char* without);
void prepare_output_file(const std::string& path, const char* flag, const std::vector<std::string>& inputs);
// The identity part alone (for an output that is appended to, not replaced): PATH is a writable
// output path and names none of INPUTS (a file, or a file directly inside a folder, hard links too).
// `appended`: the output is appended to in place (the refusal of a symlink or FIFO says so).
void check_not_input(const std::string& path, const char* flag, const std::vector<std::string>& inputs,
                     bool appended = false);

}  // namespace lattice
