// One request body to a call ready for the engine, or the refusal serve answers for it: the single
// validation that `lattice serve` (launch/server/api.cpp) and `lattice batch` (launch/cmd_batch.cpp)
// share, so both take and refuse exactly the same bodies with the same statuses and messages.
// Checks, in order: "model" other than the served name or a LoRA adapter's -> 404 (absent is fine; the message names
// both); any field error of parse_api_request -> 400 (its message, the field as "param"); the prompt
// and max_tokens against the context (check_context: never clamped) -> 400. The tokenizer is handed
// to the call, so the response shaper writes token text (not ids) in logprobs.
// No message names a server path: the tokenizer's file is replaced by the served name.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "launch/openai/request.h"
#include "launch/openai/response.h"

namespace lattice::openai {

struct ModelInfo {
    std::string name;                      // the served id ("model" must match it when given)
    const Tokenizer* tokenizer = nullptr;  // null: prompts must be token ids
    ApiLimits limits;
    int64_t context = 0;  // positions per sequence (max_model_len; <= 0: unchecked)
    std::function<bool(const std::string&)> is_adapter;  // a LoRA adapter's name "model" may give too (empty: none)
};

struct Refusal {
    int status = 400;
    std::string message, param, code;
    std::string body() const { return error_json(status, message, param, code); }
};

struct Prepared {
    std::optional<ApiCall> call;
    std::optional<Refusal> refusal;  // exactly one of the two
};

// `id` and `created` become the response's.
Prepared prepare_call(const nlohmann::json& body, bool chat, const ModelInfo& m, std::string id, int64_t created);

// `message` with the tokenizer's file (and its folder) written as the served name.
std::string without_paths(std::string message, const ModelInfo& m);

}  // namespace lattice::openai
