// The LoRA adapters `lattice serve` offers, as the HTTP threads see them: names for /v1/models and for
// routing a request's "model", and the runtime load / unload requests (POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter, vLLM's shapes) handed to the engine thread, which owns the engine's
// LoraRegistry (runtime/engine/lora_registry.h) and applies them (apply()) before it takes the next
// submissions, so a request sent after a load's reply finds the adapter.
// A load is checked here, on the HTTP thread, before it is answered (the whole adapter read against the
// base: shapes, rank, targets, file integrity): a bad adapter is a 400 naming the fault and changes
// nothing. These routes need an API key (they make the server read a path it is given).
// Thread-safe (one mutex); apply() is the engine thread's only.
#pragma once

#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/engine/lora_registry.h"

namespace lattice::serve {

struct Reply;

class LoraCatalog {
public:
    // `checker`: the engine's registry, whose check() (thread-safe) reads an adapter against the base;
    // `base`: the served model's name, which no adapter may take.
    LoraCatalog(const LoraRegistry& checker, std::string base) : checker_(checker), base_(std::move(base)) {}
    // An adapter the registry holds already (the --lora flags); Error when it takes the base's name.
    void seed(const std::string& name, const std::string& path);
    bool has(const std::string& name) const;
    const std::string& base() const { return base_; }
    std::vector<std::pair<std::string, std::string>> list() const;  // name, path
    // HTTP thread: checks and queues; Error naming the fault (already loaded, unknown, bad adapter).
    void load(const std::string& name, const std::string& path);
    void unload(const std::string& name);
    // Engine thread: the queued loads and unloads into `reg` (a load that now fails is logged and dropped).
    void apply(LoraRegistry& reg);

private:
    struct Op {
        bool load = true;
        std::string name, path;
    };
    const LoraRegistry& checker_;
    std::string base_;
    mutable std::mutex mu_;
    std::vector<std::pair<std::string, std::string>> names_;
    std::deque<Op> ops_;
};

// POST /v1/load_lora_adapter {"lora_name", "lora_path"} / /v1/unload_lora_adapter {"lora_name"}: 200 with a
// plain-text success line, 400 for a bad body or adapter, 404 for an unload of an unknown name; 403 when
// the server has no API key.
Reply lora_admin_reply(bool load, std::string_view body, bool have_api_key, LoraCatalog& catalog);

}  // namespace lattice::serve
