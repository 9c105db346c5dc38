// The OpenAI-shaped request parser (launch/openai/request.h) maps the sampling fields onto the same
// SamplingParams the CLI fills (runtime/engine/sampler.h): presence / frequency penalties, min_p and
// vLLM's repetition_penalty (over the whole sequence unless repeat_last_n), with their defaults
// (off), and refuses out-of-range values naming the field.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "launch/openai/request.h"

using namespace lattice;
using namespace lattice::openai;
using nlohmann::json;

namespace {
const ApiLimits kLimits{100};
}

TEST_CASE("sampling fields map onto SamplingParams") {
    const ApiRequest r = parse_api_request(json{{"prompt", {1, 2, 3}},
                                                {"presence_penalty", 0.5},
                                                {"frequency_penalty", -1.25},
                                                {"min_p", 0.1},
                                                {"repetition_penalty", 1.2}},
                                           false, nullptr, kLimits);
    const SamplingParams& p = r.client.sampling;
    CHECK(p.presence_penalty == 0.5f);
    CHECK(p.frequency_penalty == -1.25f);
    CHECK(p.min_p == doctest::Approx(0.1));
    CHECK(p.repeat_penalty == doctest::Approx(1.2));
    CHECK(p.repeat_last_n == -1);  // vLLM's: the whole sequence
    CHECK(parse_api_request(json{{"prompt", {1}}, {"repetition_penalty", 1.1}, {"repeat_last_n", 16}}, false, nullptr,
                            kLimits)
              .client.sampling.repeat_last_n == 16);
    const SamplingParams d = parse_api_request(json{{"prompt", {1}}}, false, nullptr, kLimits).client.sampling;
    CHECK(d.presence_penalty == 0.0f);
    CHECK(d.frequency_penalty == 0.0f);
    CHECK(d.min_p == 0.0f);
    CHECK(d.repeat_penalty == 1.0f);
    // A token id above INT64_MAX is named as sent, not wrapped into -1.
    CHECK_THROWS_WITH_AS(parse_api_request(json::parse(R"({"prompt": [18446744073709551615]})"), false, nullptr, kLimits),
                         doctest::Contains("18446744073709551615 is outside the vocab"), Error);
    // vLLM's priority: an integer, lower first, default 0.
    CHECK(parse_api_request(json{{"prompt", {1}}, {"priority", -3}}, false, nullptr, kLimits).client.priority == -3);
    CHECK(parse_api_request(json{{"prompt", {1}}}, false, nullptr, kLimits).client.priority == 0);
}

TEST_CASE("out-of-range sampling fields are refused naming the field") {
    for (const auto& field_value : std::vector<std::pair<const char*, json>>{{"presence_penalty", 2.5},
                                                                                 {"frequency_penalty", -3},
                                                                                 {"min_p", 1.5},
                                                                                 {"repetition_penalty", 0},
                                                                                 {"presence_penalty", "high"},
                                                                                 {"priority", "high"},
                                                                                 {"priority", 1.5}}) {
        const char* field = field_value.first;
        const json& value = field_value.second;
        CAPTURE(field);
        json b = {{"prompt", {1}}};
        b[field] = value;
        CHECK_THROWS_WITH_AS(parse_api_request(b, false, nullptr, kLimits), doctest::Contains(field), Error);
    }
}

TEST_CASE("fields not implemented yet, wrong-endpoint and unknown fields are refused naming the field") {
    for (const auto& field_value : std::vector<std::pair<const char*, json>>{{"logprobs", true},
                                                                             {"logprobs", 21},
                                                                             {"top_logprobs", 2},
                                                                             {"max_token", 5},
                                                                             {"suffix", "x"},
                                                                             {"logit_bias", {{"15", 100}}},
                                                                             {"tools", json::array({json{{"type", "function"}}})},
                                                                             {"response_format", {{"type", "json_object"}}}}) {
        const char* field = field_value.first;
        CAPTURE(field);
        json b = {{"prompt", {1}}};
        b[field] = field_value.second;
        CHECK_THROWS_WITH_AS(parse_api_request(b, false, nullptr, kLimits), doctest::Contains(field), Error);
    }
    json neutral = {{"prompt", {1}},        {"logprobs", false},   {"echo", false},
                    {"top_logprobs", nullptr}, {"logit_bias", json::object()}, {"suffix", nullptr},
                    {"user", "u"},          {"response_format", {{"type", "text"}}}};
    CHECK_NOTHROW(parse_api_request(neutral, false, nullptr, kLimits));
}
