// What `lattice generate` and `lattice chat` share, one home each:
//  - the sampling options (runtime/engine/sampler.h semantics), each stating its default in --help;
//  - the seed: --seed, else a random one (std::random_device) that the caller prints ("seed: N",
//    and in its JSON), so any run can be repeated with --seed N. It is rank 0's that counts: the
//    sampling params travel to the sampler rank in the engine's step plan, so ranks cannot disagree;
//  - prompt text from a file or stdin: read whole (at most kMaxPromptBytes), valid UTF-8 or an error
//    naming the file and the byte offset, one trailing newline dropped (as llama.cpp's --file does:
//    `echo text | lattice generate` prompts "text");
//  - a conversation rendered through the model's chat template and tokenized.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/grammar.h"
#include "runtime/engine/sampler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

// The sampling options: CLI11 binds each flag to a field of `params` (their initial values are the
// stated defaults), plus the --stop texts, which the text stream applies rather than the sampler.
struct SamplingArgs {
    SamplingParams params;
    std::vector<std::string> stop;
    // Structured output (runtime/engine/grammar.h), at most one: --json-schema (a file, or the schema
    // itself when it starts with '{'), --json-object, --regex, --choice (repeatable).
    std::string json_schema, regex;
    bool json_object = false;
    std::vector<std::string> choices;

    // Registers --temperature ... --stop on `cmd` with the current values as the stated defaults.
    void add_to(CLI::App* cmd);
    // `params` with the seed resolved: --seed when given, else a fresh random one. Throws Error
    // naming a bad value.
    SamplingParams resolve() const;
    // The compiled grammar of the structured-output flags (null: none). Error naming the flag.
    std::shared_ptr<const Grammar> grammar() const;

private:
    CLI::Option* seed_opt_ = nullptr;
};

constexpr int64_t kMaxPromptBytes = int64_t(64) << 20;

// The text of a prompt file: Error naming `path` when it is missing, not a regular file,
// unreadable, larger than kMaxPromptBytes, not UTF-8 or empty.
std::string read_prompt_file(const std::string& path, const char* flag);
// All of stdin (the same checks, naming stdin).
std::string read_prompt_stdin();
// stdin is a pipe or a regular file (something was redirected into us), not a terminal or /dev/null.
bool stdin_is_redirected();
// Throws Error "<what>: not UTF-8 text (byte 0xNN at offset K)" unless `text` is valid UTF-8.
void check_utf8(const std::string& text, const std::string& what);

// Renders the conversation with the model's chat template (opening the assistant's turn) and
// tokenizes it. Error when the tokenizer has no recognised chat template (`who` names the command).
std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages, const char* who);

}  // namespace lattice
