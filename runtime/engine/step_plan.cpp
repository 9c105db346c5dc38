// StepPlan wire format (see step_plan.h).
#include "runtime/engine/step_plan.h"

#include <cstring>
#include <type_traits>

#include "base/error.h"

namespace lattice {

namespace {

constexpr uint32_t kMagic = 0x4c505332;  // "LPS2"

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

}  // namespace

int64_t StepPlan::sampled() const {
    int64_t n = 0;
    for (const PlanSeq& s : seqs) n += s.sample;
    return n;
}

std::vector<uint8_t> encode_plan(const StepPlan& p) {
    Writer w;
    w.put(kMagic);
    w.put(int32_t(p.kind));
    w.put(p.number);
    w.put_vec(p.tokens);
    w.put(int64_t(p.seqs.size()));
    for (const PlanSeq& s : p.seqs) {
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
    }
    w.put(p.width);
    w.put_vec(p.tables);
    w.put_vec(p.ban_ids);
    w.put_vec(p.recent_ids);
    w.put_vec(p.released);
    return std::move(w.out);
}

StepPlan decode_plan(const uint8_t* data, int64_t size) {
    Reader r(data, size);
    LATTICE_CHECK(r.get<uint32_t>("magic") == kMagic, "step plan: bad magic (not a lattice step plan)");
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
    for (int64_t i = 0; i < n; ++i) {
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
        LATTICE_CHECK(s.start >= 0 && s.count >= 1, "step plan: sequence {} start {} count {}", s.id, s.start, s.count);
        fed += s.count;
        p.seqs.push_back(s);
    }
    LATTICE_CHECK(fed == int64_t(p.tokens.size()), "step plan: sequences feed {} tokens, the plan holds {}", fed,
                  p.tokens.size());
    p.width = r.get<int32_t>("width");
    p.tables = r.get_vec<int32_t>("tables");
    LATTICE_CHECK(p.width >= 0 && int64_t(p.tables.size()) == n * p.width, "step plan: block tables {} for {} x {}",
                  p.tables.size(), n, p.width);
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
    LATTICE_CHECK(r.done(), "step plan: trailing bytes");
    return p;
}

}  // namespace lattice
