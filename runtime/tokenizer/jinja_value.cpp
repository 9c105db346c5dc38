// The Jinja engine's value storage (jinja_internal.h): freeing without recursion (~Value moves the children
// of the containers it alone holds onto one work list per thread and frees them from there), each list's and
// dict's nesting count, charged against the render's depth limit where a value is built, the dict's ordered
// keys, and call arguments by position or keyword. Python's semantics of the values are jinja_builtins.cpp's.
#include <algorithm>
#include <memory>
#include <string_view>

#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

// The work list of the ~Value now freeing on this thread (null when none is): values whose containers
// are to be freed wait here instead of being freed inside their parent's destructor.
thread_local List* t_freeing = nullptr;

bool holds_values(const Value& v) {
    return v.list || v.dict || v.fn;
}

// Moves the values inside the containers that `v` alone holds onto `work` (their slots left empty).
void detach(Value& v, List& work) {
    if (v.list && v.list.use_count() == 1)
        for (Value& x : *v.list)
            if (holds_values(x)) work.push_back(std::move(x));
    if (v.dict && v.dict.use_count() == 1)
        for (auto& kv : v.dict->items)
            if (holds_values(kv.second)) work.push_back(std::move(kv.second));
}

void charge_nesting(int32_t levels) {
    if (Budget* b = Budget::current()) b->nested(levels);
}

}  // namespace

void Value::release() noexcept {
    if (t_freeing) {  // inside another ~Value: hand the children over, the members then free flat
        detach(*this, *t_freeing);
        return;
    }
    List work;
    t_freeing = &work;
    detach(*this, work);
    list.reset();
    dict.reset();
    fn.reset();  // a function's captured values land on the work list too
    while (!work.empty()) {
        Value v = std::move(work.back());
        work.pop_back();
    }  // each v's destructor moves its own children onto `work`
    t_freeing = nullptr;
}

int32_t Value::nesting() const {
    if (kind == Kind::kList) return nest;
    if (kind == Kind::kDict) return dict->nest;
    return 0;
}

Value Value::make_list(List v) {
    int32_t inner = 0;
    for (const Value& x : v) inner = std::max(inner, x.nesting());
    charge_nesting(inner + 1);
    Value r = with(Kind::kList);
    r.nest = inner + 1;
    r.list = std::make_shared<List>(std::move(v));
    return r;
}
Value Value::make_dict() {
    Value r = with(Kind::kDict);
    r.dict = std::make_shared<Dict>();
    return r;
}

const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}
void Dict::holds(const Value& v) {
    const int32_t levels = v.nesting() + 1;
    if (levels <= nest) return;
    charge_nesting(levels);
    nest = levels;
}
void Dict::set(const std::string& key, Value v) {
    holds(v);
    for (auto& [k, old] : items)
        if (k == key) {
            old = std::move(v);
            return;
        }
    items.emplace_back(key, std::move(v));
}

const Value* Args::kwarg(std::string_view name) const {
    for (const auto& [k, v] : kw)
        if (k == name) return &v;
    return nullptr;
}
const Value* Args::get(size_t i, std::string_view name) const {
    return i < pos.size() ? &pos[i] : kwarg(name);
}

}  // namespace lattice::jinja
