// LoraRegistry: the leader's table of the LoRA adapters a server offers (by name) and of which of them
// are resident in the model's slots, with LRU eviction among those no request holds.
//
// add() reads the whole adapter once on the leader to check it against the base (a bad file is an
// Error here, and nothing changes); residency is decided when a request acquires the adapter: a free
// slot, or the least recently used resident adapter that no running request holds, is given to it and
// a LoraLoad goes out with the next step plan (EngineCore::issue), so every rank reads its shard of the
// file before the first forward that uses it. Each load gets a key never used before (EngineRequest::
// lora_key): the prefix cache keys on it, so K/V of an evicted adapter are never found under its
// successor in the same slot. remove() unregisters; a resident adapter leaves its slot once no
// request holds it. When every slot is held by running requests, try_acquire() says so (the engine
// client queues the request until a release frees one). Not thread-safe: the leader's engine thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/arch/config.h"
#include "runtime/engine/step_plan.h"

namespace lattice {

struct LoraInfo {
    std::string name, path;
    int64_t rank = 0;
    std::vector<std::string> targets;
    bool resident = false;
    int64_t active = 0;                      // requests holding it now
    int64_t requests = 0, tokens = 0;        // served since it was added (tokens: prompt + generated)
};

class LoraRegistry {
public:
    // max_loras: slots (adapters resident at once, >= 1); max_rank: the largest rank add() accepts.
    LoraRegistry(const ModelConfig& cfg, int64_t max_loras, int64_t max_rank);

    // Registers `name` (not the base's name, not taken) after reading and checking the adapter at `path`.
    void add(const std::string& name, const std::string& path);
    // The reading and checking of add() alone (an Error naming the fault). Reads only what the constructor
    // set, so any thread may call it (serve's HTTP threads check a load before answering).
    void check(const std::string& name, const std::string& path) const;
    // Unregisters `name` (Error naming it when unknown).
    void remove(const std::string& name);
    bool has(const std::string& name) const { return entries_.count(name) > 0; }
    // Makes `name` resident (Error naming it when unknown, or when every slot is held by running
    // requests) and holds it: the slot and the load's prefix-cache key.
    struct Ref {
        int32_t slot = 0;
        uint64_t key = 0;
    };
    Ref acquire(const std::string& name);
    // acquire(), but nothing (and nothing changed) when every slot is held by running requests; an Error for
    // an unknown name.
    std::optional<Ref> try_acquire(const std::string& name);
    // Resident now (a request for it acquires without waiting for a slot).
    bool is_resident(const std::string& name) const;
    // Gives back one hold of the adapter in `slot` (0: nothing), counting `tokens` to it.
    void release(int32_t slot, int64_t tokens = 0);
    // The loads and removals the next plan carries (and forgets them).
    std::vector<LoraLoad> take_loads();
    std::vector<LoraInfo> list() const;  // by name
    int64_t resident() const;
    int64_t max_loras() const { return int64_t(slots_.size()); }
    int64_t max_rank() const { return max_rank_; }

private:
    struct Entry {
        LoraInfo info;
        int32_t slot = 0;  // 0: not resident
        uint64_t key = 0;
        uint64_t last_used = 0;
        bool removed = false;  // unregistered, still held by requests
    };
    void evict(int32_t slot);

    ModelConfig cfg_;
    int64_t max_rank_;
    std::map<std::string, Entry> entries_;
    std::vector<std::string> slots_;  // [max_loras]: the adapter in slot i + 1, "" free
    std::vector<LoraLoad> loads_;
    uint64_t next_key_ = 1, clock_ = 0;
};

}  // namespace lattice
