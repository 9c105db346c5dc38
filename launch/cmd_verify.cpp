// `lattice verify DIR [--threads N]`: checks the manifest's own content first (its seal,
// runtime/weights/manifest.h), then every file the manifest lists (size, then SHA-256; files hashed in
// parallel threads), and prints one line per file, the manifest first. Exit 0 when all are intact, 1
// when the manifest was edited or any file is missing, truncated or corrupt (each named), as for any
// error. A manifest without a seal (an older conversion) is said to be unchecked, never "intact"; the
// exit is 0 then when every file is intact (what can be checked holds).
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
    cmd->add_option("-t,--threads", args->threads, "Files hashed at once (0: one per core, at most 8)")
        ->check(int_range(0, kMaxThreadsFlag));
    cmd->footer(R"(Examples:
  lattice verify conv/
  lattice verify --threads 2 /models/llama-70b-tp8/)");
    cmd->callback([&run, args] {
        run = [args] {
            const auto t0 = SteadyClock::now();
            std::atomic<int64_t> bytes{0};
            const ConvertedVerdict cv =
                verify_converted(args->dir, args->threads, [&](int64_t n) { bytes += n; });
            const std::vector<FileVerdict>& v = cv.files;
            int bad = 0;
            if (cv.manifest.ok) {
                print_stdout("ok       manifest.json (its content matches its manifest_sha256)\n");
            } else if (!cv.sealed) {
                print_stdout("UNCHECKED manifest.json: {}\n", cv.manifest.problem);
            } else {
                ++bad;
                print_stdout("CORRUPT  manifest.json: {}\n", cv.manifest.problem);
            }
            for (const auto& f : v) {
                if (f.ok) {
                    print_stdout("ok       {}\n", f.path);
                } else {
                    ++bad;
                    print_stdout("CORRUPT  {}: {}\n", f.path, f.problem);
                }
            }
            const double s = seconds_since(t0);
            const size_t files = v.size() + (cv.sealed ? 1 : 0);  // the manifest counts when it can be checked
            print_stdout("{}: {} of {} files intact{} ({:.2f} GiB hashed in {:.1f} s)\n", args->dir,
                         files - size_t(bad), files,
                         cv.sealed ? "" : "; manifest.json unchecked (no manifest_sha256)", to_gib(double(bytes.load())),
                         s);
            flush_stdout();
            LATTICE_CHECK(bad == 0, "{}: {} corrupt or missing file(s), listed above", args->dir, bad);
            return 0;
        };
    });
}

}  // namespace lattice
