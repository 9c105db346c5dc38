// The expression half of the Jinja parser (jinja_parser.h; the template-level half is
// jinja_parse.cpp): jinja2's precedence climb (conditional, or, and, not, comparisons and tests,
// + -, ~, * / // %, **, unary, filters), primaries (literals, names, lists, dicts, parenthesized
// tuples), calls, attribute and subscript/slice postfixes. Filters and tests bind tighter than
// arithmetic, `not` looser than comparisons, as in jinja2's parser.
#include <fmt/format.h>

#include <charconv>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"
#include "runtime/tokenizer/jinja_parser.h"

namespace lattice::jinja {

ExprPtr Parser::parse_tuple_or_expr() {
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

ExprPtr Parser::parse_expr() {
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

ExprPtr Parser::parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
        auto n = make(Expr::Kind::kOr, next());
        n->args.push_back(std::move(e));
        n->args.push_back(parse_and());
        e = std::move(n);
    }
    return e;
}

ExprPtr Parser::parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
        auto n = make(Expr::Kind::kAnd, next());
        n->args.push_back(std::move(e));
        n->args.push_back(parse_not());
        e = std::move(n);
    }
    return e;
}

ExprPtr Parser::parse_not() {
    if (is_name("not")) {
        auto n = make(Expr::Kind::kNot, next());
        n->args.push_back(parse_not());
        return n;
    }
    return parse_compare();
}

ExprPtr Parser::parse_compare() {
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

ExprPtr Parser::binary_loop(std::initializer_list<std::string_view> ops, ExprPtr (Parser::*sub)()) {
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

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::parse_primary() {
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
                e->literal = t.kind == Tok::kInt ? Value::integer(std::stoll(t.text)) : Value::real(std::stod(t.text));
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

void Parser::parse_call_args(Expr& call) {
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

ExprPtr Parser::parse_postfix(ExprPtr e) {
    for (;;) {
        const Tok at{Tok::kOp, "", e->line, e->col};  // errors point at the expression's start
        if (is_op(".")) {
            ++p_;
            auto n = make(Expr::Kind::kAttr, at);
            if (peek().kind == Tok::kInt) {
                n->kind = Expr::Kind::kIndex;
                auto idx = make(Expr::Kind::kLiteral, peek());
                int64_t i = 0;
                const Tok& it = next();
                if (std::from_chars(it.text.data(), it.text.data() + it.text.size(), i).ec != std::errc())
                    fail(it, fmt::format("index '{}' out of range", it.text));
                idx->literal = Value::integer(i);
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

ExprPtr Parser::parse_subscript(ExprPtr obj, Tok at) {
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

ExprPtr Parser::parse_filters(ExprPtr e) {
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

}  // namespace lattice::jinja
