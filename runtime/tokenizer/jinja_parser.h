// The Jinja parser's class (jinja.h, jinja_internal.h): internal to the tokenizer room, shared by the
// template-level half (jinja_parse.cpp: text, output and statement tags) and the expression half
// (jinja_parse_expr.cpp: jinja2's precedence climb, primaries, calls, subscripts, filters and tests).
// One Parser parses one template's tokens (jinja_lex.h) once. Invariants: the token list ends with
// kEnd and peek()/next() never read past it; recursion is bounded by kMaxDepth (DepthGuard), as
// templates come from checkpoint files (untrusted input); unknown filter and test names found outside
// a "soft" frame fail the parse, inside one they are left to fail when reached.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tokenizer/jinja_internal.h"
#include "runtime/tokenizer/jinja_lex.h"

namespace lattice::jinja {

class Parser {
public:
    Parser(std::vector<Tok> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}

    Body parse_all() {
        std::string stop;
        Body b = parse_body({}, stop);
        if (!unknown_.empty()) fail(unknown_[0].first, unknown_[0].second);
        return b;
    }

private:
    const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
    const Tok& next() { return t_[std::min(p_++, t_.size() - 1)]; }
    [[noreturn]] void fail(const Tok& t, const std::string& msg) { fail_at(name_, t.line, t.col, msg); }
    bool is_op(std::string_view op, size_t k = 0) const { return peek(k).kind == Tok::kOp && peek(k).text == op; }
    bool is_name(std::string_view n, size_t k = 0) const { return peek(k).kind == Tok::kName && peek(k).text == n; }
    void expect_op(std::string_view op) {
        if (!is_op(op)) fail(peek(), fmt::format("expected '{}', found {}", op, describe(peek())));
        ++p_;
    }
    std::string expect_name() {
        if (peek().kind != Tok::kName) fail(peek(), fmt::format("expected a name, found {}", describe(peek())));
        return next().text;
    }
    void expect_block_close() {
        if (peek().kind != Tok::kBlockClose) fail(peek(), fmt::format("expected '%}}', found {}", describe(peek())));
        ++p_;
    }
    static std::string describe(const Tok& t) {
        switch (t.kind) {
            case Tok::kEnd:
                return "end of template";
            case Tok::kBlockClose:
                return "'%}'";
            case Tok::kVarClose:
                return "'}}'";
            case Tok::kString:
                return "a string";
            default:
                return "'" + t.text + "'";
        }
    }
    ExprPtr make(Expr::Kind k, const Tok& at) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = at.line;
        e->col = at.col;
        return e;
    }

    // Parses nodes until a block tag whose keyword is in `stops` (returned in `stop`, tag consumed
    // up to its keyword) or the end (only when stops is empty).
    Body parse_body(std::initializer_list<std::string_view> stops, std::string& stop);
    std::unique_ptr<Node> node(Node::Kind k, const Tok& at) {
        auto n = std::make_unique<Node>();
        n->kind = k;
        n->line = at.line;
        n->col = at.col;
        return n;
    }

    // Bounds the parser's recursion: templates come from checkpoint files (untrusted input).
    struct DepthGuard {
        Parser& p;
        DepthGuard(Parser& parser, const Tok& at) : p(parser) {
            if (++p.depth_ > kMaxDepth) p.fail(at, fmt::format("nesting deeper than {}", kMaxDepth));
        }
        ~DepthGuard() { --p.depth_; }
    };
    static constexpr int kMaxDepth = 200;

    std::unique_ptr<Node> parse_statement(const Tok& kw);

    // ---- expressions (jinja_parse_expr.cpp) ----
    ExprPtr parse_tuple_or_expr();
    ExprPtr parse_expr();
    ExprPtr parse_or();
    ExprPtr parse_and();
    ExprPtr parse_not();
    ExprPtr parse_compare();
    ExprPtr binary_loop(std::initializer_list<std::string_view> ops, ExprPtr (Parser::*sub)());
    ExprPtr parse_math1() { return binary_loop({"+", "-"}, &Parser::parse_concat); }
    ExprPtr parse_concat() { return binary_loop({"~"}, &Parser::parse_math2); }
    ExprPtr parse_math2() { return binary_loop({"*", "/", "//", "%"}, &Parser::parse_pow); }
    ExprPtr parse_pow() { return binary_loop({"**"}, &Parser::parse_unary_filtered); }
    ExprPtr parse_unary_filtered() { return parse_unary(true); }
    ExprPtr parse_unary(bool with_filter);
    ExprPtr parse_primary();
    void parse_call_args(Expr& call);
    ExprPtr parse_postfix(ExprPtr e);
    ExprPtr parse_subscript(ExprPtr obj, Tok at);
    ExprPtr parse_filters(ExprPtr e);

    std::vector<Tok> t_;
    std::vector<Tok> open_;
    // Unknown filter and test names. jinja2's compiler rejects them, except inside an `if` block or
    // a conditional expression ("soft" frames; a for, macro or set block body is not soft again),
    // where they fail only when reached; the evaluator does the latter.
    std::vector<std::pair<Tok, std::string>> unknown_;
    bool soft_ = false;
    void unknown(const Tok& at, std::string msg) {
        if (!soft_) unknown_.emplace_back(at, std::move(msg));
    }
    struct Soft {
        Parser& p;
        bool saved;
        Soft(Parser& parser, bool soft) : p(parser), saved(parser.soft_) { p.soft_ = soft; }
        ~Soft() { p.soft_ = saved; }
    };
    int depth_ = 0;  // the '{%' of each block being parsed, for "missing end" errors
    const std::string& name_;
    size_t p_ = 0;
};

}  // namespace lattice::jinja
