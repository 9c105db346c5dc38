// LoraRegistry (see lora_registry.h).
#include "runtime/engine/lora_registry.h"

#include "base/error.h"
#include "runtime/model/lora.h"

namespace lattice {

LoraRegistry::LoraRegistry(const ModelConfig& cfg, int64_t max_loras, int64_t max_rank)
    : cfg_(cfg), max_rank_(max_rank) {
    LATTICE_CHECK(max_loras >= 1 && max_loras < kMaxLoraSlots, "--max-loras {} (1 .. {})", max_loras,
                  kMaxLoraSlots - 1);
    LATTICE_CHECK(max_rank >= 1, "--max-lora-rank {} (>= 1)", max_rank);
    slots_.resize(size_t(max_loras));
}

void LoraRegistry::add(const std::string& name, const std::string& path) {
    constexpr size_t kMaxName = 256, kMaxPath = 4096;
    LATTICE_CHECK(!name.empty() && name.size() <= kMaxName, "adapter name '{}' (1 .. {} characters)", name, kMaxName);
    LATTICE_CHECK(!path.empty() && path.size() <= kMaxPath, "adapter '{}': path of {} characters", name, path.size());
    const auto it = entries_.find(name);
    LATTICE_CHECK(it == entries_.end() || it->second.info.path.empty(), "adapter '{}' is already loaded (from {})",
                  name, it == entries_.end() ? "" : it->second.info.path);
    LoraReadOptions ro;
    ro.max_rank = max_rank_;
    const LoraAdapter ad = read_lora_adapter(name, path, cfg_, ro);  // every check, before anything changes
    Entry e;
    e.info.name = name;
    e.info.path = path;
    e.info.rank = ad.rank;
    for (LoraTarget t : ad.targets) e.info.targets.push_back(lora_target_name(t));
    entries_[name] = std::move(e);
}

void LoraRegistry::remove(const std::string& name) {
    const auto it = entries_.find(name);
    LATTICE_CHECK(it != entries_.end() && !it->second.removed, "adapter '{}' is not loaded", name);
    Entry& e = it->second;
    if (e.info.active > 0) {
        e.removed = true;  // release() evicts it when the last request ends
        return;
    }
    if (e.slot) evict(e.slot);
    entries_.erase(it);
}

void LoraRegistry::evict(int32_t slot) {
    Entry& e = entries_.at(slots_[size_t(slot - 1)]);
    e.slot = 0;
    e.info.resident = false;
    slots_[size_t(slot - 1)].clear();
    loads_.push_back(LoraLoad{slot, e.info.name, ""});
}

LoraRegistry::Ref LoraRegistry::acquire(const std::string& name) {
    const std::optional<Ref> r = try_acquire(name);
    LATTICE_CHECK(r.has_value(), "adapter '{}': all {} LoRA slots (--max-loras) are held by running requests", name,
                  slots_.size());
    return *r;
}

bool LoraRegistry::is_resident(const std::string& name) const {
    const auto it = entries_.find(name);
    return it != entries_.end() && !it->second.removed && it->second.slot != 0;
}

std::optional<LoraRegistry::Ref> LoraRegistry::try_acquire(const std::string& name) {
    const auto it = entries_.find(name);
    LATTICE_CHECK(it != entries_.end() && !it->second.removed, "the model '{}' does not exist", name);
    Entry& e = it->second;
    if (!e.slot) {
        int32_t slot = 0;
        uint64_t oldest = UINT64_MAX;
        for (size_t i = 0; i < slots_.size() && slot == 0; ++i)
            if (slots_[i].empty()) slot = int32_t(i + 1);
        if (slot == 0) {  // the least recently used resident adapter that no request holds
            int32_t victim = 0;
            for (size_t i = 0; i < slots_.size(); ++i) {
                const Entry& r = entries_.at(slots_[i]);
                if (r.info.active == 0 && r.last_used < oldest) oldest = r.last_used, victim = int32_t(i + 1);
            }
            if (victim == 0) return std::nullopt;
            evict(victim);
            slot = victim;
        }
        e.slot = slot;
        e.key = next_key_++;
        e.info.resident = true;
        slots_[size_t(slot - 1)] = name;
        loads_.push_back(LoraLoad{slot, name, e.info.path});
    }
    e.info.active += 1;
    e.info.requests += 1;
    e.last_used = ++clock_;
    return Ref{e.slot, e.key};
}

void LoraRegistry::release(int32_t slot, int64_t tokens) {
    if (slot == 0) return;
    LATTICE_CHECK(slot >= 1 && slot <= int32_t(slots_.size()) && !slots_[size_t(slot - 1)].empty(),
                  "LoRA slot {} released but not held", slot);
    Entry& e = entries_.at(slots_[size_t(slot - 1)]);
    LATTICE_CHECK(e.info.active > 0, "adapter '{}' released more often than acquired", e.info.name);
    e.info.active -= 1;
    e.info.tokens += tokens;
    e.last_used = ++clock_;
    if (e.removed && e.info.active == 0) {
        const std::string name = e.info.name;
        evict(slot);
        entries_.erase(name);
    }
}

void LoraRegistry::check(const std::string& name, const std::string& path) const {
    LoraReadOptions ro;
    ro.max_rank = max_rank_;
    read_lora_adapter(name, path, cfg_, ro);
}

std::vector<LoraLoad> LoraRegistry::take_loads() {
    std::vector<LoraLoad> out;
    out.swap(loads_);
    return out;
}

std::vector<LoraInfo> LoraRegistry::list() const {
    std::vector<LoraInfo> out;
    for (const auto& [name, e] : entries_)
        if (!e.removed) out.push_back(e.info);
    return out;
}

int64_t LoraRegistry::resident() const {
    int64_t n = 0;
    for (const std::string& s : slots_) n += !s.empty();
    return n;
}

}  // namespace lattice
