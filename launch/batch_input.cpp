// The side file that binds a batch output to its input, and the ids of input lines; see batch_input.h
// for the rules.
#include "launch/batch_input.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/file.h"
#include "runtime/weights/sha256.h"

namespace lattice {

namespace batch_input_detail {

using nlohmann::json;

constexpr char kFormat[] = "lattice-batch-input";
constexpr int kVersion = 1;
constexpr int64_t kMaxSideBytes = int64_t(1) << 16;

// What the side file records: the input's first `bytes` bytes, their line count and hash.
struct Fingerprint {
    std::string input;
    int64_t bytes = 0, lines = 0;
    std::string sha256;
};

// One pass over the input: the hash of its first `prefix` bytes (with their line count, their last
// byte and the byte after them; -1 where there is none) and of all of it.
struct Scan {
    Fingerprint prefix, whole;
    int last_byte = -1, next_byte = -1;
};

int64_t count_lines(const char* p, size_t n, int64_t lines_so_far, bool& ends_in_newline) {
    if (n == 0) return lines_so_far;
    const int64_t nl = int64_t(std::count(p, p + n, '\n'));
    // A line is counted at its first byte: lines_so_far counts newline-terminated lines plus an open one.
    const int64_t open_before = ends_in_newline ? 0 : 1;
    ends_in_newline = p[n - 1] == '\n';
    return lines_so_far - open_before + nl + (ends_in_newline ? 0 : 1);
}

Scan scan_input(const std::string& path, int64_t prefix) {
    FileDescriptor fd = open_regular_file(path, "--input");
    Sha256 all, pre;
    std::vector<char> buf(size_t(1) << 20);
    int64_t at = 0, lines = 0, pre_lines = 0;
    bool nl_end = true, pre_nl_end = true;
    Scan s;
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        LATTICE_CHECK(n >= 0, "--input {}: read failed ({})", path, std::strerror(errno));
        if (n == 0) break;
        all.update(buf.data(), size_t(n));
        lines = count_lines(buf.data(), size_t(n), lines, nl_end);
        if (at < prefix) {
            const size_t k = size_t(std::min<int64_t>(n, prefix - at));
            pre.update(buf.data(), k);
            pre_lines = count_lines(buf.data(), k, pre_lines, pre_nl_end);
        }
        if (at <= prefix && prefix < at + n) s.next_byte = static_cast<unsigned char>(buf[size_t(prefix - at)]);
        if (at < prefix && prefix <= at + n) s.last_byte = static_cast<unsigned char>(buf[size_t(prefix - 1 - at)]);
        at += n;
    }
    s.whole = {path, at, lines, sha256_hex(all.finish())};
    s.prefix = {path, std::min(at, prefix), pre_lines, sha256_hex(pre.finish())};
    return s;
}

void write_side(const std::string& side, const Fingerprint& f) {
    const json j = {{"format", kFormat}, {"version", kVersion}, {"input", f.input},
                    {"bytes", f.bytes},   {"lines", f.lines},     {"sha256", f.sha256}};
    AtomicWriter w(side, "--output's input fingerprint");
    w.write(j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    w.commit(true);  // on the disk before any result of the run
}

// What to do, the same in every refusal.
std::string remedy(const std::string& output, bool edited) {
    return fmt::format("{} a new --output, or add --restart to discard the results in {} and run every line again "
                       "(lines only appended at the end of the input resume)",
                       edited ? "run the edited input with" : "use", output);
}

Fingerprint read_side(const std::string& side, const std::string& output) {
    const std::string text = read_regular_file(side, kMaxSideBytes, "--output's input fingerprint");
    const json j = json::parse(text, nullptr, false);
    auto int_at = [&](const char* k) { return j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 0; };
    const bool ok = j.is_object() && j.value("format", "") == kFormat && j.contains("version") &&
                    j["version"] == kVersion && int_at("bytes") && int_at("lines") && j.contains("sha256") &&
                    j["sha256"].is_string() && is_sha256_hex(j["sha256"].get<std::string>());
    LATTICE_CHECK(ok,
                  "{}: not a lattice batch input fingerprint of version {} (edited or damaged): which input the "
                  "results in {} came from cannot be told; {}",
                  side, kVersion, output, remedy(output, false));
    Fingerprint f;
    f.input = j.contains("input") && j["input"].is_string() ? j["input"].get<std::string>() : "?";
    f.bytes = j["bytes"].get<int64_t>();
    f.lines = j["lines"].get<int64_t>();
    f.sha256 = j["sha256"].get<std::string>();
    return f;
}

// The ids: a scan of the top-level members of a line that parses only the custom_id value.
size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
    return i;
}

// One past the closing quote of the string opening at s[i]; npos when the line ends first.
size_t string_end(std::string_view s, size_t i) {
    for (++i; i < s.size(); ++i) {
        if (s[i] == '\\')
            ++i;
        else if (s[i] == '"')
            return i + 1;
    }
    return std::string_view::npos;
}

// One past the value starting at s[i] (not validated: brackets matched, strings skipped); npos when
// the line ends first.
size_t value_end(std::string_view s, size_t i) {
    if (i >= s.size()) return std::string_view::npos;
    if (s[i] == '"') return string_end(s, i);
    if (s[i] == '{' || s[i] == '[') {
        int64_t depth = 0;
        for (; i < s.size(); ++i) {
            const char c = s[i];
            if (c == '"') {
                i = string_end(s, i);
                if (i == std::string_view::npos) return i;
                --i;
            } else if (c == '{' || c == '[') {
                ++depth;
            } else if ((c == '}' || c == ']') && --depth == 0) {
                return i + 1;
            }
        }
        return std::string_view::npos;
    }
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\r' && s[i] != '\n')
        ++i;
    return i;
}

// The line's top-level "custom_id" (the last, as a JSON parser keeps it), or a discarded value.
json find_custom_id(std::string_view s) {
    constexpr size_t kMaxIdBytes = 4096;
    json found(json::value_t::discarded);
    size_t i = skip_ws(s, 0);
    if (i >= s.size() || s[i] != '{') return found;
    ++i;
    for (;;) {
        i = skip_ws(s, i);
        if (i >= s.size() || s[i] != '"') return found;
        const size_t key_end = string_end(s, i);
        if (key_end == std::string_view::npos) return found;
        const json key = json::parse(s.substr(i, key_end - i), nullptr, false);
        i = skip_ws(s, key_end);
        if (i >= s.size() || s[i] != ':') return found;
        i = skip_ws(s, i + 1);
        const size_t end = value_end(s, i);
        if (end == std::string_view::npos) return found;
        if (key.is_string() && key.get<std::string>() == "custom_id") {
            found = end - i <= kMaxIdBytes ? json::parse(s.substr(i, end - i), nullptr, false) : json();
            if (found.is_discarded()) found = nullptr;  // a value, not JSON: the caller's error record says so
        }
        i = skip_ws(s, end);
        if (i >= s.size() || s[i] != ',') return found;
        ++i;
    }
}

}  // namespace batch_input_detail

nlohmann::json batch_line_id(std::string_view line, int64_t line_no) {
    using nlohmann::json;
    json id = batch_input_detail::find_custom_id(line);
    return id.is_discarded() ? json(fmt::format("line-{}", line_no)) : id;
}

void check_batch_ids(const std::string& input) {
    using nlohmann::json;
    FileDescriptor fd = open_regular_file(input, "--input");
    std::unordered_map<std::string, int64_t> first_line;  // id as JSON text -> its line
    std::vector<char> buf(size_t(1) << 20);
    std::string line;
    int64_t line_no = 0;
    bool open = false;  // a line has begun and not ended
    auto finish_line = [&]() {
        ++line_no;
        open = false;
        if (line.find_first_not_of(" \t\r") == std::string::npos) return line.clear();
        const json id = batch_line_id(line, line_no);
        line.clear();
        if (!id.is_string() && !id.is_number_integer()) return;  // an error record of its own
        const auto [it, fresh] = first_line.emplace(id.dump(), line_no);
        LATTICE_CHECK(fresh,
                      "--input {}: lines {} and {} both have the id {}{}; results are keyed by id (a rerun skips "
                      "the ids already in --output), so one of the two would never run: give every line its own "
                      "\"custom_id\"",
                      input, it->second, line_no, id.dump(),
                      id.is_string() && id.get<std::string>().rfind("line-", 0) == 0
                          ? " (\"line-N\" is also the id of a bare body on line N, a line without \"custom_id\")"
                          : "");
    };
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        LATTICE_CHECK(n >= 0, "--input {}: read failed ({})", input, std::strerror(errno));
        if (n == 0) break;
        for (size_t at = 0; at < size_t(n);) {
            const char* nl = static_cast<const char*>(std::memchr(buf.data() + at, '\n', size_t(n) - at));
            const size_t end = nl ? size_t(nl - buf.data()) : size_t(n);
            if (line.size() < kBatchLineKeepBytes)
                line.append(buf.data() + at, std::min(end - at, kBatchLineKeepBytes - line.size()));
            open = true;
            at = end;
            if (nl) {
                finish_line();
                ++at;
            }
        }
    }
    if (open) finish_line();
}

std::string batch_input_file(const std::string& output) { return output + ".input"; }

BatchInputBinding bind_batch_input(const std::string& input, const std::string& output, bool has_results) {
    using namespace batch_input_detail;
    check_batch_ids(input);
    const std::string side = batch_input_file(output);
    BatchInputBinding b;
    if (!has_results) {  // nothing to mix with: this input's fingerprint, whatever an old side file said
        write_side(side, scan_input(input, 0).whole);
        b.fresh = true;
        return b;
    }
    LATTICE_CHECK(path_kind(side, "--output's input fingerprint") != PathKind::kMissing,
                  "--output {} holds results but there is no {} beside it, the fingerprint of the input they came "
                  "from (deleted, or the output was written by an older lattice): whether --input {} is that input, "
                  "unchanged, cannot be told; {}",
                  output, side, input, remedy(output, false));
    const Fingerprint old = read_side(side, output);
    const Scan s = scan_input(input, old.bytes);
    std::string what;
    if (s.whole.bytes < old.bytes)
        what = fmt::format("it has {} bytes, fewer than the {} ({} line(s)) those results came from", s.whole.bytes,
                           old.bytes, old.lines);
    else if (s.prefix.sha256 != old.sha256)
        what = fmt::format("its first {} bytes ({} line(s)), which those results came from, are not the same any more "
                           "(a line inserted, edited or removed)",
                           old.bytes, old.lines);
    // The old last line had no newline: bytes after it extend that line unless a newline comes first.
    else if (s.last_byte >= 0 && s.last_byte != '\n' && s.next_byte >= 0 && s.next_byte != '\n')
        what = fmt::format("its line {}, the last of those results' input, which had no newline, was extended",
                           old.lines);
    LATTICE_CHECK(what.empty(),
                  "--input {} is not the input the results in --output {} came from ({} records {}: {} bytes, {} "
                  "line(s)): {}. Resuming would keep those results under ids that may now name other requests (a bare "
                  "body's \"line-N\" moves with every line inserted above it) and never run the requests that took "
                  "their place; {}",
                  input, output, side, old.input, old.bytes, old.lines, what, remedy(output, true));
    if (s.whole.bytes > old.bytes) {
        b.appended_lines = s.whole.lines - old.lines;
        write_side(side, s.whole);
    }
    return b;
}

}  // namespace lattice
