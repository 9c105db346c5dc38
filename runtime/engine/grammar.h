// STUB (the lead's wiring branch): the interface of the grammar engine, replaced by the real header at merge.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
namespace lattice {
struct GrammarSpec {
    enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice };
    Kind kind = Kind::kNone;
    std::string source;
    std::vector<std::string> choices;
    bool active() const { return kind != Kind::kNone; }
    std::string key() const;
};
class TokenVocab {
public:
    TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> end_ids);
    int32_t size() const;
};
class Grammar {
public:
    static std::shared_ptr<const Grammar> compile(const GrammarSpec& spec);
};
class GrammarMatcher {
public:
    GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v);
    void fill_mask(std::span<uint32_t> words) const;
    bool accept(int32_t id);
    bool complete() const;
    bool finished() const;
};
}  // namespace lattice
