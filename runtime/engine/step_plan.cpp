// StepPlan wire format (see step_plan.h).
#include "runtime/engine/step_plan.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <unordered_set>

#include "base/error.h"

namespace lattice {

namespace {

constexpr uint32_t kMagic = 0x4c505336;  // "LPS6": version 6 (block tables as changes, grammar masks, drafts,
                                         // LoRA slots)
constexpr uint32_t kMagicPrefix = 0x4c505300;  // "LPS" + any version

// How a sequence's block table travels (one per sequence, in plan order).
enum TableOp : uint8_t { kKeep = 0, kAppend = 1, kReplace = 2 };

// The table row's blocks: up to the last entry that is not -1.
int64_t row_length(const int32_t* row, int64_t width) {
    int64_t n = width;
    while (n > 0 && row[n - 1] < 0) --n;
    return n;
}

class Writer {
public:
    template <typename T>
    void put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        out.insert(out.end(), p, p + sizeof(T));
    }
    template <typename T>
    void put_vec(const std::vector<T>& v) {
        put(int64_t(v.size()));
        const auto* p = reinterpret_cast<const uint8_t*>(v.data());
        out.insert(out.end(), p, p + v.size() * sizeof(T));
    }
    std::vector<uint8_t> out;
};

class Reader {
public:
    Reader(const uint8_t* d, int64_t n) : d_(d), n_(n) {}
    template <typename T>
    T get(const char* what) {
        LATTICE_CHECK(pos_ + int64_t(sizeof(T)) <= n_, "step plan: message ends inside {} ({} of {} bytes)", what, pos_,
                      n_);
        T v;
        std::memcpy(&v, d_ + pos_, sizeof(T));
        pos_ += int64_t(sizeof(T));
        return v;
    }
    template <typename T>
    std::vector<T> get_vec(const char* what) {
        const int64_t n = get<int64_t>(what);
        LATTICE_CHECK(n >= 0 && n <= (n_ - pos_) / int64_t(sizeof(T)), "step plan: {} of {} elements does not fit",
                      what, n);
        std::vector<T> v(static_cast<size_t>(n));
        if (n > 0) std::memcpy(v.data(), d_ + pos_, size_t(n) * sizeof(T));  // (an empty vector's data() may be null)
        pos_ += n * int64_t(sizeof(T));
        return v;
    }
    bool done() const { return pos_ == n_; }

private:
    const uint8_t* d_;
    int64_t n_;
    int64_t pos_ = 0;
};

// Applies a decoded plan's table changes to `known` (all checked first: on an Error nothing
// changed) and fills p.tables [seqs x width] from the result.
void apply_tables(StepPlan& p, const std::vector<uint8_t>& ops, const std::vector<int32_t>& counts,
                         const std::vector<int32_t>& blocks, PlanTables& known_tables);

}  // namespace

int64_t StepPlan::sampled() const {
    int64_t n = 0;
    for (const PlanSeq& s : seqs) n += s.sample;
    return n;
}

int64_t StepPlan::sample_slots() const {
    int64_t n = 0;
    for (const PlanSeq& s : seqs) n += s.sample ? 1 + s.n_draft : 0;
    return n;
}

const std::vector<int32_t>* PlanTables::find(int64_t id) const {
    auto it = rows.find(id);
    return it == rows.end() ? nullptr : &it->second;
}

std::vector<uint8_t> encode_plan(const StepPlan& p, PlanTables& known) {
    const int64_t n = int64_t(p.seqs.size()), W = p.width;
    LATTICE_CHECK(W >= 0 && int64_t(p.tables.size()) == n * W, "encode_plan: block tables {} for {} x {}",
                  p.tables.size(), n, W);
    for (int64_t id : p.released) known.rows.erase(id);
    std::vector<uint8_t> ops(static_cast<size_t>(n));
    std::vector<int32_t> counts(static_cast<size_t>(n)), blocks;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t* row = p.tables.data() + i * W;
        const int64_t len = row_length(row, W);
        std::vector<int32_t>& have = known.rows[p.seqs[size_t(i)].id];  // (a new one: empty, then replaced)
        const bool extends = int64_t(have.size()) <= len && !have.empty() &&
                             std::equal(have.begin(), have.end(), row);
        const int64_t from = extends ? int64_t(have.size()) : 0;
        ops[size_t(i)] = extends ? (from == len ? kKeep : kAppend) : kReplace;
        counts[size_t(i)] = int32_t(len - from);
        blocks.insert(blocks.end(), row + from, row + len);
        have.assign(row, row + len);
    }
    Writer w;
    w.put(kMagic);
    w.put(int32_t(p.kind));
    w.put(p.number);
    w.put_vec(p.tokens);
    w.put(n);
    for (int64_t i = 0; i < n; ++i) {
        const PlanSeq& s = p.seqs[size_t(i)];
        w.put(s.id);
        w.put(s.start);
        w.put(s.count);
        w.put(uint8_t(s.sample));
        w.put(uint8_t(s.ban_stop));
        w.put(s.n_ban);
        w.put(s.sampling.temperature);
        w.put(s.sampling.top_k);
        w.put(s.sampling.top_p);
        w.put(s.sampling.seed);
        w.put(s.sampling.repeat_penalty);
        w.put(s.sampling.repeat_last_n);
        w.put(s.sampling.presence_penalty);
        w.put(s.sampling.frequency_penalty);
        w.put(s.sampling.min_p);
        w.put(s.sampling.logprobs);
        w.put(s.n_recent);
        w.put(uint8_t(s.masked));
        w.put(s.n_draft);
        w.put(uint16_t(s.lora));  // (< kMaxLoraSlots: two bytes keep a decode step's plan small)
        w.put(ops[size_t(i)]);
        w.put(counts[size_t(i)]);
    }
    w.put(p.width);
    w.put_vec(blocks);
    w.put_vec(p.ban_ids);
    w.put_vec(p.recent_ids);
    w.put_vec(p.released);
    w.put(p.mask_width);
    w.put_vec(p.masks);
    w.put(int64_t(p.loras.size()));
    for (const LoraLoad& l : p.loras) {
        w.put(l.slot);
        w.put_vec(std::vector<char>(l.name.begin(), l.name.end()));
        w.put_vec(std::vector<char>(l.path.begin(), l.path.end()));
    }
    return std::move(w.out);
}

std::vector<uint8_t> encode_plan(const StepPlan& p) {
    PlanTables none;
    return encode_plan(p, none);
}

StepPlan decode_plan(const uint8_t* data, int64_t size) {
    PlanTables none;
    return decode_plan(data, size, none);
}

namespace {

// One sequence's fields (its table op and count follow it in the message).
PlanSeq read_seq(Reader& r) {
    PlanSeq s;
    s.id = r.get<int64_t>("id");
    s.start = r.get<int32_t>("start");
    s.count = r.get<int32_t>("count");
    s.sample = r.get<uint8_t>("sample") != 0;
    s.ban_stop = r.get<uint8_t>("ban_stop") != 0;
    s.n_ban = r.get<int32_t>("n_ban");
    s.sampling.temperature = r.get<float>("temperature");
    s.sampling.top_k = r.get<int64_t>("top_k");
    s.sampling.top_p = r.get<float>("top_p");
    s.sampling.seed = r.get<uint64_t>("seed");
    s.sampling.repeat_penalty = r.get<float>("repeat_penalty");
    s.sampling.repeat_last_n = r.get<int64_t>("repeat_last_n");
    s.sampling.presence_penalty = r.get<float>("presence_penalty");
    s.sampling.frequency_penalty = r.get<float>("frequency_penalty");
    s.sampling.min_p = r.get<float>("min_p");
    s.sampling.logprobs = r.get<int32_t>("logprobs");
    LATTICE_CHECK(s.sampling.logprobs >= 0 && s.sampling.logprobs <= SamplingParams::kMaxLogprobs,
                  "step plan: sequence {} asks for {} top logprobs", s.id, s.sampling.logprobs);
    s.n_recent = r.get<int32_t>("n_recent");
    s.masked = r.get<uint8_t>("masked") != 0;
    LATTICE_CHECK(!s.masked || s.sample, "step plan: sequence {} is masked but not sampled", s.id);
    s.n_draft = r.get<int32_t>("n_draft");
    LATTICE_CHECK(s.n_draft == 0 || (s.n_draft > 0 && s.sample && s.n_draft < s.count && !s.masked &&
                                     s.n_recent == 0 && s.sampling.logprobs == 0),
                  "step plan: sequence {} verifies {} drafts of {} fed tokens (sampled: {}, masked: {}, recent "
                  "ids: {}, top logprobs: {})",
                  s.id, s.n_draft, s.count, s.sample, s.masked, s.n_recent, s.sampling.logprobs);
    s.lora = r.get<uint16_t>("lora");
    LATTICE_CHECK(s.lora >= 0 && s.lora < kMaxLoraSlots, "step plan: sequence {} asks for LoRA slot {}", s.id, s.lora);
    return s;
}

}  // namespace

StepPlan decode_plan(const uint8_t* data, int64_t size, PlanTables& known) {
    Reader r(data, size);
    const uint32_t magic = r.get<uint32_t>("magic");
    LATTICE_CHECK((magic & 0xffffff00u) == kMagicPrefix, "step plan: bad magic (not a lattice step plan)");
    LATTICE_CHECK(magic == kMagic, "step plan: version {} from the leader, this rank reads version {} (mixed builds?)",
                  int(magic & 0xffu) - int('0'), int(kMagic & 0xffu) - int('0'));
    StepPlan p;
    const int32_t kind = r.get<int32_t>("kind");
    LATTICE_CHECK(kind >= 1 && kind <= 4, "step plan: unknown kind {}", kind);
    p.kind = StepPlan::Kind(kind);
    p.number = r.get<int64_t>("number");
    p.tokens = r.get_vec<int32_t>("tokens");
    const int64_t n = r.get<int64_t>("sequence count");
    LATTICE_CHECK(n >= 0 && n <= int64_t(p.tokens.size()) + 1, "step plan: {} sequences for {} tokens", n,
                  p.tokens.size());
    int64_t fed = 0;
    std::vector<uint8_t> ops;
    std::vector<int32_t> counts;
    for (int64_t i = 0; i < n; ++i) {
        PlanSeq s = read_seq(r);
        ops.push_back(r.get<uint8_t>("table op"));
        counts.push_back(r.get<int32_t>("table blocks count"));
        LATTICE_CHECK(s.start >= 0 && s.count >= 1, "step plan: sequence {} start {} count {}", s.id, s.start, s.count);
        fed += s.count;
        p.seqs.push_back(s);
    }
    LATTICE_CHECK(fed == int64_t(p.tokens.size()), "step plan: sequences feed {} tokens, the plan holds {}", fed,
                  p.tokens.size());
    p.width = r.get<int32_t>("width");
    LATTICE_CHECK(p.width >= 0, "step plan: block table width {}", p.width);
    const std::vector<int32_t> blocks = r.get_vec<int32_t>("table blocks");
    p.ban_ids = r.get_vec<int32_t>("ban ids");
    int64_t bans = 0;
    for (const PlanSeq& s : p.seqs) {
        LATTICE_CHECK(s.n_ban >= 0, "step plan: sequence {} bans {} ids", s.id, s.n_ban);
        bans += s.n_ban;
    }
    LATTICE_CHECK(bans == int64_t(p.ban_ids.size()), "step plan: {} banned ids listed, {} announced", p.ban_ids.size(),
                  bans);
    p.recent_ids = r.get_vec<int32_t>("recent ids");
    int64_t recent = 0;
    for (const PlanSeq& s : p.seqs) {
        LATTICE_CHECK(s.n_recent >= 0 && (s.n_recent == 0 || s.sample), "step plan: sequence {} lists {} recent ids",
                      s.id, s.n_recent);
        recent += s.n_recent;
    }
    LATTICE_CHECK(recent == int64_t(p.recent_ids.size()), "step plan: {} recent ids listed, {} announced",
                  p.recent_ids.size(), recent);
    p.released = r.get_vec<int64_t>("released");
    p.mask_width = r.get<int32_t>("mask width");
    p.masks = r.get_vec<uint32_t>("masks");
    int64_t masked = 0;
    for (const PlanSeq& s : p.seqs) masked += s.masked;
    LATTICE_CHECK(p.mask_width >= 0 && (masked == 0 || p.mask_width > 0) &&
                      int64_t(p.masks.size()) == masked * int64_t(p.mask_width),
                  "step plan: {} mask words for {} masked sequences of width {}", p.masks.size(), masked,
                  p.mask_width);
    const int64_t n_loras = r.get<int64_t>("adapter loads");
    LATTICE_CHECK(n_loras >= 0 && n_loras <= kMaxLoraSlots, "step plan: {} adapter loads", n_loras);
    for (int64_t i = 0; i < n_loras; ++i) {
        LoraLoad l;
        l.slot = r.get<int32_t>("adapter slot");
        const std::vector<char> name = r.get_vec<char>("adapter name"), path = r.get_vec<char>("adapter path");
        l.name.assign(name.begin(), name.end());
        l.path.assign(path.begin(), path.end());
        LATTICE_CHECK(l.slot >= 1 && l.slot < kMaxLoraSlots, "step plan: adapter '{}' into slot {}", l.name, l.slot);
        p.loras.push_back(std::move(l));
    }
    LATTICE_CHECK(r.done(), "step plan: trailing bytes");
    apply_tables(p, ops, counts, blocks, known);
    return p;
}

namespace {

void apply_tables(StepPlan& p, const std::vector<uint8_t>& ops, const std::vector<int32_t>& counts,
                  const std::vector<int32_t>& blocks, PlanTables& known_tables) {
    auto& known = known_tables.rows;
    const std::unordered_set<int64_t> gone(p.released.begin(), p.released.end());
    std::unordered_map<int64_t, std::vector<int32_t>> staged;  // rows this plan sets
    auto lookup = [&](int64_t id) -> const std::vector<int32_t>* {
        if (auto it = staged.find(id); it != staged.end()) return &it->second;
        if (gone.count(id)) return nullptr;
        auto it = known.find(id);
        return it == known.end() ? nullptr : &it->second;
    };
    const int64_t n = int64_t(p.seqs.size()), W = p.width;
    size_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t id = p.seqs[size_t(i)].id;
        const int32_t k = counts[size_t(i)];
        LATTICE_CHECK(k >= 0 && size_t(k) <= blocks.size() - off,
                      "step plan: table blocks: sequence {} takes {} blocks, {} are left", id, k, blocks.size() - off);
        const uint8_t op = ops[size_t(i)];
        LATTICE_CHECK(op <= kReplace, "step plan: table op {} of sequence {} unknown", int(op), id);
        LATTICE_CHECK(op != kKeep || k == 0, "step plan: table op: sequence {} keeps its table but lists {} blocks", id,
                      k);
        const auto first = blocks.begin() + std::ptrdiff_t(off), last = first + k;
        if (op == kReplace) {
            staged[id].assign(first, last);
        } else {
            const std::vector<int32_t>* have = lookup(id);
            LATTICE_CHECK(have, "step plan: table op: sequence {} {} a block table this rank does not know", id,
                          op == kKeep ? "keeps" : "appends to");
            if (op == kAppend) {
                std::vector<int32_t> row = *have;
                row.insert(row.end(), first, last);
                staged[id] = std::move(row);
            }
        }
        off += size_t(k);
        LATTICE_CHECK(int64_t(lookup(id)->size()) <= W, "step plan: table blocks: sequence {} holds {} blocks, width {}",
                      id, lookup(id)->size(), W);
    }
    LATTICE_CHECK(off == blocks.size(), "step plan: table blocks: {} listed, the sequences take {}", blocks.size(), off);
    p.tables.assign(size_t(n * W), -1);
    for (int64_t i = 0; i < n; ++i) {
        const std::vector<int32_t>& row = *lookup(p.seqs[size_t(i)].id);
        std::copy(row.begin(), row.end(), p.tables.begin() + std::ptrdiff_t(i * W));
    }
    for (int64_t id : p.released) known.erase(id);
    for (auto& [id, row] : staged) known[id] = std::move(row);
}

}  // namespace

}  // namespace lattice
