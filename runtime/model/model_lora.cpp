// Model's LoRA hook (see model.h / lora.h): adapters applied unmerged, per sequence, after each projection.
//
// The SGMV idea in generic backend ops: the base GEMM runs once over every row of the batch; then per
// adapter present in the batch its rows are gathered, multiplied by A^T (f32 [n, r]) and by B^T
// (per target of a fused projection, placed at the target's columns), and added back scaled
// (scatter_add_rows with the adapter's scale as each row's weight). The backend's linear, gather_rows,
// scatter_add_rows, fill_zero and copy_columns are all it needs, so the CPU and CUDA backends run it
// alike; the product stays in the activation dtype with f32 accumulation, whatever the base's format.
// Row-parallel projections (wo, w_down) add their partial product before the layer's all-reduce.
#include "runtime/model/model.h"

#include "base/error.h"

#include <algorithm>

namespace lattice {

void Model::set_lora(int32_t slot, std::shared_ptr<const LoraAdapter> ad) {
    constexpr int32_t kMaxSlots = 4096;
    LATTICE_CHECK(slot >= 1 && slot < kMaxSlots, "LoRA slot {} (1 .. {})", slot, kMaxSlots - 1);
    LATTICE_CHECK(!opt_.shape_only, "LoRA on the simulated device");
    if (int32_t(loras_.size()) <= slot) loras_.resize(size_t(slot) + 1);
    if (!ad) {
        loras_[size_t(slot)] = LoraShard{};
        return;
    }
    const DType act = be_.activation_dtype();
    LATTICE_CHECK(be_.supports(Op::kMoe, act),
                  "adapter '{}': backend {} does not support LoRA (it needs row gather / scatter-add)", ad->name,
                  be_.name());
    LATTICE_CHECK(opt_.smooth_path.empty(), "adapter '{}': LoRA with SmoothQuant folding is not supported", ad->name);
    loras_[size_t(slot)] = make_lora_shard(ad, cfg_, shard_, opt_.layer_begin, opt_.layer_end, be_);
    if (ad->rank > lora_scratch_rank_ || lora_in_.empty()) {
        const int64_t T = opt_.max_batch_tokens, hd = cfg_.head_dim, H = cfg_.hidden;
        const int64_t in = std::max({H, shard_.n_heads * hd, shard_.ffn});
        const int64_t out = std::max({H, (shard_.n_heads + 2 * shard_.n_kv) * hd, 2 * shard_.ffn});
        lora_scratch_rank_ = std::max(lora_scratch_rank_, ad->rank);
        lora_rows_ = be_.alloc(DType::kI32, {T});
        lora_scales_ = be_.alloc(DType::kF32, {T});
        lora_in_ = be_.alloc(act, {T, in});
        lora_t_ = be_.alloc(act, {T, lora_scratch_rank_});
        lora_y_ = be_.alloc(act, {T, out});
        lora_d_ = be_.alloc(act, {T, out});
    }
}

int64_t Model::lora_bytes() const {
    int64_t b = 0;
    for (const LoraShard& s : loras_) b += s.bytes;
    return b;
}

void Model::prepare_lora(const TokenBatch& batch) {
    lora_groups_.clear();
    if (!batch.seq_loras) return;
    const int64_t T = batch.count;
    lora_rows_host_.clear();
    lora_scales_host_.clear();
    // Rows by slot, in slot order, each slot's rows increasing (a counting pass per slot present).
    std::vector<int32_t> slots;
    for (int64_t s = 0; s < batch.num_seqs; ++s) {
        const int32_t slot = batch.seq_loras[s];
        if (slot == 0) continue;
        LATTICE_CHECK(has_lora(slot), "sequence {} of the batch asks for LoRA slot {}, which holds no adapter", s,
                      slot);
        slots.push_back(slot);
    }
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    for (int32_t slot : slots) {
        LoraGroup g{slot, int64_t(lora_rows_host_.size()), 0};
        for (int64_t i = 0; i < T; ++i)
            if (batch.seq_loras[batch.seqs[i]] == slot) lora_rows_host_.push_back(int32_t(i));
        g.n = int64_t(lora_rows_host_.size()) - g.begin;
        lora_scales_host_.resize(lora_rows_host_.size(), loras_[size_t(slot)].scale);
        if (g.n > 0) lora_groups_.push_back(g);
    }
    if (lora_groups_.empty()) return;
    const int64_t n = int64_t(lora_rows_host_.size());
    be_.upload(View::contiguous(lora_rows_.data(), DType::kI32, {n}, be_.device()), lora_rows_host_.data());
    be_.upload(View::contiguous(lora_scales_.data(), DType::kF32, {n}, be_.device()), lora_scales_host_.data());
}

void Model::add_lora(const View& out, const View& in, size_t li, LoraSite site) {
    if (lora_groups_.empty()) return;
    const DType act = be_.activation_dtype();
    const Device dev = be_.device();
    for (const LoraGroup& g : lora_groups_) {
        const LoraShard& sh = loras_[size_t(g.slot)];
        const std::vector<LoraPart>& parts = sh.layers[li][size_t(site)].parts;
        if (parts.empty()) continue;
        const View rows = View::contiguous(lora_rows_.ptr<int32_t>() + g.begin, DType::kI32, {g.n}, dev);
        const View scales = View::contiguous(lora_scales_.ptr<float>() + g.begin, DType::kF32, {g.n}, dev);
        const View x = View::contiguous(lora_in_.data(), act, {g.n, in.cols()}, dev);
        const View t = View::contiguous(lora_t_.data(), act, {g.n, sh.rank}, dev);
        const View d = View::contiguous(lora_d_.data(), act, {g.n, out.cols()}, dev);
        be_.gather_rows(x, in, rows);
        // One part covering the whole output (wo, w_down, or a lone target of a 1-part site): B^T straight
        // into the delta; otherwise each part's columns of a zeroed delta.
        const bool whole = parts.size() == 1 && parts[0].col0 == 0 && parts[0].width == out.cols();
        if (!whole) be_.fill_zero(d);
        for (const LoraPart& p : parts) {
            be_.linear(t, x, p.a);
            if (whole) {
                be_.linear(d, t, p.b);
            } else {
                const View y = View::contiguous(lora_y_.data(), act, {g.n, p.width}, dev);
                be_.linear(y, t, p.b);
                be_.copy_columns(d, p.col0, y);
            }
        }
        be_.scatter_add_rows(out, d, rows, scales);
    }
}

}  // namespace lattice
