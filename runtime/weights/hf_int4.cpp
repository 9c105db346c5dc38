// AWQ / GPTQ linears (see hf_int4.h): the config's quantization, shape and value checks, unpacking.
#include "runtime/weights/hf_int4.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

namespace {

// AutoAWQ packs output channels 8 at a time in the order [0, 2, 4, 6, 1, 3, 5, 7]: channel j of a pack sits
// at nibble kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int32_t load_i32(const uint8_t* p, int64_t i) {
    int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
}

}  // namespace

std::optional<HfQuantConfig> parse_hf_quant_config(const std::string& text, const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: not valid JSON ({})", path, e.what());
    }
    if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return std::nullopt;
    const nlohmann::json& q = j["quantization_config"];
    LATTICE_CHECK(q.is_object(), "{}: quantization_config must be an object", path);
    auto str = [&](const char* key, const std::string& def) {
        if (!q.contains(key) || q[key].is_null()) return def;
        LATTICE_CHECK(q[key].is_string(), "{}: quantization_config.{} must be a string", path, key);
        return q[key].get<std::string>();
    };
    auto num = [&](const char* key, int64_t def) {
        if (!q.contains(key) || q[key].is_null()) return def;
        LATTICE_CHECK(q[key].is_number_integer(), "{}: quantization_config.{} must be an integer", path, key);
        return q[key].get<int64_t>();
    };
    auto flag = [&](const char* key, bool def) {
        if (!q.contains(key) || q[key].is_null()) return def;
        LATTICE_CHECK(q[key].is_boolean(), "{}: quantization_config.{} must be true or false", path, key);
        return q[key].get<bool>();
    };
    HfQuantConfig c;
    c.method = str("quant_method", "");
    LATTICE_CHECK(c.method == "awq" || c.method == "gptq",
                  "{}: quantization_config.quant_method \"{}\" is not supported (awq, gptq)", path, c.method);
    const int64_t bits = num(c.method == "awq" ? (q.contains("w_bit") ? "w_bit" : "bits") : "bits", 4);
    LATTICE_CHECK(bits == 4, "{}: quantization_config.bits {} is not supported (4)", path, bits);
    c.group = num(c.method == "awq" && q.contains("q_group_size") ? "q_group_size" : "group_size", 128);
    LATTICE_CHECK(c.group == 32 || c.group == 64 || c.group == 128,
                  "{}: quantization_config.group_size {} is not supported (32, 64 or 128)", path, c.group);
    if (c.method == "awq") {
        const std::string version = str("version", "gemm");
        LATTICE_CHECK(version == "gemm" || version == "GEMM",
                      "{}: quantization_config.version \"{}\" is not supported (AutoAWQ's gemm packing)", path,
                      version);
        LATTICE_CHECK(flag("zero_point", true), "{}: quantization_config.zero_point false is not supported", path);
    } else {
        c.desc_act = flag("desc_act", false);
        const std::string format = str("checkpoint_format", "gptq");
        LATTICE_CHECK(format == "gptq" || format == "gptq_v2",
                      "{}: quantization_config.checkpoint_format \"{}\" is not supported (gptq, gptq_v2)", path,
                      format);
        c.zeros_minus_one = format == "gptq";
    }
    return c;
}

HfInt4Linear::HfInt4Linear(const HfQuantConfig& cfg, std::string name, Part qw, Part qz, Part sc, Part gi)
    : cfg_(cfg), name_(std::move(name)), file_(qw.file) {
    const bool awq = cfg.method == "awq";
    // name_ is "<prefix>.weight"; its parts are "<prefix>.qweight" ...
    const std::string prefix = name_.substr(0, name_.size() - std::string(".weight").size());
    auto need = [&](const Part& p, const char* what, DType dt, size_t dims) {
        LATTICE_CHECK(p.entry, "{}: 4-bit linear \"{}\" ({}) has no \"{}.{}\"", file_, name_, cfg.method, prefix, what);
        LATTICE_CHECK(p.entry->dtype == dt && p.entry->shape.size() == dims,
                      "{}: tensor \"{}\" is {} {}, expected {} of {} dimension(s)", p.file, p.entry->name,
                      dtype_name(p.entry->dtype), shape_string(p.entry->shape), dtype_name(dt), dims);
    };
    need(qw, "qweight", DType::kI32, 2);
    need(qz, "qzeros", DType::kI32, 2);
    need(sc, "scales", DType::kF16, 2);
    const std::vector<int64_t>& ws = qw.entry->shape;
    k_ = awq ? ws[0] : ws[0] * 8;
    n_ = awq ? ws[1] * 8 : ws[1];
    groups_ = k_ / cfg.group;
    LATTICE_CHECK(k_ > 0 && n_ > 0 && k_ % cfg.group == 0,
                  "{}: \"{}\" holds a [{}, {}] weight whose {} input channels are not a multiple of group_size {}",
                  file_, qw.entry->name, n_, k_, k_, cfg.group);
    auto shape_is = [&](const Part& p, std::vector<int64_t> want) {
        LATTICE_CHECK(p.entry->shape == want,
                      "{}: tensor \"{}\" has shape {}, expected {} for a [{}, {}] weight in "
                      "groups of {}",
                      p.file, p.entry->name, shape_string(p.entry->shape), shape_string(want), n_, k_, cfg.group);
    };
    shape_is(qz, {groups_, n_ / 8});
    shape_is(sc, {groups_, n_});
    LATTICE_CHECK(n_ % 8 == 0, "{}: \"{}\": {} output channels are not a multiple of 8", file_, name_, n_);
    qweight_ = qw.data;
    qzeros_ = qz.data;
    scales_ = sc.data;
    bytes_ = (qw.entry->end - qw.entry->begin) + (qz.entry->end - qz.entry->begin) + (sc.entry->end - sc.entry->begin);
    for (int64_t i = 0; i < groups_ * n_; ++i) {
        uint16_t h;
        std::memcpy(&h, scales_ + 2 * i, 2);
        LATTICE_CHECK((h & 0x7C00) != 0x7C00, "{}: tensor \"{}\" holds a non-finite scale at [{}, {}]", sc.file,
                      sc.entry->name, i / n_, i % n_);
    }
    if (awq) {
        LATTICE_CHECK(!gi.entry, "{}: AWQ linear \"{}\" has a g_idx tensor", file_, name_);
        return;
    }
    if (!gi.entry) {
        LATTICE_CHECK(!cfg.desc_act, "{}: GPTQ act-order (desc_act) linear \"{}\" has no g_idx", file_, name_);
        return;
    }
    need(gi, "g_idx", DType::kI32, 1);
    shape_is(gi, {k_});
    bytes_ += gi.entry->end - gi.entry->begin;
    std::vector<int32_t> g(static_cast<size_t>(k_));
    std::vector<int64_t> count(static_cast<size_t>(groups_), 0);
    bool trivial = true;
    for (int64_t c = 0; c < k_; ++c) {
        g[size_t(c)] = load_i32(gi.data, c);
        LATTICE_CHECK(g[size_t(c)] >= 0 && g[size_t(c)] < groups_, "{}: tensor \"{}\"[{}] = {} is not a group (0..{})",
                      gi.file, gi.entry->name, c, g[size_t(c)], groups_ - 1);
        ++count[size_t(g[size_t(c)])];
        trivial &= g[size_t(c)] == c / cfg.group;
    }
    if (trivial) return;  // g_idx = k / G: the plain layout
    for (int64_t i = 0; i < groups_; ++i)
        LATTICE_CHECK(count[size_t(i)] == cfg.group,
                      "{}: tensor \"{}\" gives group {} {} input channels; lattice needs exactly group_size ({}) in "
                      "every group",
                      gi.file, gi.entry->name, i, count[size_t(i)], cfg.group);
    g_idx_ = std::move(g);
    perm_.resize(size_t(k_));
    std::iota(perm_.begin(), perm_.end(), 0);
    std::stable_sort(perm_.begin(), perm_.end(),
                     [&](int32_t a, int32_t b) { return g_idx_[size_t(a)] < g_idx_[size_t(b)]; });
}

uint8_t HfInt4Linear::q(int64_t n, int64_t k) const {
    if (cfg_.method == "awq")
        return uint8_t((load_i32(qweight_, k * (n_ / 8) + n / 8) >> (4 * kAwqNibble[n % 8])) & 15);
    return uint8_t((load_i32(qweight_, (k / 8) * n_ + n) >> (4 * (k % 8))) & 15);
}

uint8_t HfInt4Linear::zero(int64_t g, int64_t n) const {
    const int32_t word = load_i32(qzeros_, g * (n_ / 8) + n / 8);
    if (cfg_.method == "awq") return uint8_t((word >> (4 * kAwqNibble[n % 8])) & 15);
    return uint8_t(((word >> (4 * (n % 8))) & 15) + (cfg_.zeros_minus_one ? 1 : 0));
}

uint16_t HfInt4Linear::scale(int64_t g, int64_t n) const {
    uint16_t h;
    std::memcpy(&h, scales_ + 2 * (g * n_ + n), 2);
    return h;
}

Int4Weights HfInt4Linear::read_int4(int64_t row0, int64_t rows, int64_t col0, int64_t cols) const {
    const int64_t G = cfg_.group;
    LATTICE_CHECK(row0 >= 0 && rows > 0 && row0 + rows <= n_ && col0 >= 0 && cols > 0 && col0 + cols <= k_,
                  "{}: 4-bit read of \"{}\" rows [{}, +{}) cols [{}, +{}) outside its [{}, {}]", file_, name_, row0,
                  rows, col0, cols, n_, k_);
    LATTICE_CHECK(row0 % 8 == 0 && rows % 8 == 0,
                  "{}: \"{}\" ({}) packs its output channels 8 at a time; rows [{}, {}) cut a pack", file_, name_,
                  cfg_.method, row0, row0 + rows);
    LATTICE_CHECK(col0 % G == 0 && cols % G == 0,
                  "{}: \"{}\" ({}) has groups of {} input channels; columns [{}, {}) cut a group", file_, name_,
                  cfg_.method, G, col0, col0 + cols);
    LATTICE_CHECK(perm_.empty() || (col0 == 0 && cols == k_),
                  "{}: \"{}\" is GPTQ act-order (desc_act): its groups are spread over all {} input channels, so "
                  "columns [{}, {}) cannot be read on their own",
                  file_, name_, k_, col0, col0 + cols);
    Int4Weights w(rows, cols, G, Int4Kind::kZeroPoint);
    const int64_t g0 = col0 / G, groups = cols / G;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
            w.d[size_t(r * groups + g)] = scale(g0 + g, row0 + r);
            w.z[size_t(r * groups + g)] = zero(g0 + g, row0 + r);
        }
        for (int64_t c = 0; c < cols; ++c) w.set_nibble(r, c, q(row0 + r, perm_.empty() ? col0 + c : perm_[size_t(c)]));
    }
    w.perm = perm_;
    return w;
}

void HfInt4Linear::read_f32(int64_t row0, int64_t rows, int64_t col0, int64_t cols, float* out) const {
    LATTICE_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= n_ && col0 >= 0 && cols >= 0 && col0 + cols <= k_,
                  "{}: read of \"{}\" rows [{}, +{}) cols [{}, +{}) outside its [{}, {}]", file_, name_, row0, rows,
                  col0, cols, n_, k_);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t n = row0 + r, k = col0 + c, g = group_of(k);
            out[r * cols + c] = float(int32_t(q(n, k)) - int32_t(zero(g, n))) * f16_to_f32(scale(g, n));
        }
}

}  // namespace lattice
