// Binds a `lattice batch` output to the input its results came from, so that a
// rerun after the input was edited cannot mix results: results are keyed by id, and a bare body's id
// "line-N" moves with every line inserted above it, so the old results would be kept under ids that
// now name other requests and the requests that took their place would never run.
// The binding is a side file beside the output, OUTPUT.input (the output itself stays pure OpenAI
// Batch output, one record per line, as its readers expect):
//   {"format": "lattice-batch-input", "version": 1, "input": "the --input path as given",
//    "bytes": N, "lines": L, "sha256": "64 hex: SHA-256 of the input's N bytes"}
// Invariant: every record in OUTPUT came from a request in the first N bytes of an input whose bytes
// hash to "sha256". The side file is written (atomically, synced) before a run appends anything, and
// rewritten only after a check that keeps the invariant.
// On a run whose output already holds results, the input must still start with exactly those N bytes
// (and a last line that had no newline must not have been extended): lines appended at the END then
// run too (the ids of the lines already run still name the same requests); anything else (a line
// inserted, edited or removed, the file shortened, another file) is refused naming both files and
// saying what to do (a new --output, or --restart to discard the results). An output with results
// but no side file (its fingerprint deleted, or written by a lattice before it existed) is refused
// the same way: which input its results came from cannot be told. The content counts, not the path:
// the input may be moved or renamed. The input must not change while a job runs (it is read twice:
// fingerprinted here, then line by line).
//
// Ids. A line's id is its top-level "custom_id" whenever it has one, whatever else is wrong with the
// line (no "body", not JSON after the id, too long or too deep to parse: the id is found by a scan
// of the top-level members, not by parsing the line), else "line-N" (N its 1-based line number).
// Within an input every id is unique: a custom_id repeated, or one equal to the "line-N" of a line
// without a custom_id, refuses the whole input before the model loads, naming both lines. Refused
// rather than renamed because results are keyed by id (a rerun skips the ids already in the
// output), so two lines with one id would share one record and one of them would silently never
// run; OpenAI's Batch API refuses such a file at upload too. So every input line yields exactly one
// output record, under its own custom_id when it has one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lattice {

// OUTPUT.input
std::string batch_input_file(const std::string& output);

struct BatchInputBinding {
    bool fresh = false;         // the output held no results: the side file was (re)written for this input
    int64_t appended_lines = 0; // lines the input gained at its end since the results' run (they run now)
};

// Checks --input against the output's side file and (re)writes it; Error naming the input, the output
// and the side file when the results cannot be resumed from this input. `has_results`: the output
// holds at least one record.
// Also refuses an input whose ids are not unique (check_batch_ids), first.
BatchInputBinding bind_batch_input(const std::string& input, const std::string& output, bool has_results);

// The id of one input line as read (`line`: its first bytes when it is longer than the reader keeps):
// its top-level "custom_id" value (parsed; null when that value is not a JSON scalar of at most 4 KiB),
// else "line-N".
nlohmann::json batch_line_id(std::string_view line, int64_t line_no);

// Error naming both lines and the id when two non-blank lines of the input have the same string or
// integer id. Lines are read as `lattice batch` reads them: split at '\n', blank ones (only spaces,
// tabs, '\r') skipped but counted, at most kBatchLineKeepBytes of each looked at.
constexpr size_t kBatchLineKeepBytes = (size_t(8) << 20) + 1;  // batch_run.cpp's kKeepBytes
void check_batch_ids(const std::string& input);

}  // namespace lattice
