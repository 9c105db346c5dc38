// Shared generate / chat options and prompt input (see generate_common.h).
#include "launch/generate_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/file.h"
#include "launch/cli_common.h"
#include "runtime/tokenizer/unicode.h"

namespace lattice {

void SamplingArgs::add_to(CLI::App* cmd) {
    cmd->add_option("--temperature", params.temperature, "Sampling temperature; 0: greedy (deterministic)")
        ->check(real_range(0.0, 1e6))
        ->capture_default_str();
    cmd->add_option("--top-k", params.top_k, "Keep the k most likely tokens (0: all)")
        ->check(int_range(0, INT32_MAX))
        ->capture_default_str();
    cmd->add_option("--top-p", params.top_p, "Nucleus sampling: the smallest set reaching this mass (1: all)")
        ->check(real_range(1e-6, 1.0))
        ->capture_default_str();
    cmd->add_option("--min-p", params.min_p, "Keep tokens with p >= min_p * p(most likely) (0: off)")
        ->check(real_range(0.0, 1.0))
        ->capture_default_str();
    seed_opt_ =
        cmd->add_option("--seed", params.seed, "Sampling seed (default: random, printed on stderr as `seed: N`)")
            ->check(uint_range(0, UINT64_MAX));
    cmd->add_option("--repeat-penalty", params.repeat_penalty,
                    "Divide positive / multiply negative logits of tokens among the last --repeat-last-n (1: off)")
        ->check(real_range(1e-6, 1e6))
        ->capture_default_str();
    cmd->add_option("--repeat-last-n", params.repeat_last_n,
                    "Tokens (prompt and output) the repetition penalty looks at (0: off, -1: the whole context)")
        ->check(int_range(-1, INT32_MAX))
        ->capture_default_str();
    cmd->add_option("--presence-penalty", params.presence_penalty,
                    "Subtract this from the logit of every token already generated (OpenAI's; -2..2)")
        ->check(real_range(-2.0, 2.0))
        ->capture_default_str();
    cmd->add_option("--frequency-penalty", params.frequency_penalty,
                    "Subtract this times the count of each token already generated (OpenAI's; -2..2)")
        ->check(real_range(-2.0, 2.0))
        ->capture_default_str();
    cmd->add_option("--stop", stop, "Stop at this text (repeatable); it and what follows are not shown (default: none)")
        ->allow_extra_args(false);
    cmd->add_option("--json-schema", json_schema,
                    "Structured output: the output is JSON valid under this schema (a file, or the schema itself)");
    cmd->add_flag("--json-object", json_object, "Structured output: the output is a JSON object");
    cmd->add_option("--regex", regex, "Structured output: the output matches this regular expression (whole)");
    cmd->add_option("--choice", choices, "Structured output: the output is one of these strings (repeatable)")
        ->allow_extra_args(false);
}

std::shared_ptr<const Grammar> SamplingArgs::grammar() const {
    GrammarSpec g;
    const char* flag = nullptr;
    int given = 0;
    if (!json_schema.empty()) {
        ++given;
        flag = "--json-schema";
        g.kind = GrammarSpec::Kind::kJsonSchema;
        g.source = json_schema.front() == '{' ? json_schema : read_prompt_file(json_schema, "--json-schema");
    }
    if (json_object) {
        ++given;
        flag = "--json-object";
        g.kind = GrammarSpec::Kind::kJsonObject;
    }
    if (!regex.empty()) {
        ++given;
        flag = "--regex";
        g.kind = GrammarSpec::Kind::kRegex;
        g.source = regex;
    }
    if (!choices.empty()) {
        ++given;
        flag = "--choice";
        g.kind = GrammarSpec::Kind::kChoice;
        g.choices = choices;
    }
    LATTICE_CHECK(given <= 1, "--json-schema, --json-object, --regex and --choice: give one");
    if (!given) return nullptr;
    try {
        return Grammar::compile(g);
    } catch (const Error& e) {
        throw Error(fmt::format("{}: {}", flag, e.message()));
    }
}

SamplingParams SamplingArgs::resolve() const {
    SamplingParams p = params;
    // 32 random bits: short enough to read and type back, and two runs collide once in 4e9.
    if (!seed_opt_ || seed_opt_->count() == 0) p.seed = uint64_t(std::random_device{}());
    p.validate();
    for (const std::string& s : stop) LATTICE_CHECK(!s.empty(), "--stop: the stop text must not be empty");
    return p;
}

void check_utf8(const std::string& text, const std::string& what) {
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t at = pos;
        if (utf8_next(text, pos) == kInvalidCodepoint)
            LATTICE_FAIL("{}: not UTF-8 text (byte 0x{:02x} at offset {})", what, static_cast<unsigned char>(text[at]),
                         at);
    }
}

namespace {

std::string as_prompt(std::string text, const std::string& what) {
    check_utf8(text, what);
    if (text.ends_with("\r\n"))
        text.resize(text.size() - 2);
    else if (text.ends_with("\n"))
        text.pop_back();
    LATTICE_CHECK(!text.empty(), "{}: the prompt is empty", what);
    return text;
}

}  // namespace

std::string read_prompt_file(const std::string& path, const char* flag) {
    const std::string what = fmt::format("{} {}", flag, path);
    // read_regular_file names a missing file, a folder or a FIFO (never opened blocking), and a
    // read error, each with `flag path`.
    return as_prompt(read_regular_file(path, kMaxPromptBytes, flag), what);
}

std::string read_prompt_stdin() {
    std::string text;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        LATTICE_CHECK(n >= 0, "stdin: read failed ({})", std::strerror(errno));
        if (n == 0) break;
        text.append(buf, size_t(n));
        LATTICE_CHECK(int64_t(text.size()) <= kMaxPromptBytes, "stdin: the prompt exceeds the {} byte limit",
                      kMaxPromptBytes);
    }
    return as_prompt(std::move(text), "stdin");
}

bool stdin_is_redirected() {
    struct stat st {};
    if (::fstat(0, &st) != 0) return false;
    return S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode);
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages, const char* who) {
    LATTICE_CHECK(tok.chat_template_kind() != ChatTemplateKind::kNone,
                  "{}: the model's tokenizer ({}) has no recognised chat template", who, tok.source());
    // The rendered template spells special tokens (and the BOS text, where the family has one).
    return tok.encode(tok.chat_template().render(messages, true), false, true);
}

}  // namespace lattice
