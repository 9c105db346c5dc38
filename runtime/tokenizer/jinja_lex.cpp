// Lexer of the Jinja subset (jinja.h): splits a template's source into text runs and the tokens of
// its `{{ }}` and `{% %}` tags (comments are dropped here). Whitespace handling follows jinja2's lexer
// with trim_blocks and lstrip_blocks on, as transformers sets them: a block or comment tag drops the
// one newline after it; spaces and tabs between a line's start and a block or comment tag are dropped;
// `-` strips all whitespace on its side, `+` disables lstrip/trim. String literals are decoded with
// Python's escapes. Invariants: the token list always ends with one kEnd; each token carries the
// 1-based line and column of its first character; errors go through fail_at (jinja_internal.h).
#include "runtime/tokenizer/jinja_lex.h"

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

class Lexer {
public:
    Lexer(std::string_view src, const std::string& name) : s_(src), name_(name) {}

    std::vector<Tok> run() {
        bool line_starting = true;
        while (pos_ < s_.size()) {
            size_t open = find_open(pos_);
            std::string text(s_.substr(pos_, open - pos_));
            if (open == s_.size()) {
                emit_text(text, line_of(pos_));
                break;
            }
            const char kind = s_[open + 1];
            const bool minus = open + 2 < s_.size() && s_[open + 2] == '-';
            const bool plus = open + 2 < s_.size() && s_[open + 2] == '+';
            if (minus) {
                while (!text.empty() && is_space(text.back())) text.pop_back();
            } else if (!plus && kind != '{') {
                // lstrip_blocks: only spaces/tabs between the line's start and the tag.
                const size_t nl = text.rfind('\n');
                const size_t from = nl == std::string::npos ? 0 : nl + 1;
                bool blank = true;
                for (size_t i = from; i < text.size(); ++i) blank = blank && is_space(text[i]) && text[i] != '\n';
                if (blank && (nl != std::string::npos || line_starting)) text.resize(from);
            }
            emit_text(text, line_of(pos_));
            pos_ = open + 2 + ((minus || plus) ? 1 : 0);
            if (kind == '#') {
                size_t end = s_.find("#}", pos_);
                if (end == std::string_view::npos) fail(open, "unclosed comment");
                const bool rminus = end > pos_ && s_[end - 1] == '-';
                const bool rplus = end > pos_ && s_[end - 1] == '+';
                pos_ = end + 2;
                line_starting = finish_tag(rminus, rplus, true);
                continue;
            }
            toks_.push_back({kind == '{' ? Tok::kVarOpen : Tok::kBlockOpen, "", line_of(open), col_of(open)});
            line_starting = lex_tag(kind == '{', open);
        }
        toks_.push_back({Tok::kEnd, "", line_of(s_.size()), col_of(s_.size())});
        return std::move(toks_);
    }

private:
    size_t find_open(size_t from) const {
        for (size_t i = from; i + 1 < s_.size(); ++i)
            if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
        return s_.size();
    }
    int line_of(size_t at) {
        while (line_pos_ < at && line_pos_ < s_.size()) {
            if (s_[line_pos_] == '\n') {
                ++line_;
                line_start_ = line_pos_ + 1;
            }
            ++line_pos_;
        }
        return line_;
    }
    int col_of(size_t at) { return int(at - line_start_) + 1 + (line_of(at) * 0); }
    [[noreturn]] void fail(size_t at, const std::string& msg) {
        const int l = line_of(at);
        fail_at(name_, l, col_of(at), msg);
    }
    void emit_text(std::string& text, int line) {
        if (!text.empty()) toks_.push_back({Tok::kText, std::move(text), line, 1});
    }
    // After a closing tag: `-` eats all whitespace, trim_blocks one newline (blocks and comments).
    // Returns whether the next text starts a line (jinja2's line_starting).
    bool finish_tag(bool minus, bool plus, bool block) {
        if (minus) {
            size_t p = pos_;
            while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
            return pos_ > p && s_[pos_ - 1] == '\n';
        }
        if (block && !plus && pos_ < s_.size() && s_[pos_] == '\n') {
            ++pos_;
            return true;
        }
        return false;
    }

    bool lex_tag(bool var, size_t open) {
        int depth = 0;
        for (;;) {
            while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
            if (pos_ >= s_.size()) fail(open, var ? "unclosed '{{'" : "unclosed '{%'");
            const char c = s_[pos_];
            const std::string_view rest = s_.substr(pos_);
            if (depth == 0) {
                const std::string_view close = var ? "}}" : "%}";
                bool minus = false, plus = false;
                size_t n = 0;
                if (rest.starts_with(close)) {
                    n = 2;
                } else if ((rest[0] == '-' || rest[0] == '+') && rest.substr(1).starts_with(close)) {
                    n = 3;
                    minus = rest[0] == '-';
                    plus = rest[0] == '+';
                }
                if (n) {
                    toks_.push_back({var ? Tok::kVarClose : Tok::kBlockClose, "", line_of(pos_), col_of(pos_)});
                    pos_ += n;
                    return finish_tag(minus, plus, !var);
                }
            }
            const int line = line_of(pos_), col = col_of(pos_);
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t e = pos_;
                while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
                toks_.push_back({Tok::kName, std::string(s_.substr(pos_, e - pos_)), line, col});
                pos_ = e;
            } else if (std::isdigit(static_cast<unsigned char>(c))) {
                size_t e = pos_;
                bool real = false;
                while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
                if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
                    real = true;
                    ++e;
                    while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
                }
                if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
                    size_t k = e + 1;
                    if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
                    if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
                        real = true;
                        e = k;
                        while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
                    }
                }
                std::string num;
                for (char ch : s_.substr(pos_, e - pos_))
                    if (ch != '_') num += ch;
                toks_.push_back({real ? Tok::kFloat : Tok::kInt, num, line, col});
                pos_ = e;
            } else if (c == '\'' || c == '"') {
                toks_.push_back({Tok::kString, lex_string(c), line, col});
            } else {
                static constexpr std::string_view kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
                std::string op(1, c);
                for (std::string_view o : kOps2)
                    if (rest.starts_with(o)) op = std::string(o);
                if (op.size() == 1 && std::string_view("+-*/%~|.,:()[]{}=<>").find(c) == std::string_view::npos)
                    fail(pos_, fmt::format("unexpected character '{}'", c));
                if (c == '(' || c == '[' || c == '{') ++depth;
                if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
                toks_.push_back({Tok::kOp, op, line, col});
                pos_ += op.size();
            }
        }
    }

    // A quoted literal with Python's escapes (jinja2 decodes them with unicode-escape).
    std::string lex_string(char quote) {
        const size_t start = pos_++;
        std::string out;
        while (pos_ < s_.size() && s_[pos_] != quote) {
            char c = s_[pos_++];
            if (c != '\\' || pos_ >= s_.size()) {
                out += c;
                continue;
            }
            const char e = s_[pos_++];
            auto hex = [&](int n) {
                if (pos_ + size_t(n) > s_.size()) fail(pos_, "truncated escape in string");
                uint32_t cp = 0;
                for (int k = 0; k < n; ++k) {
                    const char h = s_[pos_++];
                    if (!std::isxdigit(static_cast<unsigned char>(h))) fail(pos_ - 1, "bad hex escape in string");
                    cp = cp * 16 +
                         uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
                }
                append_utf8(out, cp);
            };
            switch (e) {
                case 'n':
                    out += '\n';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case '0':
                    out += '\0';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case '\n':
                    break;
                case 'x':
                    hex(2);
                    break;
                case 'u':
                    hex(4);
                    break;
                case 'U':
                    hex(8);
                    break;
                default:
                    out += '\\';
                    out += e;
            }
        }
        if (pos_ >= s_.size()) fail(start, "unclosed string literal");
        ++pos_;
        return out;
    }

    std::string_view s_;
    const std::string& name_;
    size_t pos_ = 0, line_pos_ = 0, line_start_ = 0;
    int line_ = 1;
    std::vector<Tok> toks_;
};

}  // namespace

std::vector<Tok> lex_template(std::string_view source, const std::string& name) {
    return Lexer(source, name).run();
}

}  // namespace lattice::jinja
