// Tool calls parsed back from model outputs (runtime/tokenizer/tool_calls.h): the format each real
// chat template teaches (../shared/chat-templates), outputs in each format (several calls, text
// around them, arguments as a string, an unclosed last tag, a call of a tool not offered, broken
// JSON: content, never an error), and the forced call's schema and prompt suffix.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "runtime/tokenizer/tool_calls.h"
#include "tests/test_paths.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_tool_calls {

using namespace lattice;
using nlohmann::json;

namespace {

std::string read_template(const std::string& name) {
    std::ifstream f(lattice::test::shared_file("chat-templates/" + name));
    REQUIRE_MESSAGE(f.good(), name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

const std::set<std::string> kNames = {"get_weather", "get_time"};

}  // namespace

TEST_CASE("the format each real chat template teaches") {
    CHECK(tool_call_format(read_template("Qwen-Qwen2.5-7B-Instruct.jinja")) == ToolCallFormat::kHermes);
    CHECK(tool_call_format(read_template("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")) ==
          ToolCallFormat::kHermes);
    CHECK(tool_call_format(read_template("Qwen-QwQ-32B.jinja")) == ToolCallFormat::kHermes);
    CHECK(tool_call_format(read_template("mistralai-Mistral-Nemo-Instruct-2407.jinja")) == ToolCallFormat::kMistral);
    CHECK(tool_call_format(read_template("meta-llama-Llama-3.1-8B-Instruct.jinja")) == ToolCallFormat::kJson);
    CHECK(tool_call_format(read_template("meta-llama-Llama-3.3-70B-Instruct.jinja")) == ToolCallFormat::kJson);
    CHECK(tool_call_format("") == ToolCallFormat::kJson);
}

TEST_CASE("Hermes: every <tool_call> block, text around them is content") {
    const std::string out =
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}\n</tool_call>";
    const ToolCallOutput r = parse_tool_calls(out, ToolCallFormat::kHermes, kNames);
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(json::parse(r.calls[0].arguments) == json{{"city", "Paris"}});
    CHECK(r.calls[1].name == "get_time");
    CHECK(json::parse(r.calls[1].arguments) == json{{"zone", "CET"}});  // arguments sent as a string
    CHECK(r.content == "Let me check.");
    // The last block cut by max_tokens after its JSON: still a call.
    const ToolCallOutput cut =
        parse_tool_calls("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}", ToolCallFormat::kHermes, kNames);
    REQUIRE(cut.calls.size() == 1);
    CHECK(cut.calls[0].arguments == "{}");
    // Not calls: an unknown tool, broken JSON, arguments that are not an object. The text is kept whole.
    for (const std::string bad :
         {"<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
          "<tool_call>{\"name\": \"get_time\", \"arguments\": {</tool_call>",
          "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>", "It is sunny in Paris."}) {
        CAPTURE(bad);
        const ToolCallOutput r2 = parse_tool_calls(bad, ToolCallFormat::kHermes, kNames);
        CHECK(r2.calls.empty());
        CHECK(r2.content == bad);
    }
}

TEST_CASE("Llama 3.1 JSON: the whole output one object with parameters, after <|python_tag|> or not") {
    const ToolCallOutput a = parse_tool_calls(
        " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome; IT\"}}\n", ToolCallFormat::kJson, kNames);
    REQUIRE(a.calls.size() == 1);
    CHECK(json::parse(a.calls[0].arguments) == json{{"city", "Rome; IT"}});  // a ';' inside a string is not a split
    CHECK(a.content.empty());
    const ToolCallOutput b = parse_tool_calls(
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {}}; {\"name\": \"get_time\", \"parameters\": "
        "{\"zone\": \"UTC\"}}",
        ToolCallFormat::kJson, kNames);
    REQUIRE(b.calls.size() == 2);
    CHECK(b.calls[1].name == "get_time");
    for (const std::string text : {"The weather is {\"name\": \"get_weather\"}", "{\"city\": \"Paris\"}",
                                   "{\"name\": \"get_weather\", \"parameters\": 3}"}) {
        CAPTURE(text);
        const ToolCallOutput r = parse_tool_calls(text, ToolCallFormat::kJson, kNames);
        CHECK(r.calls.empty());
        CHECK(r.content == text);
    }
}

TEST_CASE("Mistral: [TOOL_CALLS] and an array of calls") {
    const ToolCallOutput r = parse_tool_calls(
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", "
        "\"arguments\": {\"zone\": \"CET\"}}]",
        ToolCallFormat::kMistral, kNames);
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.content.empty());
    CHECK(parse_tool_calls("[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]", ToolCallFormat::kMistral, kNames)
              .calls.empty());
}

TEST_CASE("a forced call: the schema of the call object per format, its suffix, its parse") {
    const json weather = {{"type", "function"},
                          {"function",
                           {{"name", "get_weather"},
                            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
    const json time_fn = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    const json one = forced_call_schema({weather}, ToolCallFormat::kJson);
    CHECK(one["properties"]["name"]["const"] == "get_weather");
    CHECK(one["required"] == json{"name", "parameters"});
    CHECK(one["properties"]["parameters"] == weather["function"]["parameters"]);
    const json two = forced_call_schema({weather, time_fn}, ToolCallFormat::kHermes);
    REQUIRE(two["anyOf"].size() == 2);
    CHECK(two["anyOf"][1]["required"] == json{"name", "arguments"});
    CHECK(two["anyOf"][1]["properties"]["arguments"]["type"] == "object");  // no parameters: an object
    CHECK(forced_prompt_suffix(ToolCallFormat::kHermes) == "<tool_call>\n");
    CHECK(forced_prompt_suffix(ToolCallFormat::kJson).empty());
    const ToolCallOutput r = parse_forced_call("{\"name\":\"get_time\",\"arguments\":{}}", ToolCallFormat::kHermes);
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "get_time");
}

}  // namespace test_tool_calls
