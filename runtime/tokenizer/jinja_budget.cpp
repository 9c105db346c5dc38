// The render budget of the Jinja engine (jinja.h, class Budget in jinja_internal.h): the limits of
// one render are RenderLimits' floors plus an allowance per JSON value and per string byte of the
// context, measured once here; the budget is installed for the render's thread (renders do not nest)
// and copies its usage out when the render ends, failed or not. It also takes the thread's
// RenderInterrupt flag (checked at every step) when it starts.
#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "runtime/tokenizer/jinja_internal.h"

namespace lattice::jinja {

namespace {

thread_local Budget* t_current = nullptr;
thread_local const std::atomic<bool>* t_interrupt = nullptr;

struct ContextSize {
    int64_t values = 0, bytes = 0;
};

// Counts the context's values and string bytes (keys included); the context's own nesting is held
// to the depth limit here, before from_json recurses over it.
void measure(const nlohmann::ordered_json& j, int32_t depth, int32_t max_depth, ContextSize& out) {
    if (depth > max_depth)
        throw Error(fmt::format("chat template: the context nests deeper than {} levels", max_depth));
    ++out.values;
    if (j.is_string()) out.bytes += int64_t(j.get_ref<const std::string&>().size());
    if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) {
            out.bytes += int64_t(it.key().size());
            measure(it.value(), depth + 1, max_depth, out);
        }
    if (j.is_array())
        for (const auto& e : j) measure(e, depth + 1, max_depth, out);
}

int64_t grant(int64_t floor, int64_t per, int64_t units) {
    constexpr int64_t kMax = int64_t(1) << 60;
    if (per > 0 && units > (kMax - floor) / per) return kMax;
    return floor + per * units;
}

}  // namespace

Budget::Budget(const RenderLimits& floors, const nlohmann::ordered_json& context, RenderUsage* usage)
    : interrupt_(t_interrupt), lim_(floors), out_(usage), prev_(t_current) {
    ContextSize size;
    measure(context, 0, floors.depth, size);
    lim_.steps = grant(floors.steps, floors.steps_per_value, size.values);
    lim_.steps = grant(lim_.steps, 1, size.bytes);  // string work (code points, searches) is per byte
    lim_.loop_iterations = grant(floors.loop_iterations, floors.iterations_per_value, size.values);
    lim_.string_bytes = grant(floors.string_bytes, floors.string_bytes_per_byte, size.bytes);
    lim_.total_bytes = grant(floors.total_bytes, floors.total_bytes_per_byte, size.bytes);
    used_.limits = lim_;
    t_current = this;
}

Budget::~Budget() {
    t_current = prev_;
    if (out_) *out_ = used_;
}

Budget* Budget::current() {
    return t_current;
}

void Budget::copied(const List& items) {
    step(int64_t(items.size()));
    for (const Value& v : items)
        if (v.is_string()) produced(v.s.size());
}

void Budget::interrupted() {
    throw Oops("the render was interrupted (the server is shutting down)");
}

RenderInterrupt::RenderInterrupt(const std::atomic<bool>* flag) : prev_(t_interrupt) {
    t_interrupt = flag;
}

RenderInterrupt::~RenderInterrupt() {
    t_interrupt = prev_;
}

const std::atomic<bool>* RenderInterrupt::current() {
    return t_interrupt;
}

void Budget::over(const char* what, int64_t limit) const {
    throw Oops(fmt::format("the render exceeds its budget of {} {} (a template that runs away?)", limit, what));
}

}  // namespace lattice::jinja
