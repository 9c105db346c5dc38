// The Jinja engine's insides (jinja.h says what is supported): the value type the evaluator works
// on, the AST the parser builds, and the built-in filters, tests and methods.
// Value mirrors Python's objects as jinja2 sees them: lists and dicts are shared by reference (a
// namespace() is a dict whose attributes may be set); dicts keep insertion order and have string
// keys; a Func is a macro, a global function or a bound method.
// Nesting: a list or dict knows how many levels of lists and dicts it holds (itself included), and
// one built deeper than the render's depth limit is an Oops (Budget::nested). A list is immutable, so
// its count is fixed when it is made; a dict's grows as values are set in it (values that held a
// namespace before it grew keep their count: the limit is checked where a value is built). Freeing
// never recurses per level: ~Value moves the children of the containers it alone holds onto one
// work list per thread and frees them from there, so a value of any depth (or a namespace() that a
// template made hold itself, which the Evaluator breaks up when the render ends) frees in constant
// stack.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "runtime/tokenizer/jinja.h"

namespace lattice::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
using Func = std::function<Value(Args&)>;

struct Value {
    enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunc };
    Kind kind = Kind::kUndefined;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;
    std::shared_ptr<List> list;
    std::shared_ptr<Dict> dict;
    std::shared_ptr<Func> fn;
    bool tuple = false;  // a kList that Python would hold as a tuple (repr "(a, b)", never == a list)
    int32_t nest = 0;    // kList: levels of lists and dicts, itself included (dicts keep theirs in Dict)

    Value() = default;
    Value(const Value&) = default;
    Value(Value&&) noexcept = default;
    Value& operator=(const Value&) = default;
    Value& operator=(Value&&) noexcept = default;
    ~Value() {
        if (list || dict || fn) release();
    }

    static Value none() { return with(Kind::kNone); }
    static Value boolean(bool v) {
        Value r = with(Kind::kBool);
        r.b = v;
        return r;
    }
    static Value integer(int64_t v) {
        Value r = with(Kind::kInt);
        r.i = v;
        return r;
    }
    static Value real(double v) {
        Value r = with(Kind::kFloat);
        r.f = v;
        return r;
    }
    static Value str(std::string v) {
        Value r = with(Kind::kString);
        r.s = std::move(v);
        return r;
    }
    static Value make_list(List v = {});
    static Value make_dict();
    static Value func(Func f) {
        Value r = with(Kind::kFunc);
        r.fn = std::make_shared<Func>(std::move(f));
        return r;
    }
    static Value with(Kind k) {
        Value r;
        r.kind = k;
        return r;
    }

    bool undefined() const { return kind == Kind::kUndefined; }
    bool is_none() const { return kind == Kind::kNone; }
    bool is_string() const { return kind == Kind::kString; }
    bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
    bool is_list() const { return kind == Kind::kList; }
    bool is_dict() const { return kind == Kind::kDict; }
    // Levels of lists and dicts in this value (0 for a scalar or a function).
    int32_t nesting() const;

private:
    void release() noexcept;  // frees what only this value holds, without recursing per level
};

struct Dict {
    std::vector<std::pair<std::string, Value>> items;
    bool is_namespace = false;
    int32_t nest = 1;  // levels of lists and dicts, itself included; grows as values are set
    const Value* find(std::string_view key) const;
    void set(const std::string& key, Value v);  // counts v's nesting (Oops past the render's depth limit)
    void holds(const Value& v);                 // counts v's nesting, for items added directly
};

// Call arguments: positional, then keyword (name, value).
struct Args {
    List pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* kwarg(std::string_view name) const;
    // Positional i, else keyword `name`, else nullptr.
    const Value* get(size_t i, std::string_view name) const;
};

// An error without a position: the evaluator adds the line and column of the expression.
struct Oops : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The render budget (jinja.h): one per render, installed for the render's thread so the built-ins
// (which copy lists, build strings and compare values) charge it too; outside a render (none
// installed) every charge is free. Past a limit it throws Oops naming the limit; the evaluator adds
// the template's name, line and column.
class Budget {
public:
    Budget(const RenderLimits& floors, const nlohmann::ordered_json& context, RenderUsage* usage);
    ~Budget();
    Budget(const Budget&) = delete;
    Budget& operator=(const Budget&) = delete;
    static Budget* current();

    void step(int64_t n = 1) {
        if ((used_.steps += n) > lim_.steps) over("steps", lim_.steps);
        if (interrupt_ && interrupt_->load(std::memory_order_relaxed)) interrupted();
    }
    void loop_iteration() {
        if (++used_.loop_iterations > lim_.loop_iterations) over("loop iterations", lim_.loop_iterations);
    }
    // A string of `size` bytes is being built (checked before or while it grows).
    void growing(size_t size) {
        const int64_t n = size > size_t(INT64_MAX) ? INT64_MAX : int64_t(size);
        if (n > used_.string_bytes) {
            used_.string_bytes = n;
            if (used_.string_bytes > lim_.string_bytes) over("bytes in one string", lim_.string_bytes);
        }
    }
    // A string of `size` bytes was made or copied.
    void produced(size_t size) {
        growing(size);
        if ((used_.total_bytes += int64_t(std::min<size_t>(size, size_t(INT64_MAX / 2)))) > lim_.total_bytes)
            over("bytes of strings in all", lim_.total_bytes);
    }
    void copied(const List& items);  // a list copy: a step per item, its strings' bytes
    void enter() {
        if (++depth_ > used_.depth && (used_.depth = depth_) > lim_.depth) over("levels of nesting", lim_.depth);
    }
    void leave() { --depth_; }
    // A value `levels` deep is being built (lists and dicts, Value::nesting).
    void nested(int32_t levels) {
        if (levels > used_.depth && (used_.depth = levels) > lim_.depth) over("levels of nesting", lim_.depth);
    }
    const RenderLimits& limits() const { return lim_; }

private:
    [[noreturn]] void over(const char* what, int64_t limit) const;
    [[noreturn]] static void interrupted();
    const std::atomic<bool>* interrupt_;  // RenderInterrupt's flag for this thread, or null
    RenderLimits lim_;
    RenderUsage used_;
    RenderUsage* out_;
    Budget* prev_;
    int32_t depth_ = 0;
};

// Charges of the built-ins, free outside a render.
inline void charge_steps(int64_t n) {
    if (Budget* b = Budget::current()) b->step(n);
}
inline void charge_growing(size_t size) {
    if (Budget* b = Budget::current()) b->growing(size);
}
// A scan of `bytes` that makes no string (length, `in`, ==, count): a step per 16 bytes, as code_points
// charges, so that a loop over a long string's length is held by the step limit.
inline void charge_scan(size_t bytes) {
    charge_steps(int64_t(std::min<size_t>(bytes, size_t(1) << 60) / 16));
}
// One level of nesting for as long as it lives (recursion over statements, expressions, values).
struct Nest {
    Budget* b = Budget::current();
    Nest() {
        if (b) b->enter();
    }
    ~Nest() {
        if (b) b->leave();
    }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
};

// Value semantics (Python's): truth, str(), repr(), ==, <, json.dumps.
bool truthy(const Value& v);
std::string to_str(const Value& v);
std::string repr(const Value& v);
bool equal(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
std::string to_json_text(const Value& v, int indent);  // indent < 0: one line
Value from_json(const nlohmann::ordered_json& j);
const char* kind_name(const Value& v);
// Items of an iterable (list, dict keys, string characters); Undefined is empty.
List iterate(const Value& v);
// Python len(); code points for strings.
int64_t length(const Value& v);
// Strings as code points for indexing and slicing.
std::vector<std::string> code_points(const std::string& s);

// Python's str operations (jinja_strings.cpp), for the filters and the string methods.
// strip: whitespace, or any code point of `chars` (a string; None / Undefined: whitespace), from the left
// and / or right end. split returns a list Value; sep null or None: runs of whitespace. count, maxsplit < 0:
// no limit.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
std::string ascii_case(std::string s, bool upper);
std::string title(const std::string& s);
std::string capitalize(const std::string& s);
std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
Value split(const std::string& s, const Value* sep, int64_t maxsplit);

// Built-ins; `name` unknown -> Oops naming it. known_*: for the parser, which rejects unknown
// filter and test names as jinja2's compiler does (even where never reached).
bool known_filter(std::string_view name);
bool known_test(std::string_view name);
using TestFn = std::function<bool(const Value&, const std::string&, Args&)>;
Value apply_filter(const std::string& name, const Value& v, Args& args, const TestFn& test);
bool apply_test(const std::string& name, const Value& v, Args& args);
// `obj.name` where obj is a string or dict and name is one of its methods; Undefined otherwise.
Value method(const Value& obj, const std::string& name);

// ---- AST ----
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
    enum class Kind {
        kLiteral,
        kName,
        kList,
        kTuple,
        kDict,
        kAttr,
        kIndex,
        kSlice,
        kCall,
        kFilter,
        kTest,
        kUnary,
        kBinary,
        kAnd,
        kOr,
        kNot,
        kCond
    };
    Kind kind;
    int line = 0, col = 0;
    Value literal;
    std::string name;           // name, attribute, filter/test name, operator
    std::vector<ExprPtr> args;  // operands; kDict: key, value, key, value...; kSlice: obj, start, stop, step (nullable)
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    bool negated = false;  // kTest: `is not`
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
    enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
    Kind kind;
    int line = 0, col = 0;
    std::string text;                  // kText; kSet/kSetBlock/kMacro: the name
    std::vector<std::string> targets;  // kFor/kSet: names; kSet "ns.attr": targets = {ns, attr}, attr_set
    bool attr_set = false;
    ExprPtr expr;                                         // kOutput, kFor (iterable), kSet (value)
    ExprPtr cond;                                         // kFor: `if` filter
    std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: (condition or null for else, body)
    Body body, else_body;                                 // kFor, kSetBlock, kMacro
    std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: (name, default or null)
};

struct Program {
    std::string name;
    Body body;
};

std::shared_ptr<Program> parse_template(std::string_view source, std::string name);
[[noreturn]] void fail_at(const std::string& name, int line, int col, const std::string& msg);

}  // namespace lattice::jinja
