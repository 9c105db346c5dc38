// Parser of the Jinja subset (jinja.h): builds the AST (jinja_internal.h) from the token stream of
// the lexer (jinja_lex.cpp, which also does jinja2's trim_blocks / lstrip_blocks whitespace handling).
// Operator precedence follows jinja2's parser (filters and tests bind tighter than arithmetic, `not`
// looser than comparisons). Recursion is bounded (kMaxDepth): templates are untrusted input.
// The Parser class is declared in jinja_parser.h; its expression half is jinja_parse_expr.cpp.
#include <fmt/format.h>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"
#include "runtime/tokenizer/jinja_lex.h"
#include "runtime/tokenizer/jinja_parser.h"

namespace lattice::jinja {

void fail_at(const std::string& name, int line, int col, const std::string& msg) {
    throw Error(fmt::format("chat template '{}' line {} column {}: {}", name, line, col, msg));
}

Body Parser::parse_body(std::initializer_list<std::string_view> stops, std::string& stop) {
    Body body;
    for (;;) {
        const Tok& t = peek();
        if (t.kind == Tok::kEnd) {
            if (stops.size())
                fail(open_.empty() ? t : open_.back(),
                     fmt::format("missing '{{% {} %}}' for this block", *(stops.end() - 1)));
            return body;
        }
        if (t.kind == Tok::kText) {
            auto n = node(Node::Kind::kText, t);
            n->text = next().text;
            body.push_back(std::move(n));
        } else if (t.kind == Tok::kVarOpen) {
            ++p_;
            auto n = node(Node::Kind::kOutput, t);
            n->expr = parse_tuple_or_expr();
            if (peek().kind != Tok::kVarClose) fail(peek(), fmt::format("expected '}}}}', found {}", describe(peek())));
            ++p_;
            body.push_back(std::move(n));
        } else {
            const Tok& kw = peek(1);
            if (kw.kind != Tok::kName) fail(kw, "expected a statement keyword");
            for (std::string_view s : stops)
                if (kw.text == s) {
                    p_ += 2;
                    stop = kw.text;
                    return body;
                }
            open_.push_back(t);
            p_ += 2;
            body.push_back(parse_statement(kw));
            open_.pop_back();
        }
    }
}

std::unique_ptr<Node> Parser::parse_statement(const Tok& kw) {
    DepthGuard guard(*this, kw);
    const std::string& k = kw.text;
    std::string stop;
    if (k == "if") {
        Soft soft(*this, true);
        auto n = node(Node::Kind::kIf, kw);
        ExprPtr cond = parse_expr();
        for (;;) {
            expect_block_close();
            Body b = parse_body({"elif", "else", "endif"}, stop);
            n->branches.emplace_back(std::move(cond), std::move(b));
            if (stop == "endif") break;
            if (stop == "else") {
                expect_block_close();
                Body e = parse_body({"endif"}, stop);
                n->branches.emplace_back(nullptr, std::move(e));
                break;
            }
            cond = parse_expr();
        }
        expect_block_close();
        return n;
    }
    if (k == "for") {
        auto n = node(Node::Kind::kFor, kw);
        n->targets.push_back(expect_name());
        while (is_op(",")) {
            ++p_;
            n->targets.push_back(expect_name());
        }
        if (!is_name("in")) fail(peek(), "expected 'in' in for loop");
        ++p_;
        n->expr = parse_or();  // jinja2: no ternary here, `if` filters
        Soft hard(*this, false);
        if (is_name("if")) {
            ++p_;
            n->cond = parse_or();
        }
        if (is_name("recursive")) fail(peek(), "recursive loops are not supported");
        expect_block_close();
        n->body = parse_body({"else", "endfor"}, stop);
        if (stop == "else") {
            expect_block_close();
            n->else_body = parse_body({"endfor"}, stop);
        }
        expect_block_close();
        return n;
    }
    if (k == "set") {
        auto n = node(Node::Kind::kSet, kw);
        n->targets.push_back(expect_name());
        if (is_op(".")) {
            ++p_;
            n->targets.push_back(expect_name());
            n->attr_set = true;
        } else {
            while (is_op(",")) {
                ++p_;
                n->targets.push_back(expect_name());
            }
        }
        if (peek().kind == Tok::kBlockClose && !n->attr_set && n->targets.size() == 1) {
            ++p_;
            n->kind = Node::Kind::kSetBlock;
            Soft hard(*this, false);
            n->body = parse_body({"endset"}, stop);
            expect_block_close();
            return n;
        }
        expect_op("=");
        n->expr = parse_tuple_or_expr();
        expect_block_close();
        return n;
    }
    if (k == "macro") {
        auto n = node(Node::Kind::kMacro, kw);
        n->text = expect_name();
        expect_op("(");
        while (!is_op(")")) {
            std::string p = expect_name();
            ExprPtr def;
            if (is_op("=")) {
                ++p_;
                def = parse_expr();
            }
            n->params.emplace_back(std::move(p), std::move(def));
            if (!is_op(")")) expect_op(",");
        }
        ++p_;
        expect_block_close();
        Soft hard(*this, false);
        n->body = parse_body({"endmacro"}, stop);
        expect_block_close();
        return n;
    }
    if (k == "break" || k == "continue") {
        auto n = node(k == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, kw);
        expect_block_close();
        return n;
    }
    if (k == "generation") {  // transformers' AssistantTracker: renders its body
        expect_block_close();
        auto n = node(Node::Kind::kIf, kw);
        n->branches.emplace_back(nullptr, parse_body({"endgeneration"}, stop));
        expect_block_close();
        return n;
    }
    fail(kw, fmt::format("unknown or unexpected statement '{}'", k));
}

std::shared_ptr<Program> parse_template(std::string_view source, std::string name) {
    auto prog = std::make_shared<Program>();
    prog->name = std::move(name);
    // jinja2's defaults: newlines normalized to "\n", one trailing newline of the source dropped.
    std::string text;
    text.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] == '\r') {
            text += '\n';
            if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        } else {
            text += source[i];
        }
    }
    if (!text.empty() && text.back() == '\n') text.pop_back();
    std::vector<Tok> toks = lex_template(text, prog->name);
    prog->body = Parser(std::move(toks), prog->name).parse_all();
    return prog;
}

}  // namespace lattice::jinja
