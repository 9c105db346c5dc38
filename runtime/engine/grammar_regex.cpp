// Regex -> Nfa (vLLM's guided_regex, whole-match). Parsed into a small AST, then emitted as a
// Thompson-style automaton over code points (each character set becomes UTF-8 byte ranges, so `.`
// and negated classes accept exactly valid UTF-8).
// Supported: literals, escapes (\d \w \s \D \W \S, \n \t \r \f \v \0, \xHH, \uHHHH, an escaped
// punctuation character), classes [a-z0-9_] and [^...] (escapes inside), `.` (any character but \n),
// groups (...), (?:...), (?P<name>...), (?<name>...), |, * + ? {m} {m,} {m,n} (a lazy `?` after a
// quantifier changes nothing for a whole match; a `{` that opens no quantifier is a literal, as in
// Python), a leading ^ and a trailing $. \d \w \s are ASCII
// classes, not Python's Unicode ones.
// Refused with the construct and its byte offset: backreferences, lookaround, \b \B \A \Z, anchors
// elsewhere, possessive quantifiers, inline flags, {m,n} above 1000, a pattern of more than 20000
// automaton states (nested repetitions), anything unknown.
#include <algorithm>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice {

namespace {

using Ranges = grammar_detail::NfaBuilder::Ranges;
constexpr int kUnbounded = -1;
constexpr int kMaxRepeat = 1000;
constexpr int32_t kMaxRegexStates = 20000;

struct Node {
    enum Kind { kSet, kConcat, kAlt, kRepeat } kind = kConcat;
    Ranges set;
    std::vector<Node> kids;
    int min = 0, max = 0;
};

Ranges normalize(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (auto [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1)
            out.back().second = std::max(out.back().second, hi);
        else
            out.emplace_back(lo, hi);
    }
    return out;
}

Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (auto [lo, hi] : normalize(r)) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
    return out;
}

class Parser {
public:
    explicit Parser(const std::string& p) : p_(p) {}
    Node parse() {
        if (!p_.empty() && p_[0] == '^') ++i_;
        size_t end = p_.size();
        if (end > i_ && p_[end - 1] == '$' && !escaped_at(end - 1)) --end;
        end_ = end;
        Node n = alt();
        if (i_ < end_) fail(p_[i_] == ')' ? "an unmatched ')'" : "an unexpected character");
        return n;
    }

private:
    [[noreturn]] void fail(const std::string& what, size_t at = SIZE_MAX) const {
        LATTICE_FAIL("guided_regex: {} at offset {} is not supported", what, at == SIZE_MAX ? i_ : at);
    }
    bool escaped_at(size_t k) const {  // whether p_[k] is preceded by an odd number of backslashes
        size_t n = 0;
        while (k > n && p_[k - n - 1] == '\\') ++n;
        return n % 2 == 1;
    }
    bool more() const { return i_ < end_; }
    char peek() const { return p_[i_]; }
    uint32_t utf8_char() {
        const uint8_t b = uint8_t(p_[i_]);
        const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
        if (n == 0 || i_ + size_t(n) > end_) fail("invalid UTF-8");
        uint32_t c = n == 1 ? b : b & (0xFF >> (n + 1));
        for (int k = 1; k < n; ++k) {
            const uint8_t cb = uint8_t(p_[i_ + size_t(k)]);
            if ((cb & 0xC0) != 0x80) fail("invalid UTF-8");
            c = (c << 6) | (cb & 0x3F);
        }
        static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};  // shorter encodings are overlong
        if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) fail("invalid UTF-8");
        i_ += size_t(n);
        return c;
    }
    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k, ++i_) {
            if (!more() || !isxdigit(uint8_t(peek()))) fail("a malformed hex escape");
            v = v * 16 + uint32_t(isdigit(uint8_t(peek())) ? peek() - '0' : (tolower(peek()) - 'a' + 10));
        }
        return v;
    }
    static Node set(Ranges r) {
        Node n;
        n.kind = Node::kSet;
        n.set = normalize(std::move(r));
        return n;
    }
    // After a backslash: the set the escape stands for (class: inside [...]).
    Ranges escape(bool in_class) {
        const size_t at = i_ - 1;
        if (!more()) fail("a trailing backslash", at);
        const char c = peek();
        static const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                            space = {{'\t', '\r'}, {' ', ' '}};
        ++i_;
        switch (c) {
            case 'd':
                return digit;
            case 'D':
                return complement(digit);
            case 'w':
                return word;
            case 'W':
                return complement(word);
            case 's':
                return space;
            case 'S':
                return complement(space);
            case 'n':
                return {{'\n', '\n'}};
            case 't':
                return {{'\t', '\t'}};
            case 'r':
                return {{'\r', '\r'}};
            case 'f':
                return {{'\f', '\f'}};
            case 'v':
                return {{'\v', '\v'}};
            case '0':
                return {{0, 0}};
            case 'x': {
                const uint32_t v = hex(2);
                return {{v, v}};
            }
            case 'u': {
                const uint32_t v = hex(4);
                return {{v, v}};
            }
            default:
                break;
        }
        if (isdigit(uint8_t(c))) fail("a backreference", at);
        if (c == 'b' || c == 'B') fail(in_class ? "\\b in a class" : "a word boundary \\b / \\B", at);
        if (isalnum(uint8_t(c))) fail(std::string("the escape \\") + c, at);
        --i_;
        const uint32_t lit = utf8_char();
        return {{lit, lit}};
    }
    Node klass() {
        const size_t at = i_ - 1;
        bool neg = false;
        if (more() && peek() == '^') {
            neg = true;
            ++i_;
        }
        Ranges r;
        bool first = true;
        while (true) {
            if (!more()) fail("an unterminated class '['", at);
            if (peek() == ']' && !first) break;
            first = false;
            if (peek() == '[' && i_ + 1 < end_ && p_[i_ + 1] == ':') fail("a POSIX class [:...:]");
            Ranges lo_set;
            if (peek() == '\\') {
                ++i_;
                lo_set = escape(true);
            } else {
                const uint32_t c = utf8_char();
                lo_set = {{c, c}};
            }
            if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && i_ + 1 < end_ && peek() == '-' &&
                p_[i_ + 1] != ']') {
                ++i_;
                Ranges hi_set;
                const size_t hat = i_;
                if (peek() == '\\') {
                    ++i_;
                    hi_set = escape(true);
                } else {
                    const uint32_t c = utf8_char();
                    hi_set = {{c, c}};
                }
                if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second || hi_set[0].first < lo_set[0].first)
                    fail("a bad class range", hat);
                r.emplace_back(lo_set[0].first, hi_set[0].first);
            } else {
                r.insert(r.end(), lo_set.begin(), lo_set.end());
            }
        }
        ++i_;  // ']'
        return set(neg ? complement(r) : r);
    }
    Node group() {
        const size_t at = i_ - 1;
        if (more() && peek() == '?') {
            const std::string rest = p_.substr(i_, 3);
            if (rest.rfind("?:", 0) == 0) {
                i_ += 2;
            } else if (rest.rfind("?P<", 0) == 0 || (rest.rfind("?<", 0) == 0 && rest != "?<=" && rest != "?<!")) {
                const size_t close = p_.find('>', i_);
                if (close == std::string::npos || close >= end_) fail("an unterminated group name", at);
                i_ = close + 1;
            } else if (rest.rfind("?=", 0) == 0 || rest.rfind("?!", 0) == 0 || rest.rfind("?<", 0) == 0) {
                fail("lookaround", at);
            } else {
                fail("the group construct (?" + rest.substr(1, 1) + "...)", at);
            }
        }
        Node n = alt();
        if (!more() || peek() != ')') fail("an unterminated group '('", at);
        ++i_;
        return n;
    }
    Node atom() {
        const size_t at = i_;
        const char c = peek();
        ++i_;
        if (c == '(') return group();
        if (c == '[') return klass();
        if (c == '.') return set(complement({{'\n', '\n'}}));
        if (c == '\\') return set(escape(false));
        if (c == '^' || c == '$') fail(std::string("the anchor '") + c + "' inside the pattern", at);
        if (c == '*' || c == '+' || c == '?' || (c == '{' && is_braces(at)))
            fail(std::string("a quantifier '") + c + "' with nothing to repeat", at);
        --i_;
        const uint32_t lit = utf8_char();
        return set({{lit, lit}});
    }
    int number() {
        int v = 0;
        if (!more() || !isdigit(uint8_t(peek()))) fail("a malformed {m,n}");
        while (more() && isdigit(uint8_t(peek()))) {
            v = v * 10 + (peek() - '0');
            if (v > kMaxRepeat) fail("a repetition count above 1000");
            ++i_;
        }
        return v;
    }
    // Parses a quantifier at i_ if there is one (returns false otherwise).
    // Whether `{` at k opens a {m}, {m,} or {m,n} quantifier; otherwise it is a literal, as in Python.
    bool is_braces(size_t k) const {
        size_t j = k + 1, digits = 0;
        while (j < end_ && isdigit(uint8_t(p_[j]))) ++j, ++digits;
        if (digits == 0) return false;
        if (j < end_ && p_[j] == ',') {
            ++j;
            while (j < end_ && isdigit(uint8_t(p_[j]))) ++j;
        }
        return j < end_ && p_[j] == '}';
    }
    bool quantifier(int& min, int& max) {
        const char c = peek();
        const size_t at = i_;
        if (c == '{' && !is_braces(at)) return false;
        if (c == '*')
            min = 0, max = kUnbounded;
        else if (c == '+')
            min = 1, max = kUnbounded;
        else if (c == '?')
            min = 0, max = 1;
        else if (c == '{') {
            ++i_;
            min = number();
            max = min;
            if (more() && peek() == ',') {
                ++i_;
                max = more() && peek() == '}' ? kUnbounded : number();
            }
            if (!more() || peek() != '}') fail("a malformed {m,n}", at);
            if (max != kUnbounded && max < min) fail("{m,n} with n < m", at);
        } else {
            return false;
        }
        ++i_;
        if (more() && peek() == '?')
            ++i_;  // lazy: the same language
        else if (more() && peek() == '+')
            fail("a possessive quantifier");
        return true;
    }
    Node concat() {
        Node n;
        n.kind = Node::kConcat;
        while (more() && peek() != '|' && peek() != ')') {
            Node a = atom();
            int min = 0, max = 0;
            while (more() && quantifier(min, max)) {
                Node r;
                r.kind = Node::kRepeat;
                r.min = min;
                r.max = max;
                r.kids.push_back(std::move(a));
                a = std::move(r);
            }
            n.kids.push_back(std::move(a));
        }
        return n;
    }
    Node alt() {
        Node n;
        n.kind = Node::kAlt;
        n.kids.push_back(concat());
        while (more() && peek() == '|') {
            ++i_;
            n.kids.push_back(concat());
        }
        return n;
    }

    const std::string& p_;
    size_t i_ = 0, end_ = 0;
};

void emit(grammar_detail::NfaBuilder& b, const Node& n, int32_t from, int32_t to) {
    switch (n.kind) {
        case Node::kSet:
            if (n.set.empty()) return;  // an empty class matches nothing
            return b.codepoints(from, n.set, to);
        case Node::kAlt:
            for (const Node& k : n.kids) emit(b, k, from, to);
            return;
        case Node::kConcat: {
            int32_t cur = from;
            for (size_t i = 0; i < n.kids.size(); ++i) {
                const int32_t nx = i + 1 == n.kids.size() ? to : b.state();
                emit(b, n.kids[i], cur, nx);
                cur = nx;
            }
            if (n.kids.empty()) b.eps(from, to);
            return;
        }
        case Node::kRepeat: {
            int32_t cur = from;
            for (int i = 0; i < n.min; ++i) {
                const int32_t nx = b.state();
                emit(b, n.kids[0], cur, nx);
                cur = nx;
            }
            if (n.max == kUnbounded) {
                const int32_t loop = b.state();
                b.eps(cur, loop);
                emit(b, n.kids[0], loop, loop);
                b.eps(loop, to);
                return;
            }
            for (int i = n.min; i < n.max; ++i) {
                const int32_t nx = b.state();
                b.eps(cur, to);
                emit(b, n.kids[0], cur, nx);
                cur = nx;
            }
            b.eps(cur, to);
            return;
        }
    }
}

}  // namespace

void regex_fragment(grammar_detail::NfaBuilder& b, const std::string& pattern, int32_t from, int32_t to) {
    emit(b, Parser(pattern).parse(), from, to);
}

grammar_detail::Nfa compile_regex(const std::string& pattern) {
    const Node root = Parser(pattern).parse();
    grammar_detail::NfaBuilder b;
    const int32_t s = b.state(), f = b.state();
    emit(b, root, s, f);
    grammar_detail::Nfa nfa = b.finish(s, f);
    // Repetitions multiply: (a?){1000} nested in {1000} would be a million states whose closures are slow.
    LATTICE_CHECK(nfa.num_states() <= kMaxRegexStates,
                  "guided_regex: the pattern expands to {} automaton states (at most {}): lower its repetition counts",
                  nfa.num_states(), kMaxRegexStates);
    return nfa;
}

}  // namespace lattice
