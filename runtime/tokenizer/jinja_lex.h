// The token stream between the Jinja lexer (jinja_lex.cpp) and the parser (jinja_parse.cpp); internal
// to the tokenizer room. A Tok is one text run, a tag delimiter, or one token inside a tag (name,
// string literal with escapes already decoded, int, float, operator). lex_template's list always ends
// with one kEnd token; each token carries a 1-based line and column for error messages (a text run:
// its line, column 1).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lattice::jinja {

struct Tok {
    enum Kind { kText, kVarOpen, kVarClose, kBlockOpen, kBlockClose, kName, kString, kInt, kFloat, kOp, kEnd };
    Kind kind;
    std::string text;
    int line, col;
};

// Splits a template's source (newlines already normalized to "\n") into tokens; `name` names the
// template in error messages. Throws Error on an unclosed tag, comment or string, or a stray character.
std::vector<Tok> lex_template(std::string_view source, const std::string& name);

}  // namespace lattice::jinja
