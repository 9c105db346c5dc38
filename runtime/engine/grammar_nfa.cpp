// NfaBuilder: the pieces every grammar front end shares. Code point sets become UTF-8 byte
// sequences (split by encoding length, then by continuation-byte boundaries, as RE2 and Rust's
// regex-syntax do), so the automaton accepts exactly valid UTF-8 (no overlongs, no surrogates, nothing
// above U+10FFFF). JSON strings: plain characters (U+0020.. except '"' and '\') or an escape
// (\" \\ \/ \b \f \n \r \t, \uXXXX other than a surrogate, or a high+low surrogate pair), so every
// output parses. String bodies are chains of character steps whose boundary states record how many
// characters may still follow (Nfa::body_remaining: the mask's fast path). Numbers are bounded
// (16 integer digits, 16 fraction digits, 1-2 exponent digits: e999 overflows a double, which
// nlohmann::json refuses to parse); integer ranges are exact decimal
// automata (per length, the classic lo..hi digit split).
#include <map>
#include <string>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice::grammar_detail {

namespace {

constexpr int32_t kMaxStates = 1'000'000;  // ~1 s of compiling; 5000 properties of scalars take ~750k

// One maximal run of byte ranges: a UTF-8 sequence of n bytes, each within [lo[i], hi[i]].
struct Seq {
    int n = 0;
    uint8_t lo[4], hi[4];
};

int utf8_len(uint32_t c) {
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

void encode(uint32_t c, uint8_t* out) {
    const int n = utf8_len(c);
    if (n == 1) {
        out[0] = uint8_t(c);
        return;
    }
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int i = n - 1; i > 0; --i) {
        out[i] = uint8_t(0x80 | (c & 0x3F));
        c >>= 6;
    }
    out[0] = uint8_t(lead[n] | c);
}

// Splits [lo, hi] (same encoded length, no surrogates) until each piece maps to per-byte ranges.
void split_same_len(uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
    const int n = utf8_len(lo);
    for (int i = 1; i < n; ++i) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split_same_len(lo, lo | m, out);
                split_same_len((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                split_same_len(lo, (hi & ~m) - 1, out);
                split_same_len(hi & ~m, hi, out);
                return;
            }
        }
    }
    Seq s;
    s.n = n;
    encode(lo, s.lo);
    encode(hi, s.hi);
    out.push_back(s);
}

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
        return;
    }
    for (uint32_t b : bounds) {
        if (lo > hi) return;
        if (lo <= b) {
            const uint32_t top = std::min(hi, b);
            split_same_len(lo, top, out);
            lo = top + 1;
        }
    }
}

const NfaBuilder::Ranges kPlainChars = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};

bool is_plain(uint32_t cp) {
    return cp >= 0x20 && cp != '"' && cp != '\\' && cp <= 0x10FFFF;
}

NfaBuilder::Ranges subtract(const NfaBuilder::Ranges& r, uint32_t cp) {
    NfaBuilder::Ranges out;
    for (auto [lo, hi] : r) {
        if (cp < lo || cp > hi) {
            out.emplace_back(lo, hi);
            continue;
        }
        if (cp > lo) out.emplace_back(lo, cp - 1);
        if (cp < hi) out.emplace_back(cp + 1, hi);
    }
    return out;
}

// Code points of valid UTF-8 text (the schema's property names, which nlohmann has validated).
std::vector<uint32_t> decode_utf8(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        const uint8_t b = uint8_t(s[i]);
        const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        uint32_t c = n == 1 ? b : b & (0xFF >> (n + 1));
        for (int k = 1; k < n && i + size_t(k) < s.size(); ++k) c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
        out.push_back(c);
        i += size_t(n);
    }
    return out;
}

std::string pow10_minus1(int n) {
    return std::string(size_t(n), '9');
}

}  // namespace

int32_t NfaBuilder::state() {
    LATTICE_CHECK(int32_t(flags_.size()) < kMaxStates, "structured output: the grammar is too large (over {} automaton states): fewer properties, items or alternatives",
                  kMaxStates);
    bytes_.emplace_back();
    eps_.emplace_back();
    calls_.emplace_back();
    flags_.push_back(0);
    body_.push_back(-1);
    return int32_t(flags_.size()) - 1;
}

void NfaBuilder::byte(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    bytes_[size_t(from)].push_back({lo, hi, to});
}
void NfaBuilder::eps(int32_t from, int32_t to) {
    eps_[size_t(from)].push_back(to);
}
void NfaBuilder::call(int32_t from, int32_t callee, int32_t to) {
    calls_[size_t(from)].push_back({callee, to});
}

std::pair<int32_t, int32_t> NfaBuilder::rule() {
    const int32_t s = state(), e = state();
    flags_[size_t(e)] |= kReturn;
    return {s, e};
}

void NfaBuilder::literal(int32_t from, std::string_view bytes, int32_t to) {
    if (bytes.empty()) return eps(from, to);
    int32_t cur = from;
    for (size_t i = 0; i + 1 < bytes.size(); ++i) {
        const int32_t nx = state();
        byte(cur, uint8_t(bytes[i]), uint8_t(bytes[i]), nx);
        cur = nx;
    }
    byte(cur, uint8_t(bytes.back()), uint8_t(bytes.back()), to);
}

void NfaBuilder::codepoints(int32_t from, const Ranges& ranges, int32_t to) {
    std::vector<Seq> seqs;
    for (auto [lo, hi] : ranges) utf8_sequences(lo, std::min<uint32_t>(hi, 0x10FFFF), seqs);
    // Sequences sharing a leading byte range share its state, so common prefixes stay deterministic.
    const Seq* prev = nullptr;
    int32_t prev_states[4] = {from, -1, -1, -1};
    for (const Seq& s : seqs) {
        int shared = 0;
        if (prev && prev->n == s.n)
            while (shared < s.n - 1 && prev->lo[shared] == s.lo[shared] && prev->hi[shared] == s.hi[shared]) ++shared;
        int32_t cur = prev_states[shared];
        for (int i = shared; i < s.n; ++i) {
            const int32_t nx = i + 1 == s.n ? to : state();
            byte(cur, s.lo[i], s.hi[i], nx);
            if (i + 1 < s.n) prev_states[i + 1] = nx;
            cur = nx;
        }
        prev = &s;
    }
}

int32_t NfaBuilder::opt_space(int32_t from) {
    const int32_t s = state();
    eps(from, s);
    byte(from, ' ', ' ', s);
    return s;
}

void NfaBuilder::json_char(int32_t from, int32_t to) {
    codepoints(from, kPlainChars, to);
    const int32_t esc = state();
    byte(from, '\\', '\\', esc);
    for (char c : std::string_view("\"\\/bfnrt")) byte(esc, uint8_t(c), uint8_t(c), to);
    // \uXXXX: any non-surrogate, or a high surrogate followed by \u and a low surrogate.
    const int32_t u = state();
    byte(esc, 'u', 'u', u);
    const int32_t h1 = state(), h2 = state(), h3 = state(), sd = state();
    auto hex = [&](int32_t a, int32_t b) {
        byte(a, '0', '9', b);
        byte(a, 'a', 'f', b);
        byte(a, 'A', 'F', b);
    };
    for (char c : std::string_view("0123456789abceABCE")) byte(u, uint8_t(c), uint8_t(c), h1);
    byte(u, 'd', 'd', sd);
    byte(u, 'D', 'D', sd);
    byte(sd, '0', '7', h2);
    hex(h1, h2);
    hex(h2, h3);
    hex(h3, to);
    const int32_t hi2 = state(), hi3 = state(), hi4 = state(), bs = state(), lu = state(), ld = state(), l2 = state(),
                  l3 = state();
    byte(sd, '8', '9', hi2);
    byte(sd, 'a', 'b', hi2);
    byte(sd, 'A', 'B', hi2);
    hex(hi2, hi3);
    hex(hi3, hi4);
    byte(hi4, '\\', '\\', bs);
    byte(bs, 'u', 'u', lu);
    byte(lu, 'd', 'd', ld);
    byte(lu, 'D', 'D', ld);
    byte(ld, 'c', 'f', l2);
    byte(ld, 'C', 'F', l2);
    hex(l2, l3);
    hex(l3, to);
}

void NfaBuilder::json_string(int32_t from, int32_t to, int32_t min_chars, int32_t max_chars) {
    LATTICE_CHECK(min_chars >= 0 && min_chars <= max_chars, "structured output: string length bounds {}..{} are empty",
                  min_chars, max_chars);
    int32_t cur = state();
    byte(from, '"', '"', cur);
    const int32_t fixed = max_chars == kUnbounded ? min_chars : max_chars;
    for (int32_t i = 0; i < fixed; ++i) {
        body_[size_t(cur)] = max_chars == kUnbounded ? kUnbounded : max_chars - i;
        if (i >= min_chars) byte(cur, '"', '"', to);
        const int32_t nx = state();
        json_char(cur, nx);
        cur = nx;
    }
    body_[size_t(cur)] = max_chars == kUnbounded ? kUnbounded : 0;
    if (max_chars == kUnbounded) json_char(cur, cur);
    byte(cur, '"', '"', to);
}

void NfaBuilder::json_string_except(int32_t from, int32_t to, const std::vector<std::string>& names) {
    struct Node {
        std::map<uint32_t, int> kids;
        bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
        int at = 0;
        for (uint32_t cp : decode_utf8(name)) {
            auto it = trie[size_t(at)].kids.find(cp);
            if (it == trie[size_t(at)].kids.end()) {
                trie.emplace_back();
                it = trie[size_t(at)].kids.emplace(cp, int(trie.size()) - 1).first;
            }
            at = it->second;
        }
        trie[size_t(at)].terminal = true;
    }
    // Once the key differs from every name, it is a free string (escapes allowed). Along a name's
    // prefix only unescaped characters are taken (an escape could spell the name's next character).
    const int32_t diverged = state();
    body_[size_t(diverged)] = kUnbounded;
    json_char(diverged, diverged);
    byte(diverged, '"', '"', to);
    std::vector<int32_t> st(trie.size());
    for (int32_t& x : st) x = state();
    byte(from, '"', '"', st[0]);
    for (size_t i = 0; i < trie.size(); ++i) {
        body_[size_t(st[i])] = kUnbounded;  // every plain character is taken from here (a child or `diverged`)
        if (!trie[i].terminal) byte(st[i], '"', '"', to);
        Ranges other = kPlainChars;
        for (auto [cp, kid] : trie[i].kids) {
            if (!is_plain(cp)) continue;  // cannot be written unescaped: the key never follows it
            uint8_t buf[4];
            encode(cp, buf);
            literal(st[i], std::string_view(reinterpret_cast<const char*>(buf), size_t(utf8_len(cp))), st[size_t(kid)]);
            other = subtract(other, cp);
        }
        codepoints(st[i], other, diverged);
    }
}

void NfaBuilder::digits(int32_t from, int32_t to, int min, int max) {
    if (max == 0) return eps(from, to);
    int32_t cur = from;
    for (int i = 0; i < max; ++i) {
        if (i >= min) eps(cur, to);
        const int32_t nx = i + 1 == max ? to : state();
        byte(cur, '0', '9', nx);
        cur = nx;
    }
}

void NfaBuilder::json_number(int32_t from, int32_t to) {
    const int32_t sign = state(), intp = state(), frac = state(), exp = state();
    eps(from, sign);
    byte(from, '-', '-', sign);
    byte(sign, '0', '0', intp);
    const int32_t nz = state();
    byte(sign, '1', '9', nz);
    digits(nz, intp, 0, 15);
    eps(intp, frac);
    const int32_t dot = state();
    byte(intp, '.', '.', dot);
    digits(dot, frac, 1, 16);
    eps(frac, to);
    const int32_t e = state(), es = state();
    byte(frac, 'e', 'e', e);
    byte(frac, 'E', 'E', e);
    eps(e, es);
    byte(e, '+', '+', es);
    byte(e, '-', '-', es);
    digits(es, exp, 1, 2);  // <= 99: 16 digits e99 stays a finite double, so every parser reads it
    eps(exp, to);
}

// Equal-length decimal strings lo <= hi: every digit string between them.
void NfaBuilder::fixed_range(int32_t from, int32_t to, const std::string& lo, const std::string& hi) {
    if (lo.empty()) return eps(from, to);
    const std::string lr = lo.substr(1), hr = hi.substr(1);
    if (lo[0] == hi[0]) {
        const int32_t m = state();
        byte(from, uint8_t(lo[0]), uint8_t(lo[0]), m);
        return fixed_range(m, to, lr, hr);
    }
    if (lr == std::string(lr.size(), '0') && hr == pow10_minus1(int(hr.size()))) {
        const int32_t m = state();
        byte(from, uint8_t(lo[0]), uint8_t(hi[0]), m);
        return digits(m, to, int(lr.size()), int(lr.size()));
    }
    const int32_t a = state(), c = state();
    byte(from, uint8_t(lo[0]), uint8_t(lo[0]), a);
    fixed_range(a, to, lr, pow10_minus1(int(lr.size())));
    if (lo[0] + 1 <= hi[0] - 1) {
        const int32_t b = state();
        byte(from, uint8_t(lo[0] + 1), uint8_t(hi[0] - 1), b);
        digits(b, to, int(lr.size()), int(lr.size()));
    }
    byte(from, uint8_t(hi[0]), uint8_t(hi[0]), c);
    fixed_range(c, to, std::string(hr.size(), '0'), hr);
}

void NfaBuilder::nonneg_range(int32_t from, int32_t to, int64_t lo, int64_t hi) {
    int64_t first = 0, last = 9;  // smallest and largest number of the current length
    for (int len = 1; len <= 16 && first <= hi; ++len) {
        const int64_t a = std::max(lo, first), b = std::min(hi, last);
        if (a <= b) fixed_range(from, to, std::to_string(a), std::to_string(b));
        first = last + 1;
        last = last * 10 + 9;
    }
}

void NfaBuilder::json_integer(int32_t from, int32_t to, int64_t lo, int64_t hi) {
    lo = std::max(lo, -kMaxIntegerMagnitude);
    hi = std::min(hi, kMaxIntegerMagnitude);
    LATTICE_CHECK(lo <= hi, "structured output: the integer range {}..{} is empty", lo, hi);
    if (lo < 0) {
        const int32_t m = state();
        byte(from, '-', '-', m);
        nonneg_range(m, to, std::max<int64_t>(1, -std::min<int64_t>(hi, -1)), -lo);
    }
    if (hi >= 0) nonneg_range(from, to, std::max<int64_t>(lo, 0), hi);
}

void NfaBuilder::free_object(int32_t from, int32_t to) {
    const int32_t open = state(), after = state(), comma = state();
    byte(from, '{', '{', open);
    byte(open, '}', '}', to);
    auto member = [&](int32_t at) {
        const int32_t key = state(), colon = state();
        json_string(at, key, 0, kUnbounded);
        byte(key, ':', ':', colon);
        free_value(opt_space(colon), after);
    };
    member(open);
    byte(after, '}', '}', to);
    byte(after, ',', ',', comma);
    member(opt_space(comma));
}

void NfaBuilder::free_value(int32_t from, int32_t to) {
    if (value_rule_ < 0) {
        const auto [s, e] = rule();
        value_rule_ = s;
        free_object(s, e);
        const int32_t open = state(), after = state(), comma = state();
        byte(s, '[', '[', open);
        byte(open, ']', ']', e);
        free_value(open, after);
        byte(after, ']', ']', e);
        byte(after, ',', ',', comma);
        free_value(opt_space(comma), after);
        json_string(s, e, 0, kUnbounded);
        json_number(s, e);
        literal(s, "true", e);
        literal(s, "false", e);
        literal(s, "null", e);
    }
    call(from, value_rule_, to);
}

Nfa NfaBuilder::finish(int32_t start, int32_t final_state) {
    flags_[size_t(final_state)] |= kFinal;
    Nfa n;
    n.start = start;
    n.flags = flags_;
    n.body_remaining = body_;
    const size_t ns = flags_.size();
    n.byte_off.assign(ns + 1, 0);
    n.eps_off.assign(ns + 1, 0);
    n.call_off.assign(ns + 1, 0);
    for (size_t s = 0; s < ns; ++s) {
        n.bytes.insert(n.bytes.end(), bytes_[s].begin(), bytes_[s].end());
        n.eps.insert(n.eps.end(), eps_[s].begin(), eps_[s].end());
        n.calls.insert(n.calls.end(), calls_[s].begin(), calls_[s].end());
        n.byte_off[s + 1] = uint32_t(n.bytes.size());
        n.eps_off[s + 1] = uint32_t(n.eps.size());
        n.call_off[s + 1] = uint32_t(n.calls.size());
    }
    return n;
}

}  // namespace lattice::grammar_detail

namespace lattice {

grammar_detail::Nfa compile_json_object() {
    grammar_detail::NfaBuilder b;
    const int32_t s = b.state(), f = b.state();
    b.free_object(s, f);
    return b.finish(s, f);
}

grammar_detail::Nfa compile_choice(const std::vector<std::string>& choices) {
    LATTICE_CHECK(!choices.empty(), "guided_choice: the list of choices is empty");
    grammar_detail::NfaBuilder b;
    const int32_t s = b.state(), f = b.state();
    for (const std::string& c : choices) b.literal(s, c, f);
    return b.finish(s, f);
}

}  // namespace lattice
