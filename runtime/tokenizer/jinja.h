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
// Jinja's grammar; filters, tests and string/dict methods listed in jinja_builtins.cpp. Undefined
// names render as "" and are falsy (jinja2's default Undefined); an attribute of an undefined value
// is an error, as in jinja2. Strings are UTF-8; length and slicing count code points;
// upper/lower/title change ASCII letters only.
// Errors are lattice::Error naming the template, line and column.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace lattice::jinja {

struct Program;  // the parsed template (jinja_internal.h)

struct RenderOptions {
    // The time strftime_now formats; the local clock when empty (tests pass a fixed date).
    std::optional<std::tm> now;
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
