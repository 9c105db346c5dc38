// The evaluator of the Jinja engine (jinja.h): runs the AST over Values. Scopes follow jinja2: a
// for loop's body has its own scope (a `set` inside does not leak out; namespace() attributes do),
// `if` has none, a macro sees the template's top-level names and its parameters. Globals are
// jinja2's range, dict, namespace and transformers' raise_exception and strftime_now.
// Every statement and expression charges the render's Budget (jinja.h): a step and a level of
// nesting each, the strings it makes; loops an iteration per item; string building is checked
// before the string grows, so a runaway template ends before it allocates past a limit.
// The Evaluator class is declared in jinja_evaluator.h; its expression half is jinja_eval_expr.cpp.
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "base/error.h"
#include "runtime/tokenizer/jinja_evaluator.h"
#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

constexpr int kMaxCallDepth = 64;  // macro recursion (real templates nest a few levels)

}  // namespace

Evaluator::~Evaluator() {
    for (const auto& w : namespaces_)
        if (const std::shared_ptr<Dict> d = w.lock()) d->items.clear();
}

std::string Evaluator::run(const nlohmann::ordered_json& context) {
    if (!context.is_object() && !context.is_null()) throw Error("chat template context must be a JSON object");
    Budget budget(opt_.limits, context, opt_.usage);
    try {
        if (context.is_object())
            for (auto it = context.begin(); it != context.end(); ++it) (*scopes_[0])[it.key()] = from_json(it.value());
    } catch (const Oops& o) {
        throw Error(fmt::format("chat template '{}': the context: {}", prog_.name, o.what()));
    }
    std::string out;
    exec(prog_.body, out);
    return out;
}

void Evaluator::install_globals(Frame& g) {
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
    g["namespace"] = Value::func([this, build = make_dict(true)](Args& a) {
        Value d = build(a);
        namespaces_.push_back(d.dict);
        return d;
    });
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

Value Evaluator::lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
        auto f = (*it)->find(name);
        if (f != (*it)->end()) return f->second;
    }
    return Value();
}

Flow Evaluator::exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
        const Flow f = exec_node(*n, out);
        if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
}

// Every Oops a statement raises outside its expressions (printing a value, unpacking, a budget
// charge) becomes an Error at the statement's line; an expression's own carry its position already.
Flow Evaluator::exec_node(const Node& n, std::string& out) {
    try {
        return run_node(n, out);
    } catch (const Oops& o) {
        fail_at(prog_.name, n.line, n.col, o.what());
    }
}

Flow Evaluator::run_node(const Node& n, std::string& out) {
    const Nest nest;
    Budget::current()->step();
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

void Evaluator::append(std::string& out, const std::string& text, const Node& n) {
    try {
        Budget::current()->produced(text.size());
        Budget::current()->growing(out.size() + text.size());
    } catch (const Oops& o) {
        fail_at(prog_.name, n.line, n.col, o.what());
    }
    out += text;
}

void Evaluator::bind(Frame& f, const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
        f[n.targets[0]] = item;
        return;
    }
    List parts = item.is_list() ? *item.list : List{};
    if (!item.is_list() || parts.size() != n.targets.size())
        fail_at(prog_.name, n.line, n.col, fmt::format("cannot unpack {} into {} names", repr(item), n.targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) f[n.targets[i]] = parts[i];
}

void Evaluator::exec_set(const Node& n, const Value& v) {
    if (n.attr_set) {
        Value ns = lookup(n.targets[0]);
        if (!ns.is_dict() || !ns.dict->is_namespace)
            fail_at(prog_.name, n.line, n.col,
                    fmt::format("cannot set attribute '{}' of '{}': not a namespace()", n.targets[1], n.targets[0]));
        try {
            ns.dict->set(n.targets[1], v);
        } catch (const Oops& o) {
            fail_at(prog_.name, n.line, n.col, o.what());
        }
        return;
    }
    bind(*scopes_.back(), n, v);
}

Flow Evaluator::exec_for(const Node& n, std::string& out) {
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
        Value loop;
        try {
            Budget::current()->loop_iteration();
            loop = loop_value(items, i);
        } catch (const Oops& o) {
            fail_at(prog_.name, n.line, n.col, o.what());
        }
        bind(f, n, items[size_t(i)]);
        f["loop"] = loop;
        if (exec(n.body, out) == Flow::kBreak) break;
    }
    --loop_depth_;
    scopes_.pop_back();
    if (items.empty()) exec(n.else_body, out);
    return Flow::kNormal;
}

// jinja2's `loop` for item i of items.
Value Evaluator::loop_value(const List& items, int64_t i) {
    const int64_t len = int64_t(items.size());
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
    return loop;
}

void Evaluator::define_macro(const Node& n) {
    const Node* node = &n;
    (*scopes_.back())[n.text] = Value::func([this, node](Args& a) {
        if (++call_depth_ > kMaxCallDepth) throw Oops(fmt::format("macro '{}': recursion too deep", node->text));
        auto frame = std::make_shared<Frame>();
        if (a.pos.size() > node->params.size())
            throw Oops(
                fmt::format("macro '{}' takes {} arguments, got {}", node->text, node->params.size(), a.pos.size()));
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

Template::Template(std::string_view source, std::string name) : program_(parse_template(source, std::move(name))) {}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
    return Evaluator(*program_, options).run(context);
}

const std::string& Template::name() const {
    return program_->name;
}

}  // namespace lattice::jinja
