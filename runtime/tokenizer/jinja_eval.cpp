// The evaluator of the Jinja engine (jinja.h): runs the AST over Values. Scopes follow jinja2: a
// for loop's body has its own scope (a `set` inside does not leak out; namespace() attributes do),
// `if` has none, a macro sees the template's top-level names and its parameters. Globals are
// jinja2's range, dict, namespace and transformers' raise_exception and strftime_now.
// Every statement and expression charges the render's Budget (jinja.h): a step and a level of
// nesting each, the strings it makes; loops an iteration per item; string building is checked
// before the string grows, so a runaway template ends before it allocates past a limit.
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

using Frame = std::unordered_map<std::string, Value>;
enum class Flow { kNormal, kBreak, kContinue };

constexpr int kMaxCallDepth = 64;  // macro recursion (real templates nest a few levels)

class Evaluator {
public:
    Evaluator(const Program& prog, const RenderOptions& opt) : prog_(prog), opt_(opt) {
        scopes_.push_back(std::make_shared<Frame>());
        install_globals(*scopes_[0]);
    }

    std::string run(const nlohmann::ordered_json& context) {
        if (!context.is_object() && !context.is_null()) throw Error("chat template context must be a JSON object");
        Budget budget(opt_.limits, context, opt_.usage);
        if (context.is_object())
            for (auto it = context.begin(); it != context.end(); ++it) (*scopes_[0])[it.key()] = from_json(it.value());
        std::string out;
        exec(prog_.body, out);
        return out;
    }

private:
    void install_globals(Frame& g) {
        g["range"] = Value::func([](Args& a) {
            int64_t start = 0, stop = 0, step = 1;
            auto iarg = [&](size_t i) {
                if (a.pos[i].kind != Value::Kind::kInt) throw Oops("range: expected integers");
                return a.pos[i].i;
            };
            if (a.pos.size() == 1)
                stop = iarg(0);
            else if (a.pos.size() >= 2) {
                start = iarg(0);
                stop = iarg(1);
                if (a.pos.size() > 2) step = iarg(2);
            } else
                throw Oops("range: expected 1 to 3 arguments");
            if (step == 0) throw Oops("range: step must not be zero");
            // Python's len(range(...)), in wide arithmetic (the bounds may be anywhere in int64).
            const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
            const __int128 mag = step > 0 ? __int128(step) : -__int128(step);
            const __int128 n = span <= 0 ? 0 : (span + mag - 1) / mag;
            const int64_t cap = Budget::current() ? Budget::current()->limits().loop_iterations : 1000000;
            if (n > cap)
                throw Oops(fmt::format("range of {} items: the render exceeds its budget of {} loop iterations",
                                       int64_t(std::min<__int128>(n, INT64_MAX)), cap));
            charge_steps(int64_t(n));
            List out;
            out.reserve(size_t(n));
            for (int64_t i = 0; i < int64_t(n); ++i) out.push_back(Value::integer(start + i * step));
            return Value::make_list(std::move(out));
        });
        auto make_dict = [](bool ns) {
            return [ns](Args& a) {
                Value d = Value::make_dict();
                d.dict->is_namespace = ns;
                for (const Value& p : a.pos)
                    if (p.is_dict())
                        for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
                for (const auto& [k, v] : a.kw) d.dict->set(k, v);
                return d;
            };
        };
        g["namespace"] = Value::func(make_dict(true));
        g["dict"] = Value::func(make_dict(false));
        g["raise_exception"] = Value::func([](Args& a) -> Value {
            throw Oops(fmt::format("raise_exception: {}", a.pos.empty() ? std::string() : to_str(a.pos[0])));
        });
        g["strftime_now"] = Value::func([this](Args& a) {
            if (a.pos.empty() || !a.pos[0].is_string()) throw Oops("strftime_now: expected a format string");
            std::tm tm{};
            if (opt_.now) {
                tm = *opt_.now;
            } else {
                const std::time_t t = std::time(nullptr);
                localtime_r(&t, &tm);
            }
            char buf[512];
            const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
            return Value::str(std::string(buf, n));
        });
    }

    Value lookup(const std::string& name) const {
        for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
            auto f = (*it)->find(name);
            if (f != (*it)->end()) return f->second;
        }
        return Value();
    }

    // ---- statements ----
    Flow exec(const Body& body, std::string& out) {
        for (const auto& n : body) {
            const Flow f = exec_node(*n, out);
            if (f != Flow::kNormal) return f;
        }
        return Flow::kNormal;
    }

    Flow exec_node(const Node& n, std::string& out) {
        Budget& budget = *Budget::current();
        const Nest nest;
        try {
            budget.step();
        } catch (const Oops& o) {
            fail_at(prog_.name, n.line, n.col, o.what());
        }
        switch (n.kind) {
            case Node::Kind::kText:
                append(out, n.text, n);
                return Flow::kNormal;
            case Node::Kind::kOutput:
                append(out, to_str(eval(*n.expr)), n);
                return Flow::kNormal;
            case Node::Kind::kIf:
                for (const auto& [cond, body] : n.branches)
                    if (!cond || truthy(eval(*cond))) return exec(body, out);
                return Flow::kNormal;
            case Node::Kind::kFor:
                return exec_for(n, out);
            case Node::Kind::kSet:
                exec_set(n, eval(*n.expr));
                return Flow::kNormal;
            case Node::Kind::kSetBlock: {
                std::string text;
                exec(n.body, text);
                (*scopes_.back())[n.targets[0]] = Value::str(std::move(text));
                return Flow::kNormal;
            }
            case Node::Kind::kMacro:
                define_macro(n);
                return Flow::kNormal;
            case Node::Kind::kBreak:
            case Node::Kind::kContinue:
                if (loop_depth_ == 0) fail_at(prog_.name, n.line, n.col, "break/continue outside a loop");
                return n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        }
        return Flow::kNormal;
    }

    void append(std::string& out, const std::string& text, const Node& n) {
        try {
            Budget::current()->produced(text.size());
            Budget::current()->growing(out.size() + text.size());
        } catch (const Oops& o) {
            fail_at(prog_.name, n.line, n.col, o.what());
        }
        out += text;
    }

    void bind(Frame& f, const Node& n, const Value& item) {
        if (n.targets.size() == 1) {
            f[n.targets[0]] = item;
            return;
        }
        List parts = item.is_list() ? *item.list : List{};
        if (!item.is_list() || parts.size() != n.targets.size())
            fail_at(prog_.name, n.line, n.col,
                    fmt::format("cannot unpack {} into {} names", repr(item), n.targets.size()));
        for (size_t i = 0; i < parts.size(); ++i) f[n.targets[i]] = parts[i];
    }

    void exec_set(const Node& n, const Value& v) {
        if (n.attr_set) {
            Value ns = lookup(n.targets[0]);
            if (!ns.is_dict() || !ns.dict->is_namespace)
                fail_at(
                    prog_.name, n.line, n.col,
                    fmt::format("cannot set attribute '{}' of '{}': not a namespace()", n.targets[1], n.targets[0]));
            ns.dict->set(n.targets[1], v);
            return;
        }
        bind(*scopes_.back(), n, v);
    }

    Flow exec_for(const Node& n, std::string& out) {
        const Value seq = eval(*n.expr);
        List items;
        try {
            items = iterate(seq);
        } catch (const Oops& e) {
            fail_at(prog_.name, n.expr->line, n.expr->col, e.what());
        }
        scopes_.push_back(std::make_shared<Frame>());
        Frame& f = *scopes_.back();
        if (n.cond) {
            List kept;
            for (const Value& it : items) {
                bind(f, n, it);
                if (truthy(eval(*n.cond))) kept.push_back(it);
            }
            items = std::move(kept);
        }
        ++loop_depth_;
        const int64_t len = int64_t(items.size());
        for (int64_t i = 0; i < len; ++i) {
            try {
                Budget::current()->loop_iteration();
            } catch (const Oops& o) {
                fail_at(prog_.name, n.line, n.col, o.what());
            }
            bind(f, n, items[size_t(i)]);
            Value loop = Value::make_dict();
            Dict& d = *loop.dict;
            d.set("index", Value::integer(i + 1));
            d.set("index0", Value::integer(i));
            d.set("revindex", Value::integer(len - i));
            d.set("revindex0", Value::integer(len - i - 1));
            d.set("first", Value::boolean(i == 0));
            d.set("last", Value::boolean(i == len - 1));
            d.set("length", Value::integer(len));
            d.set("depth", Value::integer(1));
            d.set("depth0", Value::integer(0));
            if (i > 0) d.set("previtem", items[size_t(i - 1)]);
            if (i + 1 < len) d.set("nextitem", items[size_t(i + 1)]);
            d.set("cycle", Value::func([i](Args& a) {
                      if (a.pos.empty()) throw Oops("loop.cycle: no arguments");
                      return a.pos[size_t(i) % a.pos.size()];
                  }));
            f["loop"] = loop;
            if (exec(n.body, out) == Flow::kBreak) break;
        }
        --loop_depth_;
        scopes_.pop_back();
        if (items.empty()) exec(n.else_body, out);
        return Flow::kNormal;
    }

    void define_macro(const Node& n) {
        const Node* node = &n;
        (*scopes_.back())[n.text] = Value::func([this, node](Args& a) {
            if (++call_depth_ > kMaxCallDepth) throw Oops(fmt::format("macro '{}': recursion too deep", node->text));
            auto frame = std::make_shared<Frame>();
            if (a.pos.size() > node->params.size())
                throw Oops(fmt::format("macro '{}' takes {} arguments, got {}", node->text, node->params.size(),
                                       a.pos.size()));
            for (size_t i = 0; i < node->params.size(); ++i) {
                const auto& [pname, def] = node->params[i];
                if (i < a.pos.size())
                    (*frame)[pname] = a.pos[i];
                else if (const Value* kv = a.kwarg(pname))
                    (*frame)[pname] = *kv;
                else if (def)
                    (*frame)[pname] = eval(*def);
                else
                    (*frame)[pname] = Value();
            }
            for (const auto& [k, v] : a.kw) {
                bool known = false;
                for (const auto& p : node->params) known = known || p.first == k;
                if (!known) throw Oops(fmt::format("macro '{}' has no parameter '{}'", node->text, k));
            }
            std::vector<std::shared_ptr<Frame>> saved = {scopes_[0], frame};
            std::swap(saved, scopes_);
            const int saved_loops = loop_depth_;
            loop_depth_ = 0;
            std::string text;
            try {
                exec(node->body, text);
            } catch (...) {
                std::swap(saved, scopes_);
                loop_depth_ = saved_loops;
                --call_depth_;
                throw;
            }
            std::swap(saved, scopes_);
            loop_depth_ = saved_loops;
            --call_depth_;
            return Value::str(std::move(text));
        });
    }

    // ---- expressions ----
    Value eval(const Expr& e) {
        try {
            const Nest nest;
            Budget& budget = *Budget::current();
            budget.step();
            Value v = eval_inner(e);
            if (v.is_string()) budget.produced(v.s.size());
            return v;
        } catch (const Oops& o) {
            fail_at(prog_.name, e.line, e.col, o.what());
        }
    }

    static std::string describe(const Expr& e) {
        if (e.kind == Expr::Kind::kName) return e.name;
        if (e.kind == Expr::Kind::kAttr) return describe(*e.args[0]) + "." + e.name;
        if (e.kind == Expr::Kind::kIndex && e.args[1]->kind == Expr::Kind::kLiteral)
            return describe(*e.args[0]) + "[" + repr(e.args[1]->literal) + "]";
        if (e.kind == Expr::Kind::kIndex) return describe(*e.args[0]) + "[...]";
        return "the value";
    }

    Value need_defined(const Expr& e) {
        Value v = eval(e);
        if (v.undefined()) throw Oops(fmt::format("'{}' is undefined", describe(e)));
        return v;
    }

    Args eval_args(const Expr& e, size_t first) {
        Args a;
        for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
        for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
        return a;
    }

    Value eval_inner(const Expr& e) {
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
                return apply_filter(
                    e.name, v, a, [](const Value& x, const std::string& t, Args& ta) { return apply_test(t, x, ta); });
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
                return v.kind == Value::Kind::kFloat ? Value::real(-v.f)
                                                     : Value::integer(-(v.kind == Value::Kind::kBool ? v.b : v.i));
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

    static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

    Value index(const Value& obj, const Value& key) {
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

    Value slice(const Value& obj, const Expr& e) {
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
        charge_steps(std::max<int64_t>(0, st > 0 ? (stop - start) / st : (start - stop) / -st));
        List l;
        std::string s;
        for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) {
            if (obj.is_list())
                l.push_back((*obj.list)[size_t(i)]);
            else
                s += cps[size_t(i)];
        }
        return obj.is_list() ? Value::make_list(std::move(l)) : Value::str(std::move(s));
    }

    Value binary(const Expr& e) {
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
        if (op == "*" && (a.is_string() || b.is_string()) &&
            (a.kind == Value::Kind::kInt || b.kind == Value::Kind::kInt)) {
            const std::string& s = a.is_string() ? a.s : b.s;
            const int64_t k = a.is_string() ? b.i : a.i;
            if (k > 0 && !s.empty()) charge_growing(uint64_t(k) > (uint64_t(1) << 48) / s.size() ? SIZE_MAX : s.size() * size_t(k));
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
        if (op == "+") return ints ? Value::integer(x + y) : Value::real(fx + fy);
        if (op == "-") return ints ? Value::integer(x - y) : Value::real(fx - fy);
        if (op == "*") return ints ? Value::integer(x * y) : Value::real(fx * fy);
        if (op == "/") {
            if (fy == 0) throw Oops("division by zero");
            return Value::real(fx / fy);
        }
        if (op == "//" || op == "%") {
            if (fy == 0) throw Oops(op == "%" ? "modulo by zero" : "division by zero");
            if (ints) {
                int64_t q = x / y, r = x % y;
                if (r != 0 && ((r < 0) != (y < 0))) {
                    --q;
                    r += y;
                }
                return Value::integer(op == "//" ? q : r);
            }
            const double q = std::floor(fx / fy);
            return Value::real(op == "//" ? q : fx - q * fy);
        }
        if (op == "**") {
            if (ints && y >= 0) {
                int64_t r = 1;
                for (int64_t i = 0; i < y && i < 64; ++i) r *= x;
                return Value::integer(r);
            }
            return Value::real(std::pow(fx, fy));
        }
        throw Oops(fmt::format("unknown operator '{}'", op));
    }

    static bool contains(const Value& hay, const Value& needle) {
        if (hay.is_string()) {
            if (!needle.is_string()) throw Oops(fmt::format("'in <string>' needs a string, not {}", kind_name(needle)));
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

    const Program& prog_;
    RenderOptions opt_;
    std::vector<std::shared_ptr<Frame>> scopes_;
    int loop_depth_ = 0, call_depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source, std::string name) : program_(parse_template(source, std::move(name))) {}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
    return Evaluator(*program_, options).run(context);
}

const std::string& Template::name() const {
    return program_->name;
}

}  // namespace lattice::jinja
