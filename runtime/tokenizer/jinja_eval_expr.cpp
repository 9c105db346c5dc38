// The expression half of the Jinja evaluator (jinja_evaluator.h; the statements are jinja_eval.cpp):
// evaluates an Expr to a Value with jinja2's semantics for names, attributes and subscripts (a
// missing one is Undefined, not an error), slices, calls, filters and tests, and the operators
// (Python's arithmetic, comparison and `in`). Every expression charges the render's Budget: a step
// and a level of nesting, and the strings it makes, checked before a string grows. Integers are
// int64: where Python's would grow past 64 bits the result is an Oops, never undefined behaviour;
// slices take any int64 step.
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "base/error.h"
#include "runtime/tokenizer/jinja_evaluator.h"
#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

Value Evaluator::eval(const Expr& e) {
    try {
        const Nest nest;
        Budget& budget = *Budget::current();
        budget.step();
        Value v = eval_inner(e);
        if (v.is_string()) budget.produced(v.s.size());
        return v;
    } catch (const Oops& o) {
        fail_at(prog_.name, e.line, e.col, o.what());
    } catch (const std::logic_error& o) {  // out_of_range, length_error...: a bug here, still the template's line
        fail_at(prog_.name, e.line, e.col, fmt::format("internal error: {}", o.what()));
    }
}

namespace {

// Python's ints do not overflow; int64 ones must not either (undefined behaviour): past int64 an Oops.
[[noreturn]] void overflow(int64_t x, const char* op, int64_t y) {
    throw Oops(fmt::format("integer overflow: {} {} {} is beyond 64 bits", x, op, y));
}

int64_t int_arith(char op, int64_t x, int64_t y) {
    int64_t r = 0;
    const bool over = op == '+'   ? __builtin_add_overflow(x, y, &r)
                      : op == '-' ? __builtin_sub_overflow(x, y, &r)
                                  : __builtin_mul_overflow(x, y, &r);
    if (over) overflow(x, op == '+' ? "+" : op == '-' ? "-" : "*", y);
    return r;
}

int64_t int_power(int64_t x, int64_t y) {  // y >= 0; squaring by halves, each product checked
    int64_t r = 1, base = x;
    for (uint64_t e = uint64_t(y); e; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) overflow(x, "**", y);
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow(x, "**", y);
    }
    return r;
}

// Python's // and % on ints (floor division; the remainder takes the divisor's sign); y != 0.
int64_t int_floordiv(const std::string& op, int64_t x, int64_t y) {
    if (y == -1) {
        if (op == "%") return 0;
        if (x == INT64_MIN) overflow(x, "//", y);
        return -x;
    }
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
    }
    return op == "//" ? q : r;
}

}  // namespace

std::string Evaluator::describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return e.name;
    if (e.kind == Expr::Kind::kAttr) return describe(*e.args[0]) + "." + e.name;
    if (e.kind == Expr::Kind::kIndex && e.args[1]->kind == Expr::Kind::kLiteral)
        return describe(*e.args[0]) + "[" + repr(e.args[1]->literal) + "]";
    if (e.kind == Expr::Kind::kIndex) return describe(*e.args[0]) + "[...]";
    return "the value";
}

Value Evaluator::need_defined(const Expr& e) {
    Value v = eval(e);
    if (v.undefined()) throw Oops(fmt::format("'{}' is undefined", describe(e)));
    return v;
}

Args Evaluator::eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
}

Value Evaluator::eval_inner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
        case K::kLiteral:
            return e.literal;
        case K::kName:
            return lookup(e.name);
        case K::kList:
        case K::kTuple: {
            List l;
            for (const auto& x : e.args) l.push_back(eval(*x));
            Value v = Value::make_list(std::move(l));
            v.tuple = e.kind == K::kTuple;
            return v;
        }
        case K::kDict: {
            Value d = Value::make_dict();
            for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
                Value k = eval(*e.args[i]);
                if (!k.is_string()) throw Oops("dict literal keys must be strings");
                d.dict->set(k.s, eval(*e.args[i + 1]));
            }
            return d;
        }
        case K::kAttr: {
            const Value obj = need_defined(*e.args[0]);
            if (obj.is_dict() && !obj.dict->is_namespace) {
                Value m = method(obj, e.name);
                if (!m.undefined()) return m;
            }
            if (obj.is_dict()) {
                const Value* v = obj.dict->find(e.name);
                return v ? *v : Value();
            }
            return method(obj, e.name);
        }
        case K::kIndex:
            return index(need_defined(*e.args[0]), eval(*e.args[1]));
        case K::kSlice:
            return slice(need_defined(*e.args[0]), e);
        case K::kCall: {
            const Value f = eval(*e.args[0]);
            if (f.undefined()) throw Oops(fmt::format("'{}' is undefined", describe(*e.args[0])));
            if (f.kind != Value::Kind::kFunc) throw Oops(fmt::format("a {} value is not callable", kind_name(f)));
            Args a = eval_args(e, 1);
            return (*f.fn)(a);
        }
        case K::kFilter: {
            const Value v = eval(*e.args[0]);
            Args a = eval_args(e, 1);
            return apply_filter(e.name, v, a,
                                [](const Value& x, const std::string& t, Args& ta) { return apply_test(t, x, ta); });
        }
        case K::kTest: {
            const Value v = eval(*e.args[0]);
            Args a = eval_args(e, 1);
            return Value::boolean(apply_test(e.name, v, a) != e.negated);
        }
        case K::kUnary: {
            const Value v = need_defined(*e.args[0]);
            if (!v.is_number()) throw Oops(fmt::format("bad operand for unary {}: {}", e.name, kind_name(v)));
            if (e.name == "+") return v;
            if (v.kind == Value::Kind::kFloat) return Value::real(-v.f);
            const int64_t x = v.kind == Value::Kind::kBool ? v.b : v.i;
            if (x == INT64_MIN) overflow(0, "-", x);
            return Value::integer(-x);
        }
        case K::kNot:
            return Value::boolean(!truthy(eval(*e.args[0])));
        case K::kAnd: {
            Value a = eval(*e.args[0]);
            return truthy(a) ? eval(*e.args[1]) : a;
        }
        case K::kOr: {
            Value a = eval(*e.args[0]);
            return truthy(a) ? a : eval(*e.args[1]);
        }
        case K::kCond:
            if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
            return e.args.size() > 2 ? eval(*e.args[2]) : Value();
        case K::kBinary:
            return binary(e);
    }
    return Value();
}

Value Evaluator::index(const Value& obj, const Value& key) {
    if (obj.is_dict()) {
        if (!key.is_string()) return Value();
        const Value* v = obj.dict->find(key.s);
        if (v) return *v;
        return obj.dict->is_namespace ? Value() : method(obj, key.s);
    }
    if (key.kind != Value::Kind::kInt) return obj.is_string() ? method(obj, key.s) : Value();
    if (obj.is_list()) {
        const int64_t i = norm_index(key.i, int64_t(obj.list->size()));
        return i >= 0 && i < int64_t(obj.list->size()) ? (*obj.list)[size_t(i)] : Value();
    }
    if (obj.is_string()) {
        auto cps = code_points(obj.s);
        const int64_t i = norm_index(key.i, int64_t(cps.size()));
        return i >= 0 && i < int64_t(cps.size()) ? Value::str(cps[size_t(i)]) : Value();
    }
    return Value();
}

Value Evaluator::slice(const Value& obj, const Expr& e) {
    auto opt = [&](size_t k, bool& given) -> int64_t {
        given = false;
        if (!e.args[k]) return 0;
        Value v = eval(*e.args[k]);
        if (v.is_none()) return 0;
        if (v.kind != Value::Kind::kInt) throw Oops("slice indices must be integers");
        given = true;
        return v.i;
    };
    bool has_start, has_stop, has_step;
    const int64_t start0 = opt(1, has_start), stop0 = opt(2, has_stop), step_v = opt(3, has_step);
    const int64_t st = has_step ? step_v : 1;
    if (st == 0) throw Oops("slice step cannot be zero");
    std::vector<std::string> cps;
    int64_t n;
    if (obj.is_list())
        n = int64_t(obj.list->size());
    else if (obj.is_string())
        n = int64_t((cps = code_points(obj.s)).size());
    else
        throw Oops(fmt::format("a {} value cannot be sliced", kind_name(obj)));
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool given, int64_t def) {
        if (!given) return def;
        if (v < 0) v += n;
        if (st > 0) return std::clamp<int64_t>(v, 0, n);
        return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(start0, has_start, st > 0 ? 0 : n - 1);
    const int64_t stop = clamp(stop0, has_stop, st > 0 ? n : -1);
    // Items taken, in wide arithmetic: the step may be anywhere in int64.
    const __int128 span = st > 0 ? __int128(stop) - start : __int128(start) - stop;
    const __int128 mag = st > 0 ? __int128(st) : -__int128(st);
    const int64_t count = span <= 0 ? 0 : int64_t((span + mag - 1) / mag);
    charge_steps(count);
    List l;
    std::string s;
    for (int64_t k = 0; k < count; ++k) {
        const int64_t i = int64_t(start + __int128(k) * st);
        if (obj.is_list())
            l.push_back((*obj.list)[size_t(i)]);
        else
            s += cps[size_t(i)];
    }
    return obj.is_list() ? Value::make_list(std::move(l)) : Value::str(std::move(s));
}

Value Evaluator::binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "<") return Value::boolean(less(a, b));
    if (op == ">") return Value::boolean(less(b, a));
    if (op == "<=") return Value::boolean(!less(b, a));
    if (op == ">=") return Value::boolean(!less(a, b));
    if (op == "in" || op == "not in") return Value::boolean(contains(b, a) == (op == "in"));
    if (op == "~") {
        const std::string x = to_str(a), y = to_str(b);
        charge_growing(x.size() + y.size());
        return Value::str(x + y);
    }
    if (a.undefined()) throw Oops(fmt::format("'{}' is undefined", describe(*e.args[0])));
    if (b.undefined()) throw Oops(fmt::format("'{}' is undefined", describe(*e.args[1])));
    if (op == "+") {
        if (a.is_string() && b.is_string()) {
            charge_growing(a.s.size() + b.s.size());
            return Value::str(a.s + b.s);
        }
        if (a.is_list() && b.is_list()) {
            Budget::current()->copied(*a.list);
            Budget::current()->copied(*b.list);
            List l = *a.list;
            l.insert(l.end(), b.list->begin(), b.list->end());
            return Value::make_list(std::move(l));
        }
    }
    if (op == "*" && (a.is_string() || b.is_string()) && (a.kind == Value::Kind::kInt || b.kind == Value::Kind::kInt)) {
        const std::string& s = a.is_string() ? a.s : b.s;
        const int64_t k = a.is_string() ? b.i : a.i;
        if (k > 0 && !s.empty())
            charge_growing(uint64_t(k) > (uint64_t(1) << 48) / s.size() ? SIZE_MAX : s.size() * size_t(k));
        std::string out;
        for (int64_t i = 0; i < k; ++i) out += s;
        return Value::str(out);
    }
    if (!a.is_number() || !b.is_number())
        throw Oops(fmt::format("unsupported operand types for {}: {} and {}", op, kind_name(a), kind_name(b)));
    const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
    const int64_t x = a.kind == Value::Kind::kBool ? a.b : a.i, y = b.kind == Value::Kind::kBool ? b.b : b.i;
    const double fx = a.kind == Value::Kind::kFloat ? a.f : double(x),
                 fy = b.kind == Value::Kind::kFloat ? b.f : double(y);
    if (op == "+") return ints ? Value::integer(int_arith('+', x, y)) : Value::real(fx + fy);
    if (op == "-") return ints ? Value::integer(int_arith('-', x, y)) : Value::real(fx - fy);
    if (op == "*") return ints ? Value::integer(int_arith('*', x, y)) : Value::real(fx * fy);
    if (op == "/") {
        if (fy == 0) throw Oops("division by zero");
        return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
        if (fy == 0) throw Oops(op == "%" ? "modulo by zero" : "division by zero");
        if (ints) return Value::integer(int_floordiv(op, x, y));
        const double q = std::floor(fx / fy);
        return Value::real(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
        if (ints && y >= 0) return Value::integer(int_power(x, y));
        return Value::real(std::pow(fx, fy));
    }
    throw Oops(fmt::format("unknown operator '{}'", op));
}

bool Evaluator::contains(const Value& hay, const Value& needle) {
    if (hay.is_string()) {
        if (!needle.is_string()) throw Oops(fmt::format("'in <string>' needs a string, not {}", kind_name(needle)));
        charge_scan(hay.s.size());
        return hay.s.find(needle.s) != std::string::npos;
    }
    if (hay.is_dict()) return needle.is_string() && hay.dict->find(needle.s) != nullptr;
    if (hay.is_list()) {
        for (const Value& x : *hay.list)
            if (equal(x, needle)) return true;
        return false;
    }
    if (hay.undefined()) return false;
    throw Oops(fmt::format("argument of type {} is not iterable", kind_name(hay)));
}

}  // namespace lattice::jinja
