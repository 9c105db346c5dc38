// A Jinja subset engine for the chat templates that checkpoints carry (tokenizer_config.json
// `chat_template`, GGUF `tokenizer.chat_template`).
//
// Why here: no maintained C++ Jinja engine is packaged in Debian or PyPI as a library we can link,
// so this is the part of Jinja that real chat templates use, written against Python's jinja2 as
// Hugging Face transformers configures it (trim_blocks, lstrip_blocks, loop controls; tojson as
// json.dumps(ensure_ascii=False); raise_exception; strftime_now). tests/runtime/tokenizer checks
// it byte for byte against python3-jinja2 on the templates of ../shared/chat-templates.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-, +); if/elif/else, for (loop.*, for-else,
// `for x in y if c`, tuple unpacking, break/continue), set (names, tuples, `ns.attr`, block set),
// macro; literals (strings with Python escapes, numbers, lists, tuples, dicts); the operators of
// Jinja's grammar; filters, tests and string/dict methods listed in jinja_filters.cpp. Undefined
// names render as "" and are falsy (jinja2's default Undefined); an attribute of an undefined value
// is an error, as in jinja2. Strings are UTF-8; length and slicing count code points;
// upper/lower/title change ASCII letters only.
// Errors are lattice::Error naming the template, line and column.
//
// Budget: templates are untrusted (they come with checkpoints) and run once per chat request, so a
// render has limits (RenderLimits): steps (statements run plus expressions evaluated), loop
// iterations across all loops (nested ones multiply), the size of any one string (output
// included), the bytes of all strings the render produces (copies included), and the nesting of
// statements, expressions, macro calls and values. Each limit is a floor plus an allowance per unit
// of the context (JSON values and string bytes), because a real template's work is linear in its
// conversation: the real templates of ../shared/chat-templates use under a tenth of every limit at
// every size (test_jinja_budget), while a runaway one (a string doubled in a loop, two nested
// range(100000)) ends within ~0.1 s with an Error naming the limit, the template and the line.
// A caller may also end the renders of a thread from outside (RenderInterrupt: a server draining).
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace lattice::jinja {

struct Program;  // the parsed template (jinja_internal.h)

// What one render may use (the header comment says why each limit scales with the context).
struct RenderLimits {
    int64_t steps = 1'000'000;          // statements + expressions; plus steps_per_value per context value
    int64_t loop_iterations = 50'000;   // all loops together; plus iterations_per_value per context value
    int64_t string_bytes = 16 << 20;    // any one string; plus string_bytes_per_byte x context bytes
    int64_t total_bytes = 256 << 20;    // all strings produced; plus total_bytes_per_byte x context bytes
    int32_t depth = 256;                // nesting of statements, expressions, macro calls and values
    int64_t steps_per_value = 512, iterations_per_value = 16;
    int64_t string_bytes_per_byte = 16, total_bytes_per_byte = 128;
};

// What a render used, and the limits it ran under (the floors plus the context's allowance).
struct RenderUsage {
    int64_t steps = 0, loop_iterations = 0;
    int64_t string_bytes = 0;  // the longest string
    int64_t total_bytes = 0;
    int32_t depth = 0;  // the deepest nesting
    RenderLimits limits;
};

struct RenderOptions {
    // The time strftime_now formats; the local clock when empty (tests pass a fixed date).
    std::optional<std::tm> now;
    RenderLimits limits;
    RenderUsage* usage = nullptr;  // filled in when given (also when the render fails)
};

// While one lives, renders on this thread check `*flag` at every step and, once it is set, end with
// an Error naming the template and its line ("interrupted"). Scoped per thread; nests (the previous
// flag returns). `lattice serve` sets one on its route threads and raises it when it drains.
class RenderInterrupt {
public:
    explicit RenderInterrupt(const std::atomic<bool>* flag);
    ~RenderInterrupt();
    RenderInterrupt(const RenderInterrupt&) = delete;
    RenderInterrupt& operator=(const RenderInterrupt&) = delete;
    static const std::atomic<bool>* current();

private:
    const std::atomic<bool>* prev_;
};

class Template {
public:
    // Parses `source`; throws Error naming `name`, line and column on a syntax error.
    Template(std::string_view source, std::string name);
    // Renders with the context's keys as global variables (objects keep their key order).
    std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;
    const std::string& name() const;

private:
    std::shared_ptr<const Program> program_;
};

}  // namespace lattice::jinja
