// libFuzzer target for the Jinja chat-template engine (runtime/tokenizer/jinja.h): the input is a
// template, parsed and rendered on a fixed conversation with tools (the context real templates
// see). Each input runs under a render budget a tenth of the engine's defaults, so an input costs at
// most ~0.1 s and a few tens of MB even when it loops or grows strings (libFuzzer's -timeout and
// -rss_limit_mb in run_fuzz_jinja catch a budget that stops holding). Invariants checked:
// lattice::Error is the only exception; a finished render's output fits the one-string limit and the
// reported usage within every limit.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
    static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris? \u00e9\ud83d\ude42"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call1", "content": "21"},
        {"role": "assistant", "content": "21 C."}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
    return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 64 * 1024) return 0;  // templates are a few KB; longer inputs only slow the search
    const std::string_view src(reinterpret_cast<const char*>(data), size);
    lattice::jinja::RenderOptions opt;
    opt.limits.steps = 100'000;
    opt.limits.loop_iterations = 5'000;
    opt.limits.string_bytes = 1 << 20;
    opt.limits.total_bytes = 16 << 20;
    std::tm now{};
    now.tm_year = 124;
    opt.now = now;
    lattice::jinja::RenderUsage usage;
    opt.usage = &usage;
    try {
        const lattice::jinja::Template t(src, "fuzz.jinja");
        const std::string out = t.render(context(), opt);
        const lattice::jinja::RenderLimits& lim = usage.limits;
        if (int64_t(out.size()) > lim.string_bytes || usage.steps > lim.steps ||
            usage.loop_iterations > lim.loop_iterations || usage.total_bytes > lim.total_bytes ||
            usage.depth > lim.depth)
            std::abort();
    } catch (const lattice::Error&) {
    }
    return 0;
}
