// The device form of a LoRA adapter on one rank (see lora.h for the sharding rules): per local layer and
// fused projection, each target's A and B sliced to this rank and made float Linears on the backend.
#include "runtime/model/lora.h"

#include "base/error.h"

#include <cstring>

namespace lattice {

namespace {

// Rows [r0, r0 + n) of a row-major [*, cols] matrix.
std::vector<float> rows_of(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t n) {
    return std::vector<float>(m.begin() + r0 * cols, m.begin() + (r0 + n) * cols);
}

// Columns [c0, c0 + n) of a row-major [rows, cols] matrix.
std::vector<float> cols_of(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
    std::vector<float> out(size_t(rows * n));
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&out[size_t(r * n)], &m[size_t(r * cols + c0)], size_t(n) * 4);
    return out;
}

LoraSite site_of(LoraTarget t) {
    switch (t) {
        case LoraTarget::kQ:
        case LoraTarget::kK:
        case LoraTarget::kV: return LoraSite::kQkv;
        case LoraTarget::kO: return LoraSite::kO;
        case LoraTarget::kGate:
        case LoraTarget::kUp: return LoraSite::kGateUp;
        case LoraTarget::kDown: break;
    }
    return LoraSite::kDown;
}

}  // namespace

LoraShard make_lora_shard(const std::shared_ptr<const LoraAdapter>& ad, const ModelConfig& cfg, const ShardShape& s,
                          int64_t layer_begin, int64_t layer_end, Backend& be) {
    LATTICE_CHECK(ad->layer_begin <= layer_begin && layer_end <= ad->layer_begin + int64_t(ad->layers.size()),
                  "adapter '{}': holds layers [{}, {}), the stage needs [{}, {})", ad->name, ad->layer_begin,
                  ad->layer_begin + int64_t(ad->layers.size()), layer_begin, layer_end);
    LoraShard sh;
    sh.adapter = ad;
    sh.scale = ad->scale;
    sh.rank = ad->rank;
    const int64_t r = ad->rank, hd = cfg.head_dim;
    sh.layers.resize(size_t(layer_end - layer_begin));
    for (int64_t l = layer_begin; l < layer_end; ++l) {
        const auto& src = ad->layers[size_t(l - ad->layer_begin)];
        for (int ti = 0; ti < kLoraTargets; ++ti) {
            const LoraMatrix& m = src[size_t(ti)];
            if (!m.present()) continue;
            const LoraTarget t = LoraTarget(ti);
            const int64_t in = lora_target_dims(cfg, t).first;
            std::vector<float> a, b;
            LoraPart part;
            switch (t) {  // column-parallel: B's rows of this rank; row-parallel: A's columns
                case LoraTarget::kQ:
                    a = m.a, b = rows_of(m.b, r, s.head0 * hd, s.n_heads * hd), part.col0 = 0;
                    break;
                case LoraTarget::kK:
                    a = m.a, b = rows_of(m.b, r, s.kv_head0 * hd, s.n_kv * hd), part.col0 = s.n_heads * hd;
                    break;
                case LoraTarget::kV:
                    a = m.a, b = rows_of(m.b, r, s.kv_head0 * hd, s.n_kv * hd), part.col0 = (s.n_heads + s.n_kv) * hd;
                    break;
                case LoraTarget::kGate: a = m.a, b = rows_of(m.b, r, s.ffn0, s.ffn), part.col0 = 0; break;
                case LoraTarget::kUp: a = m.a, b = rows_of(m.b, r, s.ffn0, s.ffn), part.col0 = s.ffn; break;
                case LoraTarget::kO: a = cols_of(m.a, r, in, s.head0 * hd, s.n_heads * hd), b = m.b; break;
                case LoraTarget::kDown: a = cols_of(m.a, r, in, s.ffn0, s.ffn), b = m.b; break;
            }
            const int64_t in_local = int64_t(a.size()) / r, out_local = int64_t(b.size()) / r;
            part.width = out_local;
            part.a = be.make_linear(View::contiguous(a.data(), DType::kF32, {r, in_local}), QuantMode::kNone);
            part.b = be.make_linear(View::contiguous(b.data(), DType::kF32, {out_local, r}), QuantMode::kNone);
            sh.bytes += part.a.weight_bytes() + part.b.weight_bytes();
            sh.layers[size_t(l - layer_begin)][size_t(site_of(t))].parts.push_back(std::move(part));
        }
    }
    return sh;
}

}  // namespace lattice
