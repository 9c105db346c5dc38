// The Jinja engine's render budget (jinja.h): runaway templates end quickly with an Error naming
// the limit, the template and its line (a string doubled 40 times; two nested range(100000); list
// doubling, huge joins and replaces, values nested 40000 deep, scans of a long string, quadratic
// filters), and the real templates of ../shared/chat-templates stay under a tenth of every limit on
// small and large conversations (the margin is asserted and the largest use printed). Also what
// fuzz_jinja and the sanitizers found (each an Error naming the line: indices past 64 bits, int64
// overflow, float to int, slice steps, tojson's indent), an interrupted render, and a value of any
// depth freed in constant stack.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"
#include "runtime/tokenizer/jinja_internal.h"
#include "tests/test_paths.h"

using namespace lattice;
using json = nlohmann::ordered_json;

namespace {

struct Outcome {
    std::string error;  // "" when the render succeeded
    double seconds = 0;
    jinja::RenderUsage usage;
};

Outcome run(const std::string& src, const json& ctx = json::object(), const std::string& name = "hostile.jinja") {
    Outcome o;
    jinja::RenderOptions opt;
    opt.usage = &o.usage;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        jinja::Template(src, name).render(ctx, opt);
    } catch (const Error& e) {
        o.error = e.message();
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
}

// Well under a second in a release build; the sanitizer build runs ~5x slower.
constexpr double kRunawaySeconds = LATTICE_TEST_SANITIZE ? 5.0 : 1.0;

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// A runaway render: an Error naming the template, its line and the budget, well under a second.
void check_runaway(const std::string& src, int line, const std::string& limit) {
    CAPTURE(src);
    const Outcome o = run(src);
    MESSAGE(o.seconds << " s: " << o.error);
    CHECK(has(o.error, "chat template 'hostile.jinja' line " + std::to_string(line)));
    CHECK(has(o.error, "exceeds its budget"));
    CHECK(has(o.error, limit));
    CHECK(o.seconds < kRunawaySeconds);
}

}  // namespace

TEST_CASE("jinja budget: a string doubled 40 times ends at the one-string limit (finding: 7.8 GB in 45 s)") {
    check_runaway(
        "{% set ns = namespace(s='a') %}\n{% for i in range(40) %}\n{% set ns.s = ns.s ~ ns.s %}\n{% endfor %}"
        "{{ ns.s|length }}",
        3, "bytes in one string");
    // The same with `+`, and as output that grows without any one string growing.
    check_runaway("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                  1, "bytes in one string");
    check_runaway("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", 1, "bytes in one string");
    check_runaway("{{ 'ab' * 9000000000000000000 }}", 1, "bytes in one string");
}

TEST_CASE("jinja budget: two nested range(100000) end at the loop limit (finding: a render that never ends)") {
    check_runaway("{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}{% endfor %}", 1,
                  "loop iterations");
    // Each loop short, their product long: iterations count across nested loops.
    check_runaway("{% for i in range(1000) %}\n{% for j in range(1000) %}{% endfor %}{% endfor %}", 2,
                  "loop iterations");
    check_runaway("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}x{% endfor %}"
                  "{% endfor %}{% endfor %}",
                  1, "loop iterations");
    // range itself is held to the loop limit: no list of a billion items is made.
    check_runaway("{{ range(1000000000)|length }}", 1, "range of 1000000000 items");
}

TEST_CASE("jinja budget: lists, joins, replaces, values and filters that blow up") {
    // A list doubled: the copies count, in steps and in the bytes of their strings.
    check_runaway("{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
                  "{% endfor %}",
                  1, "budget");
    // One join or replace whose result is huge is stopped while it grows.
    check_runaway("{{ range(10000)|join('y' * 100000) }}", 1, "bytes in one string");
    check_runaway("{{ ('a' * 100000).replace('', 'b' * 1000) }}", 1, "bytes in one string");
    check_runaway("{{ ('a' * 10000)|replace('a', 'b' * 10000) }}", 1, "bytes in one string");
    check_runaway("{% set l = range(50000)|map('string')|list %}{{ (l|tojson) * 1000 }}", 1, "bytes in one string");
    // Values nested by a loop (40000 levels asked): building one deeper than the limit is the error, at
    // the line that builds it; nothing is printed or compared, and nothing recurses per level to free it.
    check_runaway("{% set ns = namespace(x=[]) %}{% for i in range(40000) %}{% set ns.x = [ns.x] %}{% endfor %}", 1,
                  "levels of nesting");
    check_runaway("{% set ns = namespace(x=1) %}\n{% for i in range(40000) %}\n{% set ns.x = {'k': ns.x} %}{% endfor %}"
                  "{{ ns.x|tojson }}",
                  3, "levels of nesting");
    check_runaway("{% set ns = namespace(x=1) %}{% for i in range(40000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                  "{{ ns.x == ns.x }}",
                  1, "levels of nesting");
    // A namespace holding itself (the one way to make a cycle): printing it ends at the limit.
    check_runaway("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}", 1, "levels of nesting");
    // Scans of a long string that make no string (length, `in`, ==, count) are charged a step per 16
    // bytes, as code_points is: before, only the bytes-of-all-strings limit held such a loop (0.7 s here).
    const json long_message = {{"messages", json::array({{{"content", std::string(1 << 20, 'a')}}})}};
    for (const char* scan : {"{{ messages[0].content|length }}", "{{ 'z' in messages[0].content }}",
                             "{{ messages[0].content == messages[0].content }}", "{{ messages[0].content.count('z') }}"}) {
        const std::string src = std::string("{% for i in range(50000) %}\n") + scan + "{% endfor %}";
        CAPTURE(src);
        const Outcome o = run(src, long_message);
        MESSAGE(o.seconds << " s: " << o.error);
        CHECK(has(o.error, "hostile.jinja' line 2"));
        CHECK(has(o.error, "steps"));
        CHECK(o.seconds < kRunawaySeconds);
    }
    // Quadratic filters on a long list run out of steps.
    check_runaway("{{ range(40000)|unique|list|length }}", 1, "steps");
    // Many macro calls, each cheap.
    check_runaway("{% macro f() %}{% for i in range(40) %}{{ i }}{% endfor %}{% endmacro %}"
                  "{% for i in range(40000) %}{{ f() }}{% endfor %}",
                  1, "budget");
}

TEST_CASE("jinja: what fuzz_jinja and hostile templates found is an Error naming the line, never a crash") {
    auto error_of = [](const std::string& src) { return run(src).error; };
    auto out_of = [](const std::string& src) { return jinja::Template(src, "t").render(json::object()); };
    // std::out_of_range escaped the engine (std::terminate): an index or attribute past 64 bits.
    CHECK(has(error_of("x\n{{ [1].99999999999999999999 }}"), "line 2 column 8: index '99999999999999999999' out of range"));
    CHECK(out_of("{{ [[1]]|map(attribute='99999999999999999999999')|list|length }}") == "1");
    // Signed overflow (undefined behaviour; INT64_MIN // -1 is SIGFPE): an Error, as Python's would be a big int.
    for (const char* src : {"{{ 9223372036854775807 + 1 }}", "{{ (-9223372036854775807 - 1) - 1 }}",
                            "{{ 4294967296 * 4294967296 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
                            "{{ -(-9223372036854775807 - 1) }}", "{{ 3 ** 50 }}", "{{ (-9223372036854775807 - 1)|abs }}"}) {
        CAPTURE(src);
        CHECK(has(error_of(src), "hostile.jinja' line 1"));
        CHECK(has(error_of(src), "beyond 64 bits"));
    }
    CHECK(out_of("{{ (-9223372036854775807 - 1) % -1 }} {{ (-1) ** 65 }} {{ (-2) ** 63 }} {{ 2 ** 62 }} {{ 7 // -2 }}") ==
          "0 -1 -9223372036854775808 4611686018427387904 -4");
    // A float past int64 (or NaN) to int: the cast would be undefined behaviour.
    CHECK(has(error_of("{{ 1e300|int }}"), "not an integer in 64 bits"));
    CHECK(has(error_of("{{ 'nan'|float|int }}"), "not an integer in 64 bits"));
    CHECK(out_of("{{ -2.7|int }} {{ 2.7|int }}") == "-2 2");
    // Slice steps anywhere in int64 (the index arithmetic overflowed).
    CHECK(out_of("{{ [1, 2, 3][1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807 - 1] }}") == "[2] [3]");
    CHECK(out_of("{{ 'abcdef'[5:0:-2] }} {{ [0, 1, 2, 3, 4][::2] }}") == "fdb [0, 2, 4]");
    // tojson's indent is charged before its padding is made (2^31 spaces a line, an int overflow on the next).
    CHECK(has(error_of("{{ [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]|tojson(indent=2147483647) }}"), "exceeds its budget"));
    CHECK(out_of("{{ [[1]]|tojson(indent=2147483647)|length > 1000 }}") == "True");
    // RenderInterrupt (a server draining): once its flag is set, a render on the thread ends at its next step.
    std::atomic<bool> stop{false};
    {
        const jinja::RenderInterrupt scope(&stop);
        CHECK(out_of("{{ 1 }}") == "1");
        stop = true;
        const std::string e = error_of("{% for i in range(3) %}{{ i }}{% endfor %}");
        CHECK_MESSAGE((has(e, "hostile.jinja' line 1") && has(e, "the render was interrupted")), e);
    }
    CHECK(out_of("{{ 1 }}") == "1");  // the scope has ended: renders here are not interrupted
}

TEST_CASE("jinja: a value of any depth frees without recursing per level (lists, dicts, functions)") {
    // Outside a render there is no depth limit: this is the destructor alone, 300000 levels deep
    // (freeing recursed once per level: 40000 overflowed the stack under AddressSanitizer).
    jinja::Value v = jinja::Value::integer(1);
    for (int i = 0; i < 300000; ++i) {
        if (i % 1000 == 999) {  // a function holding the value so far (a macro or method capturing it)
            v = jinja::Value::func([v](jinja::Args&) { return v; });
        } else if (i % 2 == 0) {
            v = jinja::Value::make_list({v});
        } else {
            jinja::Value d = jinja::Value::make_dict();
            d.dict->set("k", v);
            v = d;
        }
        if (i == 997) CHECK(v.nesting() == 998);  // lists and dicts count their levels
    }
    CHECK(v.kind == jinja::Value::Kind::kFunc);
    v = jinja::Value();  // the whole chain goes here
    CHECK(v.undefined());
}

TEST_CASE("jinja budget: usage is reported, limits grow with the context, and small limits hold") {
    Outcome o = run("{% for m in messages %}{{ m.content }}{% endfor %}",
                    {{"messages", json::array({{{"content", "abc"}}, {{"content", "de"}}})}});
    CHECK(o.error.empty());
    CHECK(o.usage.loop_iterations == 2);
    CHECK(o.usage.steps > 0);
    CHECK(o.usage.string_bytes >= 5);
    // A 4 MB conversation is no runaway: its allowance is sized by the context.
    json big = json::array();
    for (int i = 0; i < 4000; ++i) big.push_back({{"role", "user"}, {"content", std::string(1000, 'a' + i % 26)}});
    o = run("{% for m in messages %}{{ m.role }}: {{ m.content|trim }}\n{% endfor %}", {{"messages", big}});
    CHECK(o.error.empty());
    CHECK(o.usage.limits.string_bytes > 16 * 1000 * 1000);
    CHECK(o.usage.limits.steps > 1000 * 1000);
    // Explicit floors are honoured (a caller may tighten them).
    jinja::RenderOptions opt;
    opt.limits.loop_iterations = 10;
    opt.limits.iterations_per_value = 0;
    CHECK_THROWS_WITH_AS(jinja::Template("{% for i in range(11) %}{% endfor %}", "t").render(json::object(), opt),
                         doctest::Contains("10 loop iterations"), Error);
    CHECK_NOTHROW(jinja::Template("{% for i in range(10) %}{% endfor %}", "t").render(json::object(), opt));
    // A context nested past the depth limit is refused before it is converted.
    json deep = 1;
    for (int i = 0; i < 300; ++i) deep = json::array({deep});
    CHECK_THROWS_WITH_AS(jinja::Template("{{ x }}", "t").render({{"x", deep}}), doctest::Contains("nests deeper"),
                         Error);
}

namespace {

json tools_json() {
    return json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {
          "city": {"type": "string", "description": "The city"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
          "days": {"type": ["integer", "number"], "description": "Forecast days"},
          "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
          "required": ["a", "b"]}}}])");
}

// A conversation of `turns` rounds: user, assistant with a tool call, tool result, assistant text.
json conversation(int turns, size_t content_bytes) {
    json m = json::array({{{"role", "system"}, {"content", "You are terse."}}});
    for (int i = 0; i < turns; ++i) {
        const std::string text(content_bytes, char('a' + i % 26));
        m.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + ": " + text}});
        m.push_back({{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls", json::array({{{"id", "call00000"},
                                                  {"type", "function"},
                                                  {"function", {{"name", "add"}, {"arguments", {{"a", i}, {"b", 2}}}}}}})}});
        m.push_back({{"role", "tool"}, {"tool_call_id", "call00000"}, {"content", std::to_string(i + 2)}});
        m.push_back({{"role", "assistant"}, {"content", "The answer is " + std::to_string(i + 2) + ". " + text}});
    }
    m.push_back({{"role", "user"}, {"content", "Thanks"}});
    return m;
}

}  // namespace

TEST_CASE("jinja budget: every real chat template stays under a tenth of every limit") {
    const std::string dir = test::shared_file("chat-templates");
    REQUIRE_FILE(dir);
    struct Size {
        int turns;
        size_t bytes;
    };
    double worst = 0;
    std::string worst_what;
    int rendered = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".jinja") continue;
        std::ifstream f(entry.path());
        std::stringstream text;
        text << f.rdbuf();
        const jinja::Template t(text.str(), entry.path().filename().string());
        for (const Size sz : {Size{1, 20}, Size{50, 200}, Size{400, 2000}}) {
            for (const bool with_tools : {false, true}) {
                const json ctx = {{"messages", conversation(sz.turns, sz.bytes)},
                                  {"tools", with_tools ? tools_json() : json(nullptr)},
                                  {"add_generation_prompt", true},
                                  {"bos_token", "<s>"},
                                  {"eos_token", "</s>"}};
                jinja::RenderUsage u;
                jinja::RenderOptions opt;
                opt.usage = &u;
                try {
                    t.render(ctx, opt);
                } catch (const Error& e) {
                    // Templates may refuse a conversation (roles, tool formats); never for the budget.
                    CHECK_MESSAGE(!has(e.message(), "budget"), e.message());
                }
                ++rendered;
                const std::pair<const char*, double> ratios[] = {
                    {"steps", double(u.steps) / double(u.limits.steps)},
                    {"loop iterations", double(u.loop_iterations) / double(u.limits.loop_iterations)},
                    {"one string", double(u.string_bytes) / double(u.limits.string_bytes)},
                    {"all strings", double(u.total_bytes) / double(u.limits.total_bytes)},
                    {"nesting", double(u.depth) / double(u.limits.depth)}};
                if (sz.turns == 400 && with_tools)
                    MESSAGE(t.name() << ": steps " << u.steps << "/" << u.limits.steps << " iterations "
                                     << u.loop_iterations << "/" << u.limits.loop_iterations << " string "
                                     << u.string_bytes << "/" << u.limits.string_bytes << " all " << u.total_bytes
                                     << "/" << u.limits.total_bytes << " depth " << u.depth);
                for (const auto& [what, r] : ratios)
                    if (r > worst) {
                        worst = r;
                        worst_what = fmt::format("{} of its {} limit ({}, {} turns of {} bytes, tools {})", r, what,
                                                 t.name(), sz.turns, sz.bytes, with_tools);
                    }
            }
        }
    }
    MESSAGE("the largest share of a limit any real template used: " << worst_what);
    CHECK(rendered >= 12 * 6);
    CHECK(worst < 0.1);
}
