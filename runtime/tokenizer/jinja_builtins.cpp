// Python's semantics of the Jinja engine's values (jinja.h): truth, str(), repr(), comparisons, json.dumps
// (as transformers' tojson calls it: ensure_ascii=False, key order kept), JSON in, iteration, len() and code
// points. The value type's storage (freeing, nesting, lists, dicts, call arguments) is jinja_value.cpp's;
// the filters, tests and methods are jinja_filters.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

const char* kind_name(const Value& v) {
    switch (v.kind) {
        case Value::Kind::kUndefined:
            return "undefined";
        case Value::Kind::kNone:
            return "none";
        case Value::Kind::kBool:
            return "boolean";
        case Value::Kind::kInt:
            return "integer";
        case Value::Kind::kFloat:
            return "float";
        case Value::Kind::kString:
            return "string";
        case Value::Kind::kList:
            return "list";
        case Value::Kind::kDict:
            return v.dict->is_namespace ? "namespace" : "dict";
        case Value::Kind::kFunc:
            return "function";
    }
    return "?";
}

bool truthy(const Value& v) {
    switch (v.kind) {
        case Value::Kind::kUndefined:
        case Value::Kind::kNone:
            return false;
        case Value::Kind::kBool:
            return v.b;
        case Value::Kind::kInt:
            return v.i != 0;
        case Value::Kind::kFloat:
            return v.f != 0;
        case Value::Kind::kString:
            return !v.s.empty();
        case Value::Kind::kList:
            return !v.list->empty();
        case Value::Kind::kDict:
            return v.dict->is_namespace || !v.dict->items.empty();
        case Value::Kind::kFunc:
            return true;
    }
    return false;
}

namespace {

// Python's repr(float): the shortest digits that round-trip, positional for exponents in [-4, 16),
// else d.ddde+XX; ".0" on integral values.
std::string float_text(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    std::string sign;
    if (sci[0] == '-') {
        sign = "-";
        sci = sci.substr(1);
    }
    const size_t e = sci.find('e');
    std::string digits = sci.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exp = std::stoi(sci.substr(e + 1));
    if (exp < -4 || exp >= 16) {
        std::string mant = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
        return sign + mant + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
    }
    std::string out;
    if (exp < 0) {
        out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
        out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
        out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return sign + out;
}

std::string py_quote(const std::string& s) {
    const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
    const char q = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\')
            out += "\\\\";
        else if (c == q)
            out += std::string("\\") + char(q);
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20 || c == 0x7f)
            out += fmt::format("\\x{:02x}", c);
        else
            out += char(c);
    }
    return out + q;
}

void json_string(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20)
                    out += fmt::format("\\u{:04x}", c);
                else
                    out += char(c);
        }
    }
    out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, int depth) {
    const Nest nest;
    charge_growing(out.size());
    auto newline = [&](int d) {
        if (indent < 0) return;
        const size_t pad = size_t(indent) * size_t(d);  // tojson clamps indent to 2^20; d is under the depth limit
        charge_growing(out.size() + 1 + pad);
        out += '\n';
        out.append(pad, ' ');
    };
    const char* item_sep = indent < 0 ? ", " : ",";
    switch (v.kind) {
        case Value::Kind::kNone:
            out += "null";
            return;
        case Value::Kind::kBool:
            out += v.b ? "true" : "false";
            return;
        case Value::Kind::kInt:
            out += std::to_string(v.i);
            return;
        case Value::Kind::kFloat:
            out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_text(v.f);
            return;
        case Value::Kind::kString:
            json_string(out, v.s);
            return;
        case Value::Kind::kList:
            if (v.list->empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t i = 0; i < v.list->size(); ++i) {
                if (i) out += item_sep;
                newline(depth + 1);
                json_dump(out, (*v.list)[i], indent, depth + 1);
            }
            newline(depth);
            out += ']';
            return;
        case Value::Kind::kDict:
            if (v.dict->items.empty()) {
                out += "{}";
                return;
            }
            out += '{';
            for (size_t i = 0; i < v.dict->items.size(); ++i) {
                if (i) out += item_sep;
                newline(depth + 1);
                json_string(out, v.dict->items[i].first);
                out += ": ";
                json_dump(out, v.dict->items[i].second, indent, depth + 1);
            }
            newline(depth);
            out += '}';
            return;
        default:
            throw Oops(fmt::format("tojson: a {} value is not JSON serializable", kind_name(v)));
    }
}

// Bytes of the UTF-8 sequence a lead byte starts (1 for a byte that starts none).
size_t cp_bytes(unsigned char c) {
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

double num(const Value& v) {
    return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kBool ? v.b : double(v.i);
}

}  // namespace

std::string repr(const Value& v) {
    const Nest nest;
    switch (v.kind) {
        case Value::Kind::kString:
            return py_quote(v.s);
        case Value::Kind::kList: {
            std::string out = v.tuple ? "(" : "[";
            for (size_t i = 0; i < v.list->size(); ++i) {
                out += (i ? ", " : "") + repr((*v.list)[i]);
                charge_growing(out.size());
            }
            return out + (v.tuple ? (v.list->size() == 1 ? ",)" : ")") : "]");
        }
        case Value::Kind::kDict: {
            std::string out = "{";
            for (size_t i = 0; i < v.dict->items.size(); ++i) {
                out += (i ? ", " : "") + py_quote(v.dict->items[i].first) + ": " + repr(v.dict->items[i].second);
                charge_growing(out.size());
            }
            return out + "}";
        }
        default:
            return to_str(v);
    }
}

std::string to_str(const Value& v) {
    switch (v.kind) {
        case Value::Kind::kUndefined:
            return "";
        case Value::Kind::kNone:
            return "None";
        case Value::Kind::kBool:
            return v.b ? "True" : "False";
        case Value::Kind::kInt:
            return std::to_string(v.i);
        case Value::Kind::kFloat:
            return float_text(v.f);
        case Value::Kind::kString:
            return v.s;
        case Value::Kind::kFunc:
            return "<function>";
        default:
            return repr(v);
    }
}

std::string to_json_text(const Value& v, int indent) {
    std::string out;
    json_dump(out, v, indent, 0);
    return out;
}

bool equal(const Value& a, const Value& b) {
    const Nest nest;
    charge_steps(1);
    if (a.is_number() && b.is_number()) return num(a) == num(b);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case Value::Kind::kUndefined:
        case Value::Kind::kNone:
            return true;
        case Value::Kind::kString:
            if (a.s.size() == b.s.size()) charge_scan(a.s.size());
            return a.s == b.s;
        case Value::Kind::kList:
            if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
            for (size_t i = 0; i < a.list->size(); ++i)
                if (!equal((*a.list)[i], (*b.list)[i])) return false;
            return true;
        case Value::Kind::kDict:
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (const auto& [k, v] : a.dict->items) {
                const Value* o = b.dict->find(k);
                if (!o || !equal(v, *o)) return false;
            }
            return true;
        default:
            return a.fn == b.fn;
    }
}

bool less(const Value& a, const Value& b) {
    const Nest nest;
    charge_steps(1);
    if (a.is_number() && b.is_number()) return num(a) < num(b);
    if (a.is_string() && b.is_string()) {
        charge_scan(std::min(a.s.size(), b.s.size()));
        return a.s < b.s;
    }
    if (a.is_list() && b.is_list()) {
        return std::lexicographical_compare(a.list->begin(), a.list->end(), b.list->begin(), b.list->end(), less);
    }
    throw Oops(fmt::format("cannot compare {} and {} with '<'", kind_name(a), kind_name(b)));
}

Value from_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null:
            return Value::none();
        case nlohmann::ordered_json::value_t::boolean:
            return Value::boolean(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer:
            return Value::integer(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned:
            return Value::integer(int64_t(j.get<uint64_t>()));
        case nlohmann::ordered_json::value_t::number_float:
            return Value::real(j.get<double>());
        case nlohmann::ordered_json::value_t::string:
            return Value::str(j.get<std::string>());
        case nlohmann::ordered_json::value_t::array: {
            List l;
            for (const auto& e : j) l.push_back(from_json(e));
            return Value::make_list(std::move(l));
        }
        case nlohmann::ordered_json::value_t::object: {
            Value d = Value::make_dict();
            for (auto it = j.begin(); it != j.end(); ++it) {
                d.dict->items.emplace_back(it.key(), from_json(it.value()));
                d.dict->holds(d.dict->items.back().second);
            }
            return d;
        }
        default:
            return Value();
    }
}

std::vector<std::string> code_points(const std::string& s) {
    charge_steps(int64_t(s.size() / 16));  // a step is about an expression's work: ~16 bytes split here
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = std::min(cp_bytes(c), s.size() - i);
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

List iterate(const Value& v) {
    switch (v.kind) {
        case Value::Kind::kUndefined:
            return {};
        case Value::Kind::kList:
            if (Budget* b = Budget::current()) b->copied(*v.list);
            return *v.list;
        case Value::Kind::kDict: {
            charge_steps(int64_t(v.dict->items.size()));
            List keys;
            for (const auto& kv : v.dict->items) keys.push_back(Value::str(kv.first));
            return keys;
        }
        case Value::Kind::kString: {
            List chars;
            for (auto& c : code_points(v.s)) chars.push_back(Value::str(std::move(c)));
            return chars;
        }
        default:
            throw Oops(fmt::format("a {} value is not iterable", kind_name(v)));
    }
}

int64_t length(const Value& v) {
    switch (v.kind) {
        case Value::Kind::kUndefined:
            return 0;
        case Value::Kind::kString: {
            charge_scan(v.s.size());
            int64_t n = 0;  // code_points(v.s).size() without making them
            for (size_t i = 0; i < v.s.size(); ++n) i += std::min(cp_bytes(static_cast<unsigned char>(v.s[i])), v.s.size() - i);
            return n;
        }
        case Value::Kind::kList:
            return int64_t(v.list->size());
        case Value::Kind::kDict:
            return int64_t(v.dict->items.size());
        default:
            throw Oops(fmt::format("a {} value has no length", kind_name(v)));
    }
}

}  // namespace lattice::jinja
