// The Jinja engine's features one by one (jinja.h), its error messages (template line and column,
// raise_exception's message), and the ChatTemplate that renders a model's own template: the
// built-in default model's template gives exactly the prompt of the built-in ChatML format it
// replaced. test_jinja_vs_python.py compares whole real templates with Python's jinja2.
#include <doctest/doctest.h>

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/test_paths.h"

using namespace lattice;
using json = nlohmann::ordered_json;

namespace {

std::string render(const std::string& src, const json& ctx = json::object(), jinja::RenderOptions opt = {}) {
    return jinja::Template(src, "t").render(ctx, opt);
}

std::string error_of(const std::string& src, const json& ctx = json::object()) {
    try {
        render(src, ctx);
    } catch (const Error& e) {
        return e.message();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("jinja: output, comments, literals and escapes") {
    CHECK(render("a{{ 'b' }}c{# gone #}d") == "abcd");
    CHECK(render(R"({{ "q\"\n\t\u00e9\x41" }})") ==
          "q\"\n\t\xc3\xa9"
          "A");
    CHECK(render("{{ 'a' 'b' }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 2 ** 10 }}|{{ 1.5 * 2 }}") ==
          "ab|3|-4|2|3.5|1024|3.0");
    CHECK(render("{{ none }}|{{ true }}|{{ [1, 'x', none] }}|{{ {'k': 'v'} }}|{{ 1 ~ 'x' ~ undefined_thing }}") ==
          "None|True|[1, 'x', None]|{'k': 'v'}|1x");
    CHECK(render("{{ x }}|{{ x is defined }}|{{ y.z is defined }}", {{"y", json::object()}}) == "|False|False");
}

TEST_CASE("jinja: whitespace control as transformers configures jinja2 (trim_blocks, lstrip_blocks)") {
    // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one.
    CHECK(render("{% if true %}\n  x\n{% endif %}\ny") == "  x\ny");
    CHECK(render("a\n    {% if true %}b{% endif %}\n") == "a\nb");
    // `-` strips all whitespace on its side, newlines included; `{{` is never lstripped.
    CHECK(render("a  \n  {{- 'b' -}}  \n c") == "abc");
    CHECK(render("a\n  {{ 'b' }}\nz") == "a\n  b\nz");
    // `+` keeps what lstrip/trim would drop; comments trim like blocks.
    CHECK(render("  {%+ if true %}x{% endif +%}\nz") == "  x\nz");
    CHECK(render("{# c #}\nz") == "z");
    // jinja2's defaults: one trailing newline of the source dropped, CRLF read as "\n".
    CHECK(render("a\n\n") == "a\n");
    CHECK(render("a\r\nb{% if true %}\r\nc{% endif %}") == "a\nbc");
}

TEST_CASE("jinja: if/elif/else, for with loop variables, for-else, filters on loops, unpacking, break") {
    CHECK(render("{% for x in [3, 4, 5] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                 "{{ loop.length }}{{ loop.revindex }},{% endfor %}") == "10TrueFalse33,21FalseFalse32,32FalseTrue31,");
    CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
    CHECK(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}") == "2242");
    CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}",
                 {{"d", {{"b", 1}, {"a", 2}}}}) == "b=1;a=2;ba");
    CHECK(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
                 "{% endif %}{{ x }}{% endfor %}") == "1");
    CHECK(render("{% for x in 'ab' %}{{ loop.previtem is defined }}{{ loop.nextitem }}{% endfor %}") == "FalsebTrue");
    CHECK(render("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}") == "c");
}

TEST_CASE("jinja: set scoping, namespace attributes, tuple set, block set, macros") {
    // A set inside a loop stays in the loop; a namespace carries values out.
    CHECK(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
    CHECK(render(
              "{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") ==
          "6");
    CHECK(render("{{ 1, 'a' }}|{{ (1,) }}|{{ {'k': 1}.items()|list }}|{{ (1, 2) == [1, 2] }}") ==
          "(1, 'a')|(1,)|[('k', 1)]|False");
    CHECK(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}{% set t %}in{{ a }}{% endset %}{{ t }}") == "21in1");
    CHECK(render("{% macro f(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b='x') }}{{ f(a=3) }}") ==
          "[1d][2x][3d]");
    // Recursion, as the Hermes tool template's json_to_python_type does.
    CHECK(render("{% macro c(n) %}{% if n > 0 %}{{ n }}{{ c(n - 1) }}{% endif %}{% endmacro %}{{ c(3) }}") == "321");
}

TEST_CASE("jinja: filters, tests, operators, subscripts and slices") {
    const json ctx = {{"m", json::array({{{"role", "user"}, {"c", 1}}, {{"role", "system"}}, {{"role", "user"}}})}};
    CHECK(render("{{ m|selectattr('role', 'equalto', 'user')|list|length }}{{ m|rejectattr('c')|list|length }}"
                 "{{ m|map(attribute='role')|join(',') }}",
                 ctx) == "22user,system,user");
    CHECK(
        render("{{ ' a '|trim }}|{{ 'AB'|lower }}|{{ 'ab'|upper }}|{{ 'hELLO world'|capitalize }}|{{ "
               "'a-b'|replace('-', '+') }}|"
               "{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ u|default('dflt') }}|{{ 3|string + 'x' }}|{{ 'x y'|title }}") ==
        "a|ab|AB|Hello world|a+b|12|dflt|3x|X Y");
    CHECK(render("{{ {'b': [1, 'é'], 'a': none}|tojson }}") == "{\"b\": [1, \"é\"], \"a\": null}");
    CHECK(render("{{ {'a': [1, {}]}|tojson(indent=2) }}") == "{\n  \"a\": [\n    1,\n    {}\n  ]\n}");
    CHECK(render("{{ x is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is not string }}"
                 "{{ 3 is divisibleby 3 }}",
                 {{"x", nullptr}}) == "TrueTrueTrueTrueTrueTrue");
    CHECK(render("{{ 'b' in 'abc' }}{{ 'k' in {'k': 1} }}{{ 2 not in [1] }}{{ not 1 or 0 }}{{ 1 and 'y' }}") ==
          "TrueTrueTrue0y");
    CHECK(render("{{ 'yes' if 1 > 0 else 'no' }}{{ 'x' if false }}|{{ (1 + 2) * 3 }}") == "yes|9");
    CHECK(render("{{ 'héllo'[::-1] }}|{{ [1, 2, 3][1:] }}|{{ 'abc'[-1] }}|{{ [1, 2, 3][:-1] }}|{{ 'héllo'|length }}") ==
          "olléh|[2, 3]|c|[1, 2]|5");
}

TEST_CASE("jinja: string and dict methods; raise_exception and strftime_now") {
    CHECK(render("{{ 'a</think>\\nb'.split('</think>')[-1].lstrip('\\n') }}|{{ 'x y  z'.split() }}|{{ ' s '.strip() }}|"
                 "{{ '\u3000x\u00a0\n'|trim }}{{ 'éaé'.strip('é') }}{{ 'ab'.startswith('a') }}{{ 'ab'.endswith(('x', "
                 "'b')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'Ab'.lower() }}") ==
          "b|['x', 'y', 'z']|s|xaTrueTrue|bXb|ab");
    const json ctx = {{"d", {{"k", 1}}}};
    CHECK(render("{{ d.get('k') }}{{ d.get('z', 'dz') }}{{ d.get('z') }}{{ d.keys()|list }}{{ d.values()|list }}",
                 ctx) == "1dzNone['k'][1]");
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    jinja::RenderOptions opt;
    opt.now = tm;
    CHECK(render("{{ strftime_now('%d %b %Y') }}", json::object(), opt) == "26 Jul 2024");
    CHECK(render("{{ strftime_now('%Y') }}").size() == 4);  // the clock's date
    CHECK(error_of("line one\n{{ raise_exception('Roles must alternate') }}") ==
          "chat template 't' line 2 column 4: raise_exception: Roles must alternate");
}

TEST_CASE("jinja: errors name the template, line and column") {
    CHECK(error_of("ab\n  {% if x %}") == "chat template 't' line 2 column 3: missing '{% endif %}' for this block");
    CHECK(error_of("{{ 'open }}") == "chat template 't' line 1 column 4: unclosed string literal");
    CHECK(error_of("x\n{% frobnicate %}") ==
          "chat template 't' line 2 column 4: unknown or unexpected statement 'frobnicate'");
    CHECK(error_of("{{ 1 +\n}}") == "chat template 't' line 2 column 1: unexpected '}}'");
    // Unknown filters and tests fail at parse time, reached or not (as jinja2's compiler does).
    CHECK(error_of("{% for x in [] %}{{ x|nosuchfilter }}{% endfor %}") ==
          "chat template 't' line 1 column 23: unknown filter 'nosuchfilter'");
    // ... except inside an `if` or a conditional expression, where only reaching them fails.
    CHECK(render("{% if false %}{{ x|nosuchfilter }}{% endif %}{{ x|nosuchfilter if false }}") == "");
    CHECK(error_of("{% if true %}{{ x|nosuchfilter }}{% endif %}") ==
          "chat template 't' line 1 column 18: unknown filter 'nosuchfilter'");
    CHECK(error_of("{{ x is nosuchtest }}") == "chat template 't' line 1 column 9: unknown test 'nosuchtest'");
    CHECK(error_of("\n\n   {{ messages[0].role }}", {{"messages", json::array()}}) ==
          "chat template 't' line 3 column 7: 'messages[0]' is undefined");
    CHECK(error_of("{{ 'a' + 1 }}") ==
          "chat template 't' line 1 column 8: unsupported operand types for +: string and integer");
    CHECK(error_of("{% set n.x = 1 %}", {{"n", 1}}) ==
          "chat template 't' line 1 column 4: cannot set attribute 'x' of 'n': not a namespace()");
    CHECK(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}")
              .find("nesting deeper than 200") != std::string::npos);
    CHECK(error_of("{{ " + std::string(100000, '-') + "1 }}").find("nesting deeper than 200") != std::string::npos);
    std::string ifs;
    for (int i = 0; i < 1000; ++i) ifs += "{% if 1 %}";
    CHECK(error_of(ifs).find("nesting deeper than 200") != std::string::npos);
    CHECK(error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("recursion too deep") !=
          std::string::npos);
}

TEST_CASE("chat template from the model: the default model's template renders what the built-in ChatML did") {
    const std::string path = test::default_model_file();
    REQUIRE_FILE(path);
    auto tok = load_tokenizer(path);
    const ChatTemplate model = tok->chat_template();
    REQUIRE(model.from_model());
    CHECK(tok->chat_template_kind() == ChatTemplateKind::kChatML);
    const ChatTemplate builtin(ChatTemplateKind::kChatML, "", "",
                               "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    const std::vector<std::vector<ChatMessage>> convs = {
        {{"user", "Describe the ocean in two sentences."}},
        {{"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!"}, {"user", "2+2?\n"}},
        {{"user", "Grüße 🙂"}, {"assistant", ""}, {"user", "{{ not jinja }}"}},
    };
    for (const auto& c : convs)
        for (bool agp : {true, false}) CHECK(model.render(c, agp) == builtin.render(c, agp));
    // Tools reach a template that uses them; this one ignores them. The hard-coded formats refuse.
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    CHECK(model.render(convs[0], true, tools) == builtin.render(convs[0], true));
    CHECK_THROWS_AS(builtin.render(convs[0], true, tools), Error);
}

TEST_CASE("chat template from the model: tools, tool messages and raise_exception reach the caller") {
    const std::string src =
        "{{ bos_token }}{% if tools %}[T]{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}"
        "{% for m in messages %}{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}"
        "<{{ m.role }}>{{ m.content if m.content is not none else m.tool_calls|tojson }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token if not add_generation_prompt }}";
    const ChatTemplate t(std::make_shared<const jinja::Template>(src, "test"), ChatTemplateKind::kJinja, "<s>", "</s>");
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}});
    CHECK(t.render({{"user", "Hi"}}, true, tools) == "<s>[T]get_weather;<user>Hi<assistant>");
    CHECK(t.render({{"user", "Hi"}}, false) == "<s><user>Hi</s>");
    const json msgs = json::array({{{"role", "assistant"},
                                    {"content", nullptr},
                                    {"tool_calls", json::array({{{"id", "1"}, {"function", {{"name", "f"}}}}})}},
                                   {{"role", "tool"}, {"content", "42"}}});
    CHECK(t.render_json(msgs, false) == "<s><assistant>[{\"id\": \"1\", \"function\": {\"name\": \"f\"}}]<tool>42</s>");
    try {
        t.render({{"robot", "x"}}, true);
        FAIL("expected an Error");
    } catch (const Error& e) {
        CHECK(std::string(e.message()).find("no robots") != std::string::npos);
    }
}
