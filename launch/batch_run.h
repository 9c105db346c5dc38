// The engine side of `lattice batch` (launch/cmd_batch.cpp is the command: its arguments, the checks
// before the load, the summary and --stats-json; the file formats are described there).
//   BatchResultFile  the output file: one write per record, a partial last line cut on open, locked
//                    against a second job, and the ids it already holds (a rerun skips them)
//   BatchProgress    the progress bar (a terminal) or a line every 5 s (a log) on stderr
//   BatchRun         the input's lines through the engine client, each line's record written as its
//                    request finishes (completion order); stops admitting on a drain signal
//   BatchTotals      what the run did, for the summary line and --stats-json
// Invariants: only the leader rank builds these; every record written names the custom_id of its line
// (or "line-N"), and an id is written at most once per output (skipped when already there).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/file.h"

namespace lattice {

class EngineClient;

// What a batch run did, for the summary line and --stats-json.
struct BatchTotals {
    using Clock = std::chrono::steady_clock;
    int64_t total = 0, already = 0, done = 0, errors = 0, prompt_tokens = 0, gen_tokens = 0, abandoned = 0;
    int64_t duplicates = 0;  // lines skipped: their custom_id belongs to an earlier line
    int64_t requests() const { return total - duplicates; }  // distinct ids of the input
    std::vector<double> ttfts, queues;                       // per request: to its first token; in the engine's queue
    Clock::time_point first_admit{}, last_done{}, last_first_token{};
    double run_seconds() const {
        return first_admit == Clock::time_point{} ? 0 : std::chrono::duration<double>(last_done - first_admit).count();
    }
};

// The output file (base/file.h AppendFile: one write per line, a partial last line cut on open,
// locked against a second job) and the ids it already holds: read line by line, only the ids kept.
// A complete line that is not a record (a JSON object with "custom_id") cannot come from a crash (a
// crash tears only the last line, which is cut): the file was edited or damaged. The run refuses it,
// naming the line, rather than skip it: skipping would leave the line in the results for whoever
// reads them, and which request it held is unknown, so nothing here can repair it. Deleting the
// line and rerunning runs its request again. `restart`: every line is discarded instead (--restart).
class BatchResultFile {
public:
    BatchResultFile(const std::string& path, int64_t sync_lines, double sync_seconds, bool restart);
    const std::set<std::string>& done() const { return done_; }
    int64_t discarded() const { return discarded_; }  // lines emptied by `restart`
    int64_t cut_bytes() const { return file_.cut_bytes(); }
    void write(const nlohmann::json& line);  // one record; its "custom_id" joins done()
    void sync_if_due() { file_.sync_if_due(); }
    void close() { file_.close(); }

private:
    void read_line(std::string_view l, int64_t no);
    std::set<std::string> done_;
    std::vector<int64_t> bad_lines_;  // the first ten
    bool restart_ = false;
    int64_t discarded_ = 0;
    AppendFile file_;  // last: its constructor calls read_line
};

// `mode`: "auto" (a bar on a terminal, else lines), "bar", "lines" or "none".
class BatchProgress {
public:
    BatchProgress(const std::string& mode, int64_t total);
    void update(int64_t done, int64_t errors, int64_t tokens, bool force = false);
    void end();

private:
    int64_t total_;
    bool tty_ = false, off_ = false;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    double last_ = -1e9;
};

// The input file's requests through the engine client, results to the output file as they finish.
// `model` is the served name (a line's "model" must match it, as in serve); `vocab` bounds token ids.
class BatchRun {
public:
    BatchRun(EngineClient& client, const std::string& input, BatchResultFile& out, int64_t vocab, std::string model);
    ~BatchRun();
    const BatchTotals& totals() const;
    // Until the input is done (or drained) and nothing runs.
    void run(double drain_seconds, BatchProgress& progress);
    // Every input line has its output record (or repeats an earlier line's id). A drain that came just
    // as the last line was admitted leaves only blanks (or nothing) unread: that is complete too.
    bool complete();

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace lattice
