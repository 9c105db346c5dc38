// lattice executable entry: parse the command line, run the chosen command, turn every
// lattice::Error into one line on stderr and a non-zero exit.
// One line per error, also under MPI: a command-line error is printed by the launcher's rank 0 only
// (every rank has the same argv); any other error the ranks meet before their first collective is
// agreed on (cli_common.h agree_and_report_failure, parallel/rank_agreement.h) and printed once by
// rank 0, and every rank exits with the same code after finalizing MPI. An error on some ranks only,
// later, is printed by its rank and aborts the job (parallel/world_session.h abort_world) so nobody
// waits forever on a dead peer. MPI itself stays behind parallel/world_session.h. The line carries
// the message alone; --verbose adds the origin ([host rank/world file:line]) and lets every rank
// print its own.
// Exit codes: 0 success; 1 an error in the input, the files or the run (lattice::Error, one line
// "lattice: error: ..."); 2 a bad command line (one line naming the flag and "see lattice CMD
// --help"); 3 an internal error (a bug: every input is meant to give 1 or 2). A command whose stdout
// cannot be written (full disk, closed descriptor) exits 1 naming stdout. Under MPI, 69: a rank whose
// abort of the job did not end it within 10 s (launcher or MPI daemon unreachable) exited by itself
// (parallel/world_session.h abort_world).
#include "kernels/cpu/int8_gemm.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sched_slice.h"
#include "parallel/world_session.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>

namespace {

// A closed stdin/stdout/stderr would let the next open() take its number, and the output meant for
// the terminal would go into a model file or an output file. Each closed one gets /dev/null opened
// read-only: writes to it fail (EBADF) as they would on the closed descriptor, and are reported.
void occupy_closed_std_fds() {
    for (int fd = 0; fd <= 2; ++fd) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        const int n = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

// Exits quietly once the ranks agreed: the launcher may SIGTERM the ranks still finalizing when the
// first exits non-zero, and the termination reporter's lines would only repeat the error.
int exit_agreed(int code) {
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGHUP, SIG_DFL);
    lattice::finalize_world();
    return code;
}

int fail(const char* kind, const std::string& message, const std::string& detail, int code) {
    if (lattice::failure_agreement_open()) {
        const int agreed = lattice::agree_and_report_failure(code, message, detail);
        if (agreed > 0) return exit_agreed(agreed);
        // -1: the peers did not answer (they are past the agreement point): report alone and abort.
    }
    lattice::print_error_line(kind, message, detail);
    lattice::abort_world(code);
    lattice::finalize_world();
    return code;
}

// "see lattice generate --help" for the subcommand that was being parsed.
std::string help_hint(const CLI::App* app) {
    std::string name = "lattice";
    for (const CLI::App* a = app; a != nullptr;) {
        const auto subs = a->get_subcommands();
        if (subs.empty()) break;
        a = subs.front();
        name += " " + a->get_name();
    }
    return "see " + name + " --help";
}

// The process-wide settings from the environment, before any command runs (kernels/ never reads the env).
void apply_environment() {
    // LATTICE_ISA=scalar|avx2|avxvnni|avx512|amx pins the one CPU ISA level every CPU kernel family obeys
    // (GEMMs, attention, elementwise; kernels/cpu/isa.h).
    if (const char* isa = std::getenv("LATTICE_ISA"); isa && *isa)
        lattice::set_isa_override(lattice::parse_isa(isa));
    // LATTICE_SCHED_SLICE_US: the scheduler slice lattice's threads ask for (base/sched_slice.h).
    if (const char* v = std::getenv("LATTICE_SCHED_SLICE_US"); v && *v) {
        uint64_t ns = 0;
        LATTICE_CHECK(lattice::parse_sched_slice_us(v, ns),
                      "LATTICE_SCHED_SLICE_US={}: expected a number of microseconds from 0 to 1000000", v);
        lattice::set_sched_slice_ns(ns);
    }
    // LATTICE_INT8_GEMM=auto|own|onednn: who runs the W8A8 GEMMs at m >= 16 (kernels/cpu/int8_gemm.h).
    if (const char* p = std::getenv("LATTICE_INT8_GEMM"); p && *p)
        lattice::set_int8_provider(lattice::parse_int8_provider(p));
}

}  // namespace

int main(int argc, char** argv) {
    occupy_closed_std_fds();
    CLI::App app{"lattice: Llama-family inference across tensor- and pipeline-parallel ranks"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "lattice 0.1.0");
    app.fallthrough();  // the global flags below work after the subcommand too
    // Every option's help line states its default (subcommands inherit these option defaults).
    app.option_defaults()->always_capture_default();
    lattice::OutputSettings& out = lattice::output_settings();
    app.add_flag("-v,--verbose", out.verbose,
                 "Errors with their origin ([host rank/world file:line]), printed by every rank that meets one");
    app.add_flag("-q,--quiet", out.quiet, "No progress or INFO lines on stderr (warnings and errors stay)");
    // A command-line error is one line naming the flag (see the ParseError catch below, not CLI11's
    // two-line default).
    lattice::CommandRun run;
    lattice::add_generate_command(app, run);
    lattice::add_chat_command(app, run);
    lattice::add_score_command(app, run);
    lattice::add_info_command(app, run);
    lattice::add_tokenize_command(app, run);
    lattice::add_doctor_command(app, run);
    lattice::add_calibrate_command(app, run);
    lattice::add_layout_command(app, run);
    lattice::add_plan_command(app, run);
    lattice::add_batch_command(app, run);
    lattice::add_serve_command(app, run);
    lattice::add_convert_command(app, run);
    lattice::add_verify_command(app, run);
    // An option without a value by default says so, rather than showing nothing (--model says what
    // it falls back to where it does: the built-in model).
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        for (CLI::Option* o : sub->get_options())
            if (!o->get_type_name().empty() && !o->get_required() && !o->get_positional() &&
                o->get_default_str().empty())
                o->default_str("none");  // flags (no type name) show none: they are off unless given
    int rc = 1;
    try {
        try {
            app.parse(argc, argv);
        } catch (const CLI::ParseError& e) {
            if (e.get_exit_code() != 0) {
                // Like every other error: under MPI the ranks agree and rank 0 prints the one line
                // (a rank exiting at once could make the launcher kill rank 0 before it printed).
                const std::string msg = fmt::format("{} ({})", e.what(), help_hint(&app));
                return fail("error", msg, msg, 2);
            }
            app.exit(e);  // --help / --version
            lattice::flush_stdout();
            return 0;
        }
        if (out.quiet) lattice::set_log_level(lattice::LogLevel::kWarn);
        // Errors met before MPI starts name the rank the launcher gave this process (MPI sets the same).
        lattice::process_identity().rank = lattice::launcher_rank();
        lattice::process_identity().world = lattice::launcher_world_size();
        apply_environment();
        rc = run ? run() : 1;
        lattice::flush_stdout();  // what a command printed must have reached its file
    } catch (const lattice::ReportedFailure& f) {
        return exit_agreed(f.code);
    } catch (const lattice::Error& e) {
        return fail("error", e.message(), e.what(), 1);
    } catch (const std::bad_alloc&) {
        return fail("error", "out of memory", "out of memory", 1);
    } catch (const std::filesystem::filesystem_error& e) {  // a backstop: its message names the path
        return fail("error", e.what(), e.what(), 1);
    } catch (const std::exception& e) {
        return fail("internal error", e.what(), e.what(), 3);
    }
    // A command that loaded no model meets its peers here: a rank that failed early waits for them.
    if (lattice::failure_agreement_open())
        if (const int agreed = lattice::agree_and_report_failure(0, "", ""); agreed > 0) return exit_agreed(agreed);
    lattice::finalize_world();
    return rc;
}
