// SimDevice (see sim_device.h).
#include "runtime/backend/sim/sim_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace lattice {

SimDevice::SimDevice(const SimDeviceOptions& o, const ModelDims& dims, int tp, int pp, int stage, PlanQuant quant,
                     int64_t max_batch_tokens)
    : opt_(o), tp_(tp), pp_(pp), stage_(stage), hidden_(dims.hidden) {
    LATTICE_CHECK(std::isfinite(o.step_ms) && o.step_ms >= 0, "--sim-step-ms must be >= 0, got {}", o.step_ms);
    req_.model = dims;
    req_.device = find_device(o.gpu);
    LATTICE_CHECK(!req_.device.cpu, "--sim-gpu {}: a GPU of the device table, not the CPU entry", o.gpu);
    req_.link = parse_link(o.link);
    req_.inter_node = req_.link;
    req_.devices = tp * pp;
    req_.quant = quant;
    req_.max_batch_tokens = max_batch_tokens;
}

double SimDevice::step_seconds(int64_t tokens, double positions, int64_t sampled) const {
    if (opt_.step_ms > 0) return opt_.step_ms * 1e-3;
    return predict_stage_seconds(req_, tp_, pp_, stage_, double(tokens), positions, double(sampled));
}

std::string SimDevice::describe() const {
    if (opt_.step_ms > 0) return fmt::format("simulated device ({} ms per stage step)", opt_.step_ms);
    return fmt::format("simulated {} over {} ({})", req_.device.label, req_.link.name, plan_quant_name(req_.quant));
}

int32_t SimDevice::pseudo_token(int64_t seq, int64_t position, int64_t vocab, const std::vector<int64_t>& eos) {
    LATTICE_CHECK(vocab > int64_t(eos.size()), "pseudo_token: vocab {} leaves no id besides the eos ids", vocab);
    uint64_t h = uint64_t(seq) * 0x9e3779b97f4a7c15ull ^ (uint64_t(position) + 0x632be59bd9b4e019ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    int32_t t = int32_t(h % uint64_t(vocab));
    while (std::find(eos.begin(), eos.end(), int64_t(t)) != eos.end()) t = int32_t((int64_t(t) + 1) % vocab);
    return t;
}

}  // namespace lattice
