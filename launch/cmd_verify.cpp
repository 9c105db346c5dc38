// `lattice verify DIR [--threads N]`: checks every file a converted checkpoint's manifest lists
// (size, then SHA-256; files hashed in parallel threads) and prints one line per file. Exit 0 when
// all are intact, 1 when any is missing, truncated or corrupt (each named), as for any error.
#include <fmt/format.h>

#include <atomic>
#include <memory>

#include "base/clock.h"
#include "base/error.h"
#include "base/memory.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "runtime/weights/converted_source.h"

namespace lattice {

void add_verify_command(CLI::App& app, CommandRun& run) {
    struct Args {
        std::string dir;
        int threads = 0;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = app.add_subcommand("verify", "Check every file of a converted checkpoint against its manifest");
    cmd->add_option("dir", args->dir, "Converted checkpoint folder (lattice convert --out)")->required();
    cmd->add_option("--threads", args->threads, "Files hashed at once (0: one per core, at most 8)")
        ->check(int_range(0, kMaxThreadsFlag));
    cmd->footer(R"(Examples:
  lattice verify conv/
  lattice verify --threads 2 /models/llama-70b-tp8/)");
    cmd->callback([&run, args] {
        run = [args] {
            const auto t0 = SteadyClock::now();
            std::atomic<int64_t> bytes{0};
            const std::vector<FileVerdict> v =
                verify_converted(args->dir, args->threads, [&](int64_t n) { bytes += n; });
            int bad = 0;
            for (const auto& f : v) {
                if (f.ok) {
                    print_stdout("ok       {}\n", f.path);
                } else {
                    ++bad;
                    print_stdout("CORRUPT  {}: {}\n", f.path, f.problem);
                }
            }
            const double s = seconds_since(t0);
            print_stdout("{}: {} of {} files intact ({:.2f} GiB hashed in {:.1f} s)\n", args->dir, v.size() - size_t(bad),
                       v.size(), to_gib(double(bytes.load())), s);
            flush_stdout();
            LATTICE_CHECK(bad == 0, "{}: {} corrupt or missing file(s), listed above", args->dir, bad);
            return 0;
        };
    });
}

}  // namespace lattice
