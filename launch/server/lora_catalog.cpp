// LoraCatalog and the adapter routes of `lattice serve` (see lora_catalog.h).
#include "launch/server/lora_catalog.h"

#include "base/error.h"
#include "base/log.h"
#include "launch/server/api.h"

#include <fmt/format.h>

#include <algorithm>

namespace lattice::serve {

void LoraCatalog::seed(const std::string& name, const std::string& path) {
    LATTICE_CHECK(name != base_, "LoRA adapter '{}' takes the served model's name (--served-model-name)", name);
    std::lock_guard lock(mu_);
    names_.emplace_back(name, path);
}

bool LoraCatalog::has(const std::string& name) const {
    std::lock_guard lock(mu_);
    return std::any_of(names_.begin(), names_.end(), [&](const auto& n) { return n.first == name; });
}

std::vector<std::pair<std::string, std::string>> LoraCatalog::list() const {
    std::lock_guard lock(mu_);
    return names_;
}

void LoraCatalog::load(const std::string& name, const std::string& path) {
    LATTICE_CHECK(!has(name), "the LoRA adapter '{}' has already been loaded", name);
    LATTICE_CHECK(name != base_, "the LoRA adapter name '{}' is the served model's", name);
    checker_.check(name, path);  // every check before anything changes
    std::lock_guard lock(mu_);
    LATTICE_CHECK(std::none_of(names_.begin(), names_.end(), [&](const auto& n) { return n.first == name; }),
                  "the LoRA adapter '{}' has already been loaded", name);
    names_.emplace_back(name, path);
    ops_.push_back(Op{true, name, path});
}

void LoraCatalog::unload(const std::string& name) {
    std::lock_guard lock(mu_);
    const auto it = std::find_if(names_.begin(), names_.end(), [&](const auto& n) { return n.first == name; });
    LATTICE_CHECK(it != names_.end(), "the LoRA adapter '{}' cannot be found", name);
    names_.erase(it);
    ops_.push_back(Op{false, name, ""});
}

void LoraCatalog::apply(LoraRegistry& reg) {
    std::deque<Op> ops;
    {
        std::lock_guard lock(mu_);
        if (ops_.empty()) return;
        ops.swap(ops_);
    }
    for (const Op& op : ops) {
        try {
            if (op.load)
                reg.add(op.name, op.path);
            else
                reg.remove(op.name);
            LOG_INFO("serve: LoRA adapter '{}' {}", op.name, op.load ? "loaded from " + op.path : "unloaded");
        } catch (const Error& e) {  // the file changed since it was checked
            LOG_ERROR("serve: LoRA adapter '{}': {}", op.name, e.message());
            std::lock_guard lock(mu_);
            std::erase_if(names_, [&](const auto& n) { return n.first == op.name; });
        }
    }
}

Reply lora_admin_reply(bool load, std::string_view body, bool have_api_key, LoraCatalog& catalog) {
    if (!have_api_key)
        return error_reply(403, "loading and unloading LoRA adapters at run time needs the server to have --api-key",
                           "", "forbidden");
    std::string name, path;
    try {
        const nlohmann::json b = openai::parse_body(body);
        LATTICE_CHECK(b.is_object() && b.contains("lora_name") && b["lora_name"].is_string(),
                      "\"lora_name\" (a string) is required");
        name = b["lora_name"].get<std::string>();
        if (load) {
            LATTICE_CHECK(b.contains("lora_path") && b["lora_path"].is_string(), "\"lora_path\" (a string) is required");
            path = b["lora_path"].get<std::string>();
        }
    } catch (const Error& e) {
        return error_reply(400, e.message(), openai::error_param(e.message()));
    }
    if (!load && !catalog.has(name))
        return error_reply(404, fmt::format("the LoRA adapter '{}' cannot be found", name), "lora_name",
                           "model_not_found");
    try {
        if (load)
            catalog.load(name, path);
        else
            catalog.unload(name);
    } catch (const Error& e) {
        return error_reply(400, e.message(), "lora_name");
    }
    Reply r;
    r.content_type = "text/plain; charset=utf-8";
    r.body = fmt::format("Success: LoRA adapter '{}' {} successfully.", name, load ? "added" : "removed");
    return r;
}

}  // namespace lattice::serve
