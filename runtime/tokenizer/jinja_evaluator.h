// The Jinja evaluator's class (jinja.h, jinja_internal.h): internal to the tokenizer room, shared by
// the statement half (jinja_eval.cpp: globals, scopes, output, for, set, macro) and the expression
// half (jinja_eval_expr.cpp: expressions, indexing, slicing, operators). One Evaluator renders one
// template once. Invariants: scopes_ is never empty (scopes_[0] holds the globals and the context);
// loop_depth_ and call_depth_ count the for loops and macro calls now running; every statement and
// expression charges the render's Budget (jinja.h). namespaces_ holds every namespace() the render
// made: the only values a template can change, so the only way it can make a value hold itself; the
// destructor empties them, so that no such cycle outlives the render.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

using Frame = std::unordered_map<std::string, Value>;
enum class Flow { kNormal, kBreak, kContinue };

class Evaluator {
public:
    Evaluator(const Program& prog, const RenderOptions& opt) : prog_(prog), opt_(opt) {
        scopes_.push_back(std::make_shared<Frame>());
        install_globals(*scopes_[0]);
    }
    ~Evaluator();
    Evaluator(const Evaluator&) = delete;
    Evaluator& operator=(const Evaluator&) = delete;

    std::string run(const nlohmann::ordered_json& context);

private:
    void install_globals(Frame& g);
    Value lookup(const std::string& name) const;

    // ---- statements (jinja_eval.cpp) ----
    Flow exec(const Body& body, std::string& out);
    Flow exec_node(const Node& n, std::string& out);  // run_node, its Oops made an Error at its line
    Flow run_node(const Node& n, std::string& out);
    void append(std::string& out, const std::string& text, const Node& n);
    void bind(Frame& f, const Node& n, const Value& item);
    void exec_set(const Node& n, const Value& v);
    Flow exec_for(const Node& n, std::string& out);
    static Value loop_value(const List& items, int64_t i);
    void define_macro(const Node& n);

    // ---- expressions (jinja_eval_expr.cpp) ----
    Value eval(const Expr& e);
    static std::string describe(const Expr& e);
    Value need_defined(const Expr& e);
    Args eval_args(const Expr& e, size_t first);
    static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
    Value eval_inner(const Expr& e);
    Value index(const Value& obj, const Value& key);
    Value slice(const Value& obj, const Expr& e);
    Value binary(const Expr& e);
    static bool contains(const Value& hay, const Value& needle);

    const Program& prog_;
    RenderOptions opt_;
    std::vector<std::shared_ptr<Frame>> scopes_;
    int loop_depth_ = 0, call_depth_ = 0;
    std::vector<std::weak_ptr<Dict>> namespaces_;
};

}  // namespace lattice::jinja
