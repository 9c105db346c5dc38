// Parser of the Jinja subset (jinja.h): builds the AST (jinja_internal.h) from the token stream of
// the lexer (jinja_lex.cpp, which also does jinja2's trim_blocks / lstrip_blocks whitespace handling).
// Operator precedence follows jinja2's parser (filters and tests bind tighter than arithmetic, `not`
// looser than comparisons). Recursion is bounded (kMaxDepth): templates are untrusted input.
#include <fmt/format.h>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"
#include "runtime/tokenizer/jinja_lex.h"

namespace lattice::jinja {

void fail_at(const std::string& name, int line, int col, const std::string& msg) {
    throw Error(fmt::format("chat template '{}' line {} column {}: {}", name, line, col, msg));
}

namespace {

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
    Body parse_body(std::initializer_list<std::string_view> stops, std::string& stop) {
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
                if (peek().kind != Tok::kVarClose)
                    fail(peek(), fmt::format("expected '}}}}', found {}", describe(peek())));
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

    std::unique_ptr<Node> parse_statement(const Tok& kw) {
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

    ExprPtr parse_tuple_or_expr() {
        const Tok& at = peek();
        ExprPtr e = parse_expr();
        if (!is_op(",")) return e;
        auto t = make(Expr::Kind::kTuple, at);
        t->args.push_back(std::move(e));
        while (is_op(",")) {
            ++p_;
            if (peek().kind == Tok::kVarClose || peek().kind == Tok::kBlockClose) break;  // `a, b,`
            t->args.push_back(parse_expr());
        }
        return t;
    }

    ExprPtr parse_expr() {
        const Tok& at = peek();
        DepthGuard guard(*this, at);
        const size_t mark = unknown_.size();
        ExprPtr e = parse_or();
        if (!is_name("if")) return e;
        ++p_;
        unknown_.resize(mark);  // the whole conditional expression is soft
        Soft soft(*this, true);
        auto c = make(Expr::Kind::kCond, at);
        c->args.push_back(parse_or());  // condition
        c->args.push_back(std::move(e));
        if (is_name("else")) {
            ++p_;
            c->args.push_back(parse_expr());
        }
        return c;
    }
    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            auto n = make(Expr::Kind::kOr, next());
            n->args.push_back(std::move(e));
            n->args.push_back(parse_and());
            e = std::move(n);
        }
        return e;
    }
    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            auto n = make(Expr::Kind::kAnd, next());
            n->args.push_back(std::move(e));
            n->args.push_back(parse_not());
            e = std::move(n);
        }
        return e;
    }
    ExprPtr parse_not() {
        if (is_name("not")) {
            auto n = make(Expr::Kind::kNot, next());
            n->args.push_back(parse_not());
            return n;
        }
        return parse_compare();
    }
    ExprPtr parse_compare() {
        ExprPtr e = parse_math1();
        for (;;) {
            std::string op;
            const Tok& at = peek();
            if (peek().kind == Tok::kOp && (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" ||
                                            at.text == "<=" || at.text == ">=")) {
                op = at.text;
                ++p_;
            } else if (is_name("in")) {
                op = "in";
                ++p_;
            } else if (is_name("not") && is_name("in", 1)) {
                op = "not in";
                p_ += 2;
            } else {
                return e;
            }
            auto n = make(Expr::Kind::kBinary, at);
            n->name = op;
            n->args.push_back(std::move(e));
            n->args.push_back(parse_math1());
            e = std::move(n);
        }
    }
    ExprPtr binary_loop(std::initializer_list<std::string_view> ops, ExprPtr (Parser::*sub)()) {
        ExprPtr e = (this->*sub)();
        for (;;) {
            bool hit = false;
            for (std::string_view o : ops) hit = hit || is_op(o);
            if (!hit) return e;
            const Tok& at = next();
            auto n = make(Expr::Kind::kBinary, at);
            n->name = at.text;
            n->args.push_back(std::move(e));
            n->args.push_back((this->*sub)());
            e = std::move(n);
        }
    }
    ExprPtr parse_math1() { return binary_loop({"+", "-"}, &Parser::parse_concat); }
    ExprPtr parse_concat() { return binary_loop({"~"}, &Parser::parse_math2); }
    ExprPtr parse_math2() { return binary_loop({"*", "/", "//", "%"}, &Parser::parse_pow); }
    ExprPtr parse_pow() { return binary_loop({"**"}, &Parser::parse_unary_filtered); }
    ExprPtr parse_unary_filtered() { return parse_unary(true); }

    ExprPtr parse_unary(bool with_filter) {
        DepthGuard guard(*this, peek());
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            const Tok& at = next();
            e = make(Expr::Kind::kUnary, at);
            e->name = at.text;
            e->args.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filters(std::move(e));
        return e;
    }

    ExprPtr parse_primary() {
        const Tok& t = peek();
        switch (t.kind) {
            case Tok::kName: {
                ++p_;
                auto e = make(Expr::Kind::kLiteral, t);
                if (t.text == "true" || t.text == "True")
                    e->literal = Value::boolean(true);
                else if (t.text == "false" || t.text == "False")
                    e->literal = Value::boolean(false);
                else if (t.text == "none" || t.text == "None")
                    e->literal = Value::none();
                else {
                    e->kind = Expr::Kind::kName;
                    e->name = t.text;
                }
                return e;
            }
            case Tok::kString: {
                std::string s;
                while (peek().kind == Tok::kString) s += next().text;  // adjacent literals concatenate
                auto e = make(Expr::Kind::kLiteral, t);
                e->literal = Value::str(std::move(s));
                return e;
            }
            case Tok::kInt:
            case Tok::kFloat: {
                ++p_;
                auto e = make(Expr::Kind::kLiteral, t);
                try {
                    e->literal =
                        t.kind == Tok::kInt ? Value::integer(std::stoll(t.text)) : Value::real(std::stod(t.text));
                } catch (const std::exception&) {
                    fail(t, fmt::format("number '{}' out of range", t.text));
                }
                return e;
            }
            case Tok::kOp:
                if (t.text == "(") {
                    ++p_;
                    if (is_op(")")) {
                        ++p_;
                        return make(Expr::Kind::kTuple, t);
                    }
                    ExprPtr e = parse_expr();
                    if (is_op(",")) {
                        auto tup = make(Expr::Kind::kTuple, t);
                        tup->args.push_back(std::move(e));
                        while (is_op(",")) {
                            ++p_;
                            if (is_op(")")) break;
                            tup->args.push_back(parse_expr());
                        }
                        e = std::move(tup);
                    }
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") {
                    ++p_;
                    auto e = make(Expr::Kind::kList, t);
                    while (!is_op("]")) {
                        e->args.push_back(parse_expr());
                        if (!is_op("]")) expect_op(",");
                    }
                    ++p_;
                    return e;
                }
                if (t.text == "{") {
                    ++p_;
                    auto e = make(Expr::Kind::kDict, t);
                    while (!is_op("}")) {
                        e->args.push_back(parse_expr());
                        expect_op(":");
                        e->args.push_back(parse_expr());
                        if (!is_op("}")) expect_op(",");
                    }
                    ++p_;
                    return e;
                }
                break;
            default:
                break;
        }
        fail(t, fmt::format("unexpected {}", describe(t)));
    }

    void parse_call_args(Expr& call) {
        expect_op("(");
        while (!is_op(")")) {
            if (peek().kind == Tok::kName && is_op("=", 1)) {
                std::string k = next().text;
                ++p_;
                call.kwargs.emplace_back(std::move(k), parse_expr());
            } else {
                call.args.push_back(parse_expr());
            }
            if (!is_op(")")) expect_op(",");
        }
        ++p_;
    }

    ExprPtr parse_postfix(ExprPtr e) {
        for (;;) {
            const Tok at{Tok::kOp, "", e->line, e->col};  // errors point at the expression's start
            if (is_op(".")) {
                ++p_;
                auto n = make(Expr::Kind::kAttr, at);
                if (peek().kind == Tok::kInt) {
                    n->kind = Expr::Kind::kIndex;
                    auto idx = make(Expr::Kind::kLiteral, peek());
                    idx->literal = Value::integer(std::stoll(next().text));
                    n->args.push_back(std::move(e));
                    n->args.push_back(std::move(idx));
                } else {
                    n->name = expect_name();
                    n->args.push_back(std::move(e));
                }
                e = std::move(n);
            } else if (is_op("[")) {
                ++p_;
                e = parse_subscript(std::move(e), at);
            } else if (is_op("(")) {
                auto n = make(Expr::Kind::kCall, at);
                n->args.push_back(std::move(e));
                parse_call_args(*n);
                e = std::move(n);
            } else {
                return e;
            }
        }
    }
    ExprPtr parse_subscript(ExprPtr obj, Tok at) {
        ExprPtr parts[3];
        int colons = 0;
        for (;;) {
            if (is_op("]")) break;
            if (is_op(":")) {
                if (++colons > 2) fail(peek(), "too many ':' in slice");
                ++p_;
                continue;
            }
            if (parts[colons]) fail(peek(), "expected ':' or ']' in subscript");
            parts[colons] = parse_expr();
        }
        ++p_;
        if (colons == 0) {
            if (!parts[0]) fail(at, "empty subscript");
            auto n = make(Expr::Kind::kIndex, at);
            n->args.push_back(std::move(obj));
            n->args.push_back(std::move(parts[0]));
            return n;
        }
        auto n = make(Expr::Kind::kSlice, at);
        n->args.push_back(std::move(obj));
        for (auto& p : parts) n->args.push_back(std::move(p));
        return n;
    }

    ExprPtr parse_filters(ExprPtr e) {
        for (;;) {
            const Tok& at = peek();
            if (is_op("|")) {
                ++p_;
                auto n = make(Expr::Kind::kFilter, at);
                const Tok& name_tok = peek();
                n->name = expect_name();
                if (!known_filter(n->name)) unknown(name_tok, fmt::format("unknown filter '{}'", n->name));
                n->args.push_back(std::move(e));
                if (is_op("(")) parse_call_args(*n);
                e = std::move(n);
            } else if (is_name("is")) {
                ++p_;
                auto n = make(Expr::Kind::kTest, at);
                if (is_name("not")) {
                    ++p_;
                    n->negated = true;
                }
                const Tok& name_tok = peek();
                n->name = expect_name();
                if (!known_test(n->name)) unknown(name_tok, fmt::format("unknown test '{}'", n->name));
                n->args.push_back(std::move(e));
                if (is_op("(")) {
                    parse_call_args(*n);
                } else if (peek().kind == Tok::kString || peek().kind == Tok::kInt || peek().kind == Tok::kFloat ||
                           (peek().kind == Tok::kName && !is_name("else") && !is_name("or") && !is_name("and") &&
                            !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
                    n->args.push_back(parse_postfix(parse_primary()));  // `is divisibleby 3`
                }
                e = std::move(n);
            } else if (is_op("(")) {
                auto n = make(Expr::Kind::kCall, Tok{Tok::kOp, "", e->line, e->col});
                n->args.push_back(std::move(e));
                parse_call_args(*n);
                e = std::move(n);
            } else {
                return e;
            }
        }
    }

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

}  // namespace

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
