// Python's str operations on UTF-8 text as the Jinja engine's filters and string methods use them
// (jinja_filters.cpp; declared in jinja_internal.h): strip with a set of code points, ASCII case, title,
// capitalize, replace with a count, split with a separator and maxsplit, with Python's whitespace (str.isspace
// over code points). replace charges the render budget as its result grows (charge_growing), as the built-ins do.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

bool py_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

// Python's str.isspace() for one UTF-8 code point.
bool py_space_cp(const std::string& cp) {
    if (cp.size() == 1) return py_space(static_cast<unsigned char>(cp[0]));
    static const char* kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
                                    "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                    "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
    for (const char* sp : kSpaces)
        if (cp == sp) return true;
    return false;
}

}  // namespace

// Python's str.strip / lstrip / rstrip: whitespace, or any code point of `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
    const bool custom = chars && chars->is_string();
    if (chars && !custom && !chars->is_none() && !chars->undefined()) throw Oops("strip: chars must be a string");
    const std::vector<std::string> set = custom ? code_points(chars->s) : std::vector<std::string>{};
    auto drop = [&](const std::string& cp) {
        return custom ? std::find(set.begin(), set.end(), cp) != set.end() : py_space_cp(cp);
    };
    const std::vector<std::string> cps = code_points(s);
    size_t b = 0, e = cps.size();
    if (left)
        while (b < e && drop(cps[b])) ++b;
    if (right)
        while (e > b && drop(cps[e - 1])) --e;
    std::string out;
    for (size_t i = b; i < e; ++i) out += cps[i];
    return out;
}

// ASCII letters upper- or lower-cased, other bytes kept (Python's str.upper / lower on ASCII text).
std::string ascii_case(std::string s, bool upper) {
    for (char& c : s)
        c = char(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// str.title: a letter after a non-letter upper-cased, after a letter lower-cased (ASCII).
std::string title(const std::string& s) {
    std::string out = s;
    bool prev_letter = false;
    for (char& c : out) {
        const bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
        if (letter)
            c = char(prev_letter ? std::tolower(static_cast<unsigned char>(c))
                                 : std::toupper(static_cast<unsigned char>(c)));
        prev_letter = letter;
    }
    return out;
}

// str.capitalize: the first character upper-cased, the rest lower-cased (ASCII).
std::string capitalize(const std::string& s) {
    std::string out = ascii_case(s, false);
    if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
}

// str.replace(from, to, count): count < 0 replaces all; an empty `from` inserts `to` around every code point.
std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string out;
    size_t at = 0;
    int64_t done = 0;
    if (from.empty()) {  // Python inserts `to` around every character
        for (const std::string& cp : code_points(s)) {
            if (count >= 0 && done >= count) {
                out += cp;
                continue;
            }
            charge_growing(out.size() + to.size() + cp.size());
            out += to + cp;
            ++done;
        }
        if (count < 0 || done < count) out += to;
        return out;
    }
    for (;;) {
        const size_t hit = (count >= 0 && done >= count) ? std::string::npos : s.find(from, at);
        if (hit == std::string::npos) break;
        charge_growing(out.size() + (hit - at) + to.size());
        out += s.substr(at, hit - at) + to;
        at = hit + from.size();
        ++done;
    }
    return out + s.substr(at);
}

// str.split(sep, maxsplit): no sep (or None) splits on runs of whitespace with no empty parts; maxsplit < 0: all.
Value split(const std::string& s, const Value* sep, int64_t maxsplit) {
    List parts;
    if (!sep || sep->is_none()) {  // runs of whitespace, no empty parts
        size_t i = 0;
        while (i < s.size()) {
            while (i < s.size() && py_space(static_cast<unsigned char>(s[i]))) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) {
                parts.push_back(Value::str(strip(s.substr(i), nullptr, false, true)));
                break;
            }
            size_t j = i;
            while (j < s.size() && !py_space(static_cast<unsigned char>(s[j]))) ++j;
            parts.push_back(Value::str(s.substr(i, j - i)));
            i = j;
        }
        return Value::make_list(std::move(parts));
    }
    if (!sep->is_string()) throw Oops("split: the separator must be a string");
    if (sep->s.empty()) throw Oops("split: empty separator");
    size_t at = 0;
    for (;;) {
        const size_t hit =
            (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) ? std::string::npos : s.find(sep->s, at);
        if (hit == std::string::npos) break;
        parts.push_back(Value::str(s.substr(at, hit - at)));
        at = hit + sep->s.size();
    }
    parts.push_back(Value::str(s.substr(at)));
    return Value::make_list(std::move(parts));
}

}  // namespace lattice::jinja
