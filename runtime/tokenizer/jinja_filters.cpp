// The filters, tests and methods of the Jinja engine (jinja.h), with the semantics of jinja2's
// built-ins and of Python's str and dict methods. What chat templates use:
//   filters  trim tojson(indent) length count upper lower capitalize title replace join first last
//            default(d) items string list selectattr rejectattr select reject map int float abs
//            round reverse sort unique safe
//   tests    defined undefined none string mapping iterable sequence number integer float boolean
//            true false callable equalto eq == ne != lt < gt > le <= ge >= in odd even divisibleby
//            lower upper
//   methods  str: startswith endswith split strip lstrip rstrip upper lower title capitalize replace
//            find count join;  dict: get items keys values
// Python's str algorithms they share (strip, case, replace, split) are in jinja_strings.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

const Value& need_string(const Value* v, const char* what) {
    if (!v || !v->is_string()) throw Oops(fmt::format("{}: expected a string argument", what));
    return *v;
}

int64_t int_arg(const Value* v, int64_t fallback, const char* what) {
    if (!v || v->undefined() || v->is_none()) return fallback;
    if (v->kind != Value::Kind::kInt) throw Oops(fmt::format("{}: expected an integer argument", what));
    return v->i;
}

// Jinja's attribute lookup for filters such as selectattr("role"): dotted paths, dict keys.
Value attribute(const Value& v, const std::string& path) {
    Value cur = v;
    size_t at = 0;
    while (at <= path.size()) {
        const size_t dot = path.find('.', at);
        const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
        if (cur.is_dict()) {
            const Value* f = cur.dict->find(part);
            cur = f ? *f : Value();
        } else if (cur.is_list() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
            size_t i = 0;  // an index past size_t is past the list too
            const auto res = std::from_chars(part.data(), part.data() + part.size(), i);
            cur = res.ec == std::errc() && i < cur.list->size() ? (*cur.list)[i] : Value();
        } else {
            cur = Value();
        }
        if (dot == std::string::npos) break;
        at = dot + 1;
    }
    return cur;
}

Args rest_args(const Args& a, size_t from) {
    Args r;
    for (size_t i = from; i < a.pos.size(); ++i) r.pos.push_back(a.pos[i]);
    r.kw = a.kw;
    return r;
}

Value select(const Value& v, Args& args, const TestFn& test, bool by_attr, bool keep) {
    List out;
    for (const Value& item : iterate(v)) {
        bool ok;
        if (by_attr) {
            const Value& attr = need_string(args.get(0, "attribute"), "selectattr");
            const Value x = attribute(item, attr.s);
            if (args.pos.size() < 2) {
                ok = truthy(x);
            } else {
                Args targs = rest_args(args, 2);
                ok = test(x, need_string(&args.pos[1], "selectattr").s, targs);
            }
        } else if (args.pos.empty()) {
            ok = truthy(item);
        } else {
            Args targs = rest_args(args, 1);
            ok = test(item, need_string(&args.pos[0], "select").s, targs);
        }
        if (ok == keep) out.push_back(item);
    }
    return Value::make_list(std::move(out));
}

Value str_method_call(const Value& self, const std::string& name, Args& a) {
    const std::string& s = self.s;
    if (name == "startswith" || name == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) throw Oops(name + ": missing argument");
        List opts = p->is_list() ? *p->list : List{*p};
        for (const Value& o : opts) {
            const std::string& x = need_string(&o, name.c_str()).s;
            if (name == "startswith" ? s.starts_with(x) : s.ends_with(x)) return Value::boolean(true);
        }
        return Value::boolean(false);
    }
    if (name == "split") return split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1, "split"));
    if (name == "strip") return Value::str(strip(s, a.get(0, "chars"), true, true));
    if (name == "lstrip") return Value::str(strip(s, a.get(0, "chars"), true, false));
    if (name == "rstrip") return Value::str(strip(s, a.get(0, "chars"), false, true));
    if (name == "upper") return Value::str(ascii_case(s, true));
    if (name == "lower") return Value::str(ascii_case(s, false));
    if (name == "title") return Value::str(title(s));
    if (name == "capitalize") return Value::str(capitalize(s));
    if (name == "replace")
        return Value::str(replace(s, need_string(a.get(0, "old"), "replace").s,
                                  need_string(a.get(1, "new"), "replace").s,
                                  int_arg(a.get(2, "count"), -1, "replace")));
    if (name == "find") {
        charge_scan(s.size());
        const size_t at = s.find(need_string(a.get(0, "sub"), "find").s);
        return Value::integer(at == std::string::npos ? -1 : int64_t(code_points(s.substr(0, at)).size()));
    }
    if (name == "count") {
        const std::string& x = need_string(a.get(0, "sub"), "count").s;
        charge_scan(s.size());
        int64_t n = 0;
        if (x.empty()) return Value::integer(int64_t(code_points(s).size()) + 1);
        for (size_t at = s.find(x); at != std::string::npos; at = s.find(x, at + x.size())) ++n;
        return Value::integer(n);
    }
    if (name == "join") {
        std::string out;
        const Value* items = a.get(0, "iterable");
        if (!items) throw Oops("join: missing argument");
        bool first = true;
        for (const Value& v : iterate(*items)) {
            charge_growing(out.size() + s.size() + (v.is_string() ? v.s.size() : 0));
            if (!first) out += s;
            out += need_string(&v, "join").s;
            first = false;
        }
        return Value::str(out);
    }
    throw Oops(fmt::format("strings have no method '{}'", name));
}

Value pair(const std::string& k, const Value& v) {
    Value p = Value::make_list({Value::str(k), v});
    p.tuple = true;
    return p;
}

Value dict_method_call(const Value& self, const std::string& name, Args& a) {
    const Dict& d = *self.dict;
    if (name == "get") {
        const Value& k = *a.get(0, "key");
        const Value* v = k.is_string() ? d.find(k.s) : nullptr;
        if (v) return *v;
        const Value* def = a.get(1, "default");
        return def ? *def : Value::none();
    }
    charge_steps(int64_t(d.items.size()));
    List out;
    for (const auto& [k, v] : d.items) {
        if (name == "items")
            out.push_back(pair(k, v));
        else if (name == "keys")
            out.push_back(Value::str(k));
        else
            out.push_back(v);
    }
    return Value::make_list(std::move(out));
}

}  // namespace

Value method(const Value& obj, const std::string& name) {
    static const char* kStr[] = {"startswith", "endswith", "split",      "strip",   "lstrip", "rstrip", "upper",
                                 "lower",      "title",    "capitalize", "replace", "find",   "count",  "join"};
    static const char* kDict[] = {"get", "items", "keys", "values"};
    if (obj.is_string()) {
        for (const char* m : kStr)
            if (name == m) return Value::func([obj, name](Args& a) { return str_method_call(obj, name, a); });
    } else if (obj.is_dict() && !obj.dict->is_namespace) {
        for (const char* m : kDict)
            if (name == m) {
                return Value::func([obj, name](Args& a) {
                    if (name == "get" && a.pos.empty()) throw Oops("get: missing key");
                    return dict_method_call(obj, name, a);
                });
            }
    }
    return Value();
}

bool known_filter(std::string_view name) {
    static constexpr std::string_view kNames[] = {
        "trim",   "tojson", "length",  "count", "upper", "lower", "capitalize", "title",   "replace",    "string",
        "safe",   "list",   "default", "d",     "first", "last",  "join",       "items",   "selectattr", "rejectattr",
        "select", "reject", "map",     "int",   "float", "abs",   "round",      "reverse", "sort",       "unique"};
    return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool known_test(std::string_view name) {
    static constexpr std::string_view kNames[] = {
        "defined", "undefined", "none", "string",      "mapping",  "iterable", "sequence", "number", "integer",
        "float",   "boolean",   "true", "false",       "callable", "equalto",  "eq",       "==",     "ne",
        "!=",      "lt",        "<",    "gt",          ">",        "le",       "<=",       "ge",     ">=",
        "in",      "odd",       "even", "divisibleby", "lower",    "upper"};
    return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool apply_test(const std::string& name, const Value& v, Args& a) {
    using K = Value::Kind;
    auto arg = [&]() -> const Value& {
        if (a.pos.empty()) throw Oops(fmt::format("test '{}' needs an argument", name));
        return a.pos[0];
    };
    if (name == "defined") return !v.undefined();
    if (name == "undefined") return v.undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.undefined();
    if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.undefined();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == K::kInt;
    if (name == "float") return v.kind == K::kFloat;
    if (name == "boolean") return v.kind == K::kBool;
    if (name == "true") return v.kind == K::kBool && v.b;
    if (name == "false") return v.kind == K::kBool && !v.b;
    if (name == "callable") return v.kind == K::kFunc;
    if (name == "equalto" || name == "eq" || name == "==") return equal(v, arg());
    if (name == "ne" || name == "!=") return !equal(v, arg());
    if (name == "lt" || name == "<") return less(v, arg());
    if (name == "gt" || name == ">") return less(arg(), v);
    if (name == "le" || name == "<=") return !less(arg(), v);
    if (name == "ge" || name == ">=") return !less(v, arg());
    if (name == "in") {
        for (const Value& x : iterate(arg()))
            if (equal(x, v)) return true;
        return arg().is_string() && v.is_string() && arg().s.find(v.s) != std::string::npos;
    }
    if (name == "odd" || name == "even") {
        if (v.kind != K::kInt) throw Oops(fmt::format("test '{}' needs an integer", name));
        return (((v.i % 2) + 2) % 2 == 1) == (name == "odd");
    }
    if (name == "divisibleby") {
        const Value& d = arg();
        if (v.kind != K::kInt || d.kind != K::kInt || d.i == 0) throw Oops("divisibleby needs non-zero integers");
        return v.i % d.i == 0;
    }
    if (name == "lower" || name == "upper") {
        if (!v.is_string()) return false;
        charge_scan(v.s.size());
        return v.s == ascii_case(v.s, name == "upper");
    }
    throw Oops(fmt::format("unknown test '{}'", name));
}

Value apply_filter(const std::string& name, const Value& v, Args& a, const TestFn& test) {
    using K = Value::Kind;
    if (name == "trim") return Value::str(strip(to_str(v), a.get(0, "chars"), true, true));
    if (name == "tojson") {
        const Value* ind = a.get(0, "indent");
        const int64_t indent = ind && ind->kind == K::kInt ? std::clamp<int64_t>(ind->i, -1, 1 << 20) : -1;
        return Value::str(to_json_text(v, int(indent)));
    }
    if (name == "length" || name == "count") return Value::integer(length(v));
    if (name == "upper" || name == "lower") return Value::str(ascii_case(to_str(v), name == "upper"));
    if (name == "capitalize") return Value::str(capitalize(to_str(v)));
    if (name == "title") return Value::str(title(to_str(v)));
    if (name == "replace")
        return Value::str(replace(to_str(v), to_str(need_string(a.get(0, "old"), "replace")),
                                  to_str(need_string(a.get(1, "new"), "replace")),
                                  int_arg(a.get(2, "count"), -1, "replace")));
    if (name == "string") return Value::str(to_str(v));
    if (name == "safe") return v;
    if (name == "list") return Value::make_list(iterate(v));
    if (name == "default" || name == "d") {
        const Value* def = a.get(0, "default_value");
        const Value* boolean = a.get(1, "boolean");
        const bool use = v.undefined() || (boolean && truthy(*boolean) && !truthy(v));
        return use ? (def ? *def : Value::str("")) : v;
    }
    if (name == "first" || name == "last") {
        List items = iterate(v);
        if (items.empty()) return Value();
        return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
        const Value* sep = a.get(0, "d");
        const Value* attr = a.get(1, "attribute");
        std::string out;
        bool first = true;
        const std::string sep_text = sep ? to_str(*sep) : "";
        for (const Value& x : iterate(v)) {
            const std::string text = to_str(attr ? attribute(x, to_str(*attr)) : x);
            charge_growing(out.size() + sep_text.size() + text.size());
            if (!first) out += sep_text;
            out += text;
            first = false;
        }
        return Value::str(out);
    }
    if (name == "items") {
        if (v.undefined()) return Value::make_list();
        if (!v.is_dict()) throw Oops(fmt::format("items: expected a mapping, got {}", kind_name(v)));
        charge_steps(int64_t(v.dict->items.size()));
        List out;
        for (const auto& [k, x] : v.dict->items) out.push_back(pair(k, x));
        return Value::make_list(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") return select(v, a, test, true, name == "selectattr");
    if (name == "select" || name == "reject") return select(v, a, test, false, name == "select");
    if (name == "map") {
        List out;
        const Value* attr = a.kwarg("attribute");
        for (const Value& x : iterate(v)) {
            if (attr) {
                Value y = attribute(x, to_str(*attr));
                const Value* def = a.kwarg("default");
                out.push_back(y.undefined() && def ? *def : y);
            } else {
                if (a.pos.empty()) throw Oops("map: needs a filter name or attribute=");
                Args fargs = rest_args(a, 1);
                out.push_back(apply_filter(to_str(a.pos[0]), x, fargs, test));
            }
        }
        return Value::make_list(std::move(out));
    }
    if (name == "int") {
        if (v.kind == K::kFloat) {  // Python: OverflowError / ValueError; the cast would be undefined
            if (!(v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0))
                throw Oops(fmt::format("int: {} is not an integer in 64 bits", to_str(v)));
            return Value::integer(int64_t(v.f));
        }
        if (v.kind == K::kInt || v.kind == K::kBool) return Value::integer(v.kind == K::kBool ? v.b : v.i);
        try {
            return Value::integer(std::stoll(strip(to_str(v), nullptr, true, true)));
        } catch (const std::exception&) {
            return Value::integer(0);
        }
    }
    if (name == "float") {
        if (v.is_number()) return Value::real(v.kind == K::kFloat ? v.f : double(v.kind == K::kBool ? v.b : v.i));
        try {
            return Value::real(std::stod(to_str(v)));
        } catch (const std::exception&) {
            return Value::real(0);
        }
    }
    if (name == "abs") {
        if (v.kind == K::kInt) {
            if (v.i == INT64_MIN) throw Oops(fmt::format("abs: |{}| is beyond 64 bits", v.i));
            return Value::integer(v.i < 0 ? -v.i : v.i);
        }
        if (v.kind == K::kFloat) return Value::real(std::fabs(v.f));
        throw Oops("abs: expected a number");
    }
    if (name == "round") {
        const int64_t digits = int_arg(a.get(0, "precision"), 0, "round");
        const double m = std::pow(10.0, double(digits));
        if (!v.is_number()) throw Oops("round: expected a number");
        const double x = v.kind == K::kFloat ? v.f : double(v.i);
        return Value::real(std::round(x * m) / m);
    }
    if (name == "reverse") {
        if (v.is_string()) {
            auto cps = code_points(v.s);
            std::string out;
            for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
            return Value::str(out);
        }
        List items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::make_list(std::move(items));
    }
    if (name == "sort") {
        List items = iterate(v);
        const Value* attr = a.kwarg("attribute");
        const Value* rev = a.get(0, "reverse");
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
            return attr ? less(attribute(x, to_str(*attr)), attribute(y, to_str(*attr))) : less(x, y);
        });
        if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
        return Value::make_list(std::move(items));
    }
    if (name == "unique") {
        List out;
        for (const Value& x : iterate(v))
            if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
        return Value::make_list(std::move(out));
    }
    throw Oops(fmt::format("unknown filter '{}'", name));
}

}  // namespace lattice::jinja
