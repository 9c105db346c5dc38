// TensorSource over a GGUF file written by llama.cpp's converter (every general.architecture the
// architecture table names: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3; the table,
// runtime/arch/architecture.h, maps llama.cpp tensor names to HF names), shapes reversed to HF order
// (GGUF ne is innermost first), ModelConfig from <arch>.* metadata (the shared keys here, the family's own
// in its read_gguf), and row/col slices converted (or dequantized) into the caller's buffer straight from
// the read-only mapping, touching only the requested rows. What llama.cpp's converter changed is undone
// here, so callers see what an HF source shows:
// - llama's q/k rows, stored per head in an interleaved RoPE order: read() restores HF's half-split order
//   per whole head (slices of q/k must hold whole heads; the other families keep HF's order);
// - per-expert tensors merged into one 3-D tensor per layer, and Phi-3's fused attn_qkv / ffn_up: each
//   expert or part is an entry of its own, a row range of the file's tensor;
// - Gemma's norm weights, stored as 1 + w: the shift subtracted on read (Architecture::gguf_norm_shift).
// llama3 rope scaling arrives as the rope_freqs.weight tensor of per-pair theta divisors
// (rope_freq_factors()), Phi-3's LongRoPE as two factor tensors its read_gguf reads into the config. A vision
// tower's tensors are refused by name.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "base/error.h"
#include "kernels/common/int4_quantize.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/dequant.h"
#include "runtime/weights/gguf.h"

namespace lattice {

namespace {

// The family's read_gguf over the file's metadata and tensors.
class FileMetadata final : public GgufMetadata {
public:
    FileMetadata(const GgufFile& f, const std::string& arch) : f_(f) {
        source = f.path();
        prefix = arch + ".";
    }
    std::optional<int64_t> int_value(const std::string& key) const override { return f_.int_value(key); }
    std::optional<double> float_value(const std::string& key) const override { return f_.float_value(key); }
    std::optional<std::vector<float>> f32_vector(const std::string& name) const override {
        const GgufTensor* t = f_.find_tensor(name);
        if (!t) return std::nullopt;
        LATTICE_CHECK(t->ne.size() == 1 && t->dtype == DType::kF32, "{}: tensor \"{}\" must be 1-D f32, got {} [{}]",
                      source, name, dtype_name(t->dtype), fmt::join(t->ne, ", "));
        std::vector<float> v(size_t(t->ne[0]));
        std::memcpy(v.data(), f_.tensor_data(*t), v.size() * sizeof(float));
        return v;
    }

private:
    const GgufFile& f_;
};

// The family of the file: general.architecture, and for "llama" whether <arch>.expert_count names experts
// (llama.cpp writes Mixtral as "llama" with experts). A vision tower's tensors (llama.cpp's "v." / "mm."
// names, which its converter writes to a separate mmproj file) are refused by name: lattice runs text only.
const Architecture& gguf_family(const GgufFile& f, const std::string& arch, ModelConfig& c) {
    const std::string& src = f.path();
    const std::string p = arch + ".";
    LATTICE_CHECK(arch != "clip", "{}: architecture 'clip' is a vision projector (mmproj) file, not a language model",
                  src);
    for (const GgufTensor& t : f.tensors())
        LATTICE_CHECK(!t.name.starts_with("v.") && !t.name.starts_with("mm."),
                      "{}: tensor \"{}\" belongs to a vision tower, which lattice does not run: load a text-only GGUF "
                      "(llama.cpp's converter writes the vision tower to a separate mmproj file)",
                      src, t.name);
    const int64_t experts = f.int_value(p + "expert_count").value_or(0);
    const Architecture* family = architecture_for_gguf(arch, experts > 0);
    LATTICE_CHECK(family != nullptr || experts > 0 || !architecture_for_gguf(arch, true),
                  "{}: architecture '{}' is a mixture of experts but {}expert_count is missing", src, arch, p);
    LATTICE_CHECK(family != nullptr, "{}: architecture '{}'{} is not supported; supported: {}", src, arch,
                  experts > 0 ? fmt::format(" with {} experts ({}expert_count)", experts, p) : "",
                  supported_architectures());
    c.family = family->name;
    c.architecture = family->hf_classes.front();
    c.hidden_act = family->hidden_act;
    c.moe_renormalize = family->moe_renormalize;
    if (experts > 0) {
        c.n_experts = experts;
        auto used = f.int_value(p + "expert_used_count");
        LATTICE_CHECK(used.has_value(), "{}: missing metadata key \"{}expert_used_count\"", src, p);
        c.n_experts_used = *used;
    }
    return *family;
}

// <arch>.rope.freq_base and the linear scaling llama.cpp writes (rope.scaling.type / factor, or the older
// rope.scale_linear); "longrope" passes for the families that take it (their read_gguf reads the factors).
void read_gguf_rope(const GgufFile& f, const Architecture& family, const std::string& p, ModelConfig& c) {
    const std::string& src = f.path();
    c.rope_theta = f.float_value(p + "rope.freq_base").value_or(10000.0);
    LATTICE_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0,
                  "{}: {}rope.freq_base {} must be positive and finite", src, p, c.rope_theta);
    const bool longrope_ok =
        std::find(family.rope_scaling.begin(), family.rope_scaling.end(), "longrope") != family.rope_scaling.end();
    if (auto st = f.string_value(p + "rope.scaling.type"); st && *st != "none" && !(*st == "longrope" && longrope_ok)) {
        LATTICE_CHECK(*st == "linear", "{}: {}rope.scaling.type \"{}\" unsupported (none, linear{})", src, p, *st,
                      longrope_ok ? ", longrope" : "");
        auto factor = f.float_value(p + "rope.scaling.factor");
        LATTICE_CHECK(factor.has_value() && std::isfinite(*factor) && *factor > 0,
                      "{}: linear rope scaling needs a positive {}rope.scaling.factor", src, p);
        c.rope_scaling.type = "linear";
        c.rope_scaling.factor = *factor;
    } else if (auto lin = f.float_value(p + "rope.scale_linear"); lin && *lin != 1.0) {
        LATTICE_CHECK(std::isfinite(*lin) && *lin > 0, "{}: {}rope.scale_linear {} must be positive and finite", src, p,
                      *lin);
        c.rope_scaling.type = "linear";
        c.rope_scaling.factor = *lin;
    }
}

// The shapes: <arch>.* sizes, head_dim from key_length (else hidden / heads), full RoPE only.
void read_gguf_shapes(const GgufFile& f, const std::string& p, ModelConfig& c) {
    const std::string& src = f.path();
    auto req_int = [&](const std::string& key) {
        auto v = f.int_value(p + key);
        LATTICE_CHECK(v.has_value(), "{}: missing metadata key \"{}\"", src, p + key);
        return *v;
    };
    c.hidden = req_int("embedding_length");
    c.intermediate = req_int("feed_forward_length");
    c.n_layers = req_int("block_count");
    c.n_heads = req_int("attention.head_count");
    c.n_kv_heads = f.int_value(p + "attention.head_count_kv").value_or(c.n_heads);
    LATTICE_CHECK(c.n_heads > 0, "{}: {}attention.head_count must be positive, got {}", src, p, c.n_heads);
    if (auto kl = f.int_value(p + "attention.key_length")) {
        c.head_dim = *kl;
    } else {
        LATTICE_CHECK(c.hidden % c.n_heads == 0, "{}: head_count {} does not divide embedding_length {}", src,
                      c.n_heads, c.hidden);
        c.head_dim = c.hidden / c.n_heads;
    }
    if (auto vl = f.int_value(p + "attention.value_length"))
        LATTICE_CHECK(*vl == c.head_dim, "{}: {}attention.value_length {} differs from key_length {} (unsupported)",
                      src, p, *vl, c.head_dim);
    if (auto rd = f.int_value(p + "rope.dimension_count"))
        LATTICE_CHECK(*rd == c.head_dim,
                      "{}: {}rope.dimension_count {} differs from head_dim {} (partial RoPE "
                      "unsupported)",
                      src, p, *rd, c.head_dim);
    c.max_position = f.int_value(p + "context_length").value_or(2048);
    auto eps = f.float_value(p + "attention.layer_norm_rms_epsilon");
    LATTICE_CHECK(eps.has_value(), "{}: missing metadata key \"{}attention.layer_norm_rms_epsilon\"", src, p);
    c.rms_eps = *eps;
}

// The vocabulary (token_embd's rows, checked against vocab_size and the tokenizer), the tied head and the
// special ids.
void read_gguf_vocab(const GgufFile& f, const Architecture& family, const std::string& p, ModelConfig& c) {
    const std::string& src = f.path();
    const char* emb_name = nullptr;
    const char* head_name = nullptr;
    for (const TensorSpec& t : family.tensors) {
        if (t.role == TensorRole::kEmbed) emb_name = t.gguf;
        if (t.role == TensorRole::kLmHead) head_name = t.gguf;
    }
    const GgufTensor* emb = f.find_tensor(emb_name);
    LATTICE_CHECK(emb != nullptr, "{}: missing tensor \"{}\"", src, emb_name);
    LATTICE_CHECK(emb->ne.size() == 2, "{}: {} has {} dims, expected 2", src, emb_name, emb->ne.size());
    c.vocab = emb->ne[1];
    if (auto vs = f.int_value(p + "vocab_size"))
        LATTICE_CHECK(*vs == c.vocab, "{}: {}vocab_size {} differs from {} rows {}", src, p, *vs, emb_name, c.vocab);
    if (auto nt = f.array_size("tokenizer.ggml.tokens"))
        LATTICE_CHECK(int64_t(*nt) == c.vocab, "{}: tokenizer.ggml.tokens has {} entries, {} {} rows", src, *nt,
                      emb_name, c.vocab);
    c.tie_embeddings = f.find_tensor(head_name) == nullptr;
    if (auto bos = f.int_value("tokenizer.ggml.bos_token_id")) c.bos_id = *bos;
    if (auto eos = f.int_value("tokenizer.ggml.eos_token_id")) c.eos_ids = {*eos};
    if (auto eot = f.int_value("tokenizer.ggml.eot_token_id"))
        if (*eot != c.eos_ids.front()) c.eos_ids.push_back(*eot);
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
    ModelConfig c;
    c.source = f.path();
    auto arch = f.string_value("general.architecture");
    LATTICE_CHECK(arch.has_value(), "{}: missing general.architecture", c.source);
    const std::string p = *arch + ".";
    const Architecture& family = gguf_family(f, *arch, c);
    read_gguf_shapes(f, p, c);
    read_gguf_rope(f, family, p, c);
    read_gguf_vocab(f, family, p, c);
    if (family.read_gguf) family.read_gguf(FileMetadata(f, *arch), c);
    c.validate();
    return c;
}

void unpermute_qk_rows_bytes(void* rows, int64_t n_heads, int64_t head_dim, int64_t row_bytes) {
    LATTICE_CHECK(n_heads >= 0 && head_dim > 0 && head_dim % 2 == 0 && row_bytes >= 0,
                  "unpermute_qk_rows: n_heads {} head_dim {} (must be even) row_bytes {}", n_heads, head_dim,
                  row_bytes);
    auto* base = static_cast<uint8_t*>(rows);
    const int64_t half = head_dim / 2;
    std::vector<uint8_t> tmp(size_t(head_dim * row_bytes));
    for (int64_t h = 0; h < n_heads; ++h) {
        uint8_t* head = base + h * head_dim * row_bytes;
        // GGUF row 2*i + j  ->  HF row j*half + i
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j)
                std::memcpy(tmp.data() + (j * half + i) * row_bytes, head + (2 * i + j) * row_bytes, size_t(row_bytes));
        std::memcpy(head, tmp.data(), tmp.size());
    }
}

void unpermute_qk_rows(float* rows, int64_t n_heads, int64_t head_dim, int64_t cols) {
    unpermute_qk_rows_bytes(rows, n_heads, head_dim, cols * int64_t(sizeof(float)));
}

namespace {

class GgufSource final : public TensorSource {
public:
    explicit GgufSource(const std::string& path) : file_(GgufFile::open(path)) {
        config_ = gguf_model_config(*file_);
        const Architecture& arch = architecture_of(config_);
        for (const auto& t : file_->tensors()) {
            total_bytes_ += int64_t(t.nbytes);
            if (add_merged_experts(arch, t) || add_fused_parts(arch, t)) continue;
            std::string hf = gguf_to_hf_name(arch, t.name);
            if (hf.empty()) {
                // Listed under the file's own name so check_tensor_set refuses what nothing uses.
                if (!consumed_elsewhere(arch, t.name)) unmapped_.push_back(t.name);
                continue;
            }
            TensorInfo info;
            info.name = hf;
            info.dtype = t.dtype;
            info.shape.assign(t.ne.rbegin(), t.ne.rend());
            info.file = path;
            TensorRole role{};
            hf_role_of(arch, hf, &role);
            set_int4(info);
            // llama.cpp interleaves the q/k weight rows of the families whose rope it runs in pair order.
            const bool q = arch.gguf_qk_interleaved && role == TensorRole::kWq;
            const bool k = arch.gguf_qk_interleaved && role == TensorRole::kWk;
            by_hf_[hf] = Entry{info, &t, q ? config_.n_heads : k ? config_.n_kv_heads : 0, 0,
                               is_norm_role(role) ? arch.gguf_norm_shift : 0.0f};
        }
        check_shapes();
        if (const GgufTensor* rf = file_->find_tensor(kGgufRopeFreqs)) {
            LATTICE_CHECK(rf->ne.size() == 1 && rf->ne[0] == config_.head_dim / 2 && rf->dtype == DType::kF32,
                          "{}: rope_freqs.weight must be f32 [{}], got {} with {} elements", path, config_.head_dim / 2,
                          dtype_name(rf->dtype), rf->numel());
            freq_factors_.resize(size_t(rf->ne[0]));
            std::memcpy(freq_factors_.data(), file_->tensor_data(*rf), freq_factors_.size() * sizeof(float));
            for (size_t k = 0; k < freq_factors_.size(); ++k)
                LATTICE_CHECK(freq_factors_[k] > 0 && freq_factors_[k] < 1e30f,
                              "{}: rope_freqs.weight[{}] = {} must be positive and finite", path, k, freq_factors_[k]);
        }
    }

    const ModelConfig& config() const override { return config_; }
    bool has(const std::string& name) const override { return by_hf_.count(name) != 0; }
    const TensorInfo& info(const std::string& name) const override { return entry(name).info; }

    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out_dtype,
              void* dst) const override {
        const Entry& e = entry(name);
        const int64_t n_rows = e.info.rows();
        const int64_t n_cols = e.tensor->ne[0];
        LATTICE_CHECK(
            row0 >= 0 && rows >= 0 && row0 <= n_rows - rows && col0 >= 0 && cols >= 0 && col0 <= n_cols - cols,
            "{}: read of tensor \"{}\" rows [{}, +{}) cols [{}, +{}) outside its [{}, {}]", file_->path(), name, row0,
            rows, col0, cols, n_rows, n_cols);
        // The tensor's own block type: its raw blocks (a 4-bit run repacks them, runtime/model/rank_weights.h).
        const bool raw = dtype_is_block(out_dtype) && out_dtype == e.info.dtype;
        LATTICE_CHECK(raw || out_dtype == DType::kF32 || out_dtype == DType::kF16 || out_dtype == DType::kBF16,
                      "{}: tensor \"{}\" ({}): output dtype {} unsupported (f32, f16, bf16, or its own block type)",
                      file_->path(), name, dtype_name(e.info.dtype), dtype_name(out_dtype));
        const int64_t be = dtype_block_elems(e.info.dtype);
        if (dtype_is_block(e.info.dtype))
            LATTICE_CHECK(col0 % be == 0 && cols % be == 0,
                          "{}: tensor \"{}\" is {}: column slice [{}, +{}) must be {}-aligned", file_->path(), name,
                          dtype_name(e.info.dtype), col0, cols, be);
        const int64_t row_bytes = dtype_bytes(e.info.dtype, n_cols);
        const uint8_t* base = file_->tensor_data(*e.tensor) + e.row_base * row_bytes;
        auto* out = static_cast<uint8_t*>(dst);
        const int64_t out_row_bytes = dtype_bytes(out_dtype, cols);
        const bool qk = e.qk_heads > 0;
        const int64_t hd = config_.head_dim;
        if (qk)
            LATTICE_CHECK(row0 % hd == 0 && rows % hd == 0,
                          "{}: tensor \"{}\": row slice [{}, +{}) must hold whole heads of {} rows", file_->path(),
                          name, row0, rows, hd);
        for (int64_t r = 0; r < rows; ++r) {
            uint8_t* o = out + r * out_row_bytes;
            if (raw) {
                std::memcpy(o, base + (row0 + r) * row_bytes + dtype_bytes(out_dtype, col0), size_t(out_row_bytes));
                if (const int64_t b = first_non_finite_block(o, out_dtype, cols / be); b >= 0) [[unlikely]]
                    LATTICE_FAIL("{}: tensor \"{}\" ({}): block of row {} columns [{}, {}) has a non-finite scale",
                                 file_->path(), e.tensor->name, dtype_name(out_dtype), row0 + r, col0 + be * b,
                                 col0 + be * b + be);
                continue;
            }
            if (e.norm_shift != 0) {
                shifted_row(e, base + (row0 + r) * row_bytes, row0 + r, col0, cols, out_dtype, o);
                continue;
            }
            convert_row_slice(base + (row0 + r) * row_bytes, e.info.dtype, col0, cols, o, out_dtype);
            // Row numbers as stored (q/k rows before un-permuting), so the message names the GGUF tensor.
            if (first_non_finite(o, out_dtype, cols) >= 0) [[unlikely]] {
                TensorInfo stored = e.info;
                stored.name = e.tensor->name;
                check_finite_row(o, out_dtype, cols, stored, row0 + r, col0);
            }
        }
        if (qk) unpermute_qk_rows_bytes(dst, rows / hd, hd, out_row_bytes);
    }
    // Q4_0 / Q4_1 blocks as 4-bit weights in groups of 32: the blocks' nibbles, f16 d (and m) copied, so every
    // value is the block's own (the raw read un-permutes q/k rows like the float read). Q4_K super-blocks: one
    // affine group per 32-element sub-block, its scale and minimum rounded once to f16 (q4_k_to_int4, dequant.h).
    // Q6_K: its f32 values quantized to affine groups of 32 (kernels/common/int4_quantize.h, as a backend
    // quantizes a float linear). Q4_K and Q6_K also keep their super-blocks (Int4Weights::kq).
    Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) const override {
        const Entry& e = entry(name);
        const DType t = e.info.dtype;
        LATTICE_CHECK(e.info.int4_group > 0 || e.info.int4_requant, "{}: tensor \"{}\" is {}, not 4-bit",
                      file_->path(), name, dtype_name(t));
        std::vector<uint8_t> raw(size_t(dtype_bytes(t, rows * cols)));
        read(name, row0, rows, col0, cols, t, raw.data());
        if (t == DType::kQ6_K) {
            std::vector<float> f(size_t(rows * cols));
            dequant_q6_k(raw.data(), f.data(), rows * cols);
            Int4Weights w = quantize_weights_int4(f.data(), rows, cols, kInt4Block);
            w.kq.push_back(Int4KQuantPart{t, rows, std::move(raw)});
            return w;
        }
        if (t == DType::kQ4_K) {
            Int4Weights w(rows, cols, 32, Int4Kind::kAffine);
            if (const int64_t g = q4_k_to_int4(raw.data(), rows * cols, w.qs.data(), w.d.data(), w.m.data()); g >= 0) {
                const int64_t r = g / (cols / 32), c = col0 + g % (cols / 32) * 32;
                LATTICE_FAIL(
                    "{}: tensor \"{}\" (q4_K): sub-block of row {} columns [{}, {}) has a scale d * sc or "
                    "minimum dmin * mn beyond f16's range (65504), which a 4-bit run holds in f16: run it "
                    "with --quant w8a8 or w8a16",
                    file_->path(), e.tensor->name, row0 + r, c, c + 32);
            }
            w.kq.push_back(Int4KQuantPart{t, rows, std::move(raw)});
            return w;
        }
        const bool q4_1 = t == DType::kQ4_1;
        Int4Weights w(rows, cols, 32, q4_1 ? Int4Kind::kAffine : Int4Kind::kOffset8);
        const int64_t nb = rows * (cols / 32), bytes = dtype_block_bytes(t), head = q4_1 ? 4 : 2;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = raw.data() + b * bytes;
            std::memcpy(&w.d[size_t(b)], blk, 2);
            if (q4_1) std::memcpy(&w.m[size_t(b)], blk + 2, 2);
            std::memcpy(&w.qs[size_t(b * 16)], blk + head, 16);
        }
        return w;
    }
    // Q4_K / Q6_K as their super-blocks alone (the raw read checks each block's scales finite); others read_int4.
    Int4Weights read_kquant(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                            int64_t cols) const override {
        const DType t = entry(name).info.dtype;
        if (t != DType::kQ4_K && t != DType::kQ6_K) return read_int4(name, row0, rows, col0, cols);
        std::vector<uint8_t> raw(size_t(dtype_bytes(t, rows * cols)));
        read(name, row0, rows, col0, cols, t, raw.data());
        return Int4Weights::kquant_rows(rows, cols, Int4KQuantPart{t, rows, std::move(raw)});
    }
    std::vector<float> rope_freq_factors() const override { return freq_factors_; }
    std::vector<std::string> tensor_names() const override {
        std::vector<std::string> out = unmapped_;
        for (const auto& [n, e] : by_hf_) out.push_back(n);
        return out;
    }
    void release_pages() const override { file_->release_pages(); }
    std::string describe() const override {
        return fmt::format("{} (GGUF v{}, {} tensors)", file_->path(), file_->version(), file_->tensors().size());
    }
    int64_t total_bytes() const override { return total_bytes_; }

private:
    struct Entry {
        TensorInfo info;
        const GgufTensor* tensor = nullptr;
        int64_t qk_heads = 0;  // q/k projections: heads whose rows read() un-permutes; 0 otherwise
        int64_t row_base = 0;  // one expert of a merged 3-D tensor, a part of a fused one: its first row
        float norm_shift = 0;  // Architecture::gguf_norm_shift for a norm weight: subtracted on read
    };

    // 4-bit block types: read_int4 gives them as groups of 32 (Q4_K: each 32-element sub-block a group); Q6_K
    // requantized.
    static void set_int4(TensorInfo& info) {
        const DType t = info.dtype;
        if (t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ4_K) {
            info.int4_group = 32;
            info.int4_kind = t == DType::kQ4_0 ? Int4Kind::kOffset8 : Int4Kind::kAffine;
        }
        info.int4_requant = t == DType::kQ6_K;
    }

    // Tensors the reader or the family's read_gguf consumed (rope factors), and llama.cpp's unused ones.
    static bool consumed_elsewhere(const Architecture& arch, const std::string& name) {
        if (name == kGgufRopeFreqs || name.ends_with(".attn_rot_embd")) return true;
        return arch.read_gguf != nullptr && (name == kGgufRopeFactorsLong || name == kGgufRopeFactorsShort);
    }

    // A stored norm weight (1 + w for Gemma) as w: the row to f32, the shift off, then to `out_dtype`.
    void shifted_row(const Entry& e, const uint8_t* row, int64_t row_no, int64_t col0, int64_t cols, DType out_dtype,
                     uint8_t* out) const {
        std::vector<float> f(static_cast<size_t>(cols));
        convert_row_slice(row, e.info.dtype, col0, cols, f.data(), DType::kF32);
        for (float& v : f) v -= e.norm_shift;
        TensorInfo stored = e.info;
        stored.name = e.tensor->name;
        check_finite_row(f.data(), DType::kF32, cols, stored, row_no, col0);
        convert_row_slice(reinterpret_cast<const uint8_t*>(f.data()), DType::kF32, 0, cols, out, out_dtype);
    }

    // A fused per-layer tensor (Phi-3's blk.N.attn_qkv.weight, its ffn_up holding gate|up) becomes one HF entry
    // per part, row ranges of it in table order; false for every other tensor.
    bool add_fused_parts(const Architecture& arch, const GgufTensor& t) {
        std::string rest;
        const int64_t layer = gguf_layer_of(t.name, &rest);
        if (layer < 0) return false;
        const std::vector<const TensorSpec*> parts = gguf_fused_parts(arch, rest);
        if (parts.empty()) return false;
        int64_t rows = 0;
        for (const TensorSpec* s : parts) rows += tensor_shape(config_, s->role)[0];
        LATTICE_CHECK(t.ne.size() == 2 && t.ne[1] == rows,
                      "{}: tensor \"{}\" has shape [{}] (GGUF order), expected 2 dims with its {} parts' {} rows "
                      "outermost",
                      file_->path(), t.name, fmt::join(t.ne, ", "), parts.size(), rows);
        int64_t row0 = 0;
        for (const TensorSpec* s : parts) {
            TensorInfo info;
            info.name = "model.layers." + std::to_string(layer) + "." + s->hf;
            info.dtype = t.dtype;
            info.shape = {tensor_shape(config_, s->role)[0], t.ne[0]};
            info.file = file_->path();
            set_int4(info);
            by_hf_[info.name] = Entry{info, &t, 0, row0};
            row0 += info.shape[0];
        }
        return true;
    }

    // A merged expert tensor (blk.N.ffn_gate_exps.weight, ne [cols, rows, experts]) becomes one HF
    // entry per expert, each a row range of it; false for every other tensor.
    bool add_merged_experts(const Architecture& arch, const GgufTensor& t) {
        std::string rest;
        const int64_t layer = gguf_layer_of(t.name, &rest);
        const TensorSpec* spec = layer >= 0 ? gguf_merged_spec(arch, rest) : nullptr;
        if (!spec) return false;
        LATTICE_CHECK(t.ne.size() == 3 && t.ne[2] == config_.n_experts,
                      "{}: tensor \"{}\" has shape [{}] (GGUF order), expected 3 dims with {} experts outermost",
                      file_->path(), t.name, fmt::join(t.ne, ", "), config_.n_experts);
        for (int64_t e = 0; e < t.ne[2]; ++e) {
            TensorInfo info;
            info.name = "model.layers." + std::to_string(layer) + "." + expert_name(spec->hf, e);
            info.dtype = t.dtype;
            info.shape = {t.ne[1], t.ne[0]};
            info.file = file_->path();
            by_hf_[info.name] = Entry{info, &t, 0, e * t.ne[1]};
        }
        return true;
    }

    const Entry& entry(const std::string& name) const {
        auto it = by_hf_.find(name);
        LATTICE_CHECK(it != by_hf_.end(), "{}: no tensor \"{}\" in this GGUF file", file_->path(), name);
        return it->second;
    }

    void expect(const std::string& hf, std::vector<int64_t> shape) const {
        auto it = by_hf_.find(hf);
        LATTICE_CHECK(it != by_hf_.end(), "{}: missing tensor for \"{}\"", file_->path(), hf);
        const TensorInfo& i = it->second.info;
        LATTICE_CHECK(i.shape == shape, "{}: tensor \"{}\" ({}) has shape {}, expected {}", file_->path(),
                      it->second.tensor->name, hf, fmt::join(i.shape, "x"), fmt::join(shape, "x"));
    }

    void check_shapes() const {
        for (const ExpectedTensor& t : expected_tensors(config_)) expect(t.name, t.shape);
    }

    std::unique_ptr<GgufFile> file_;
    ModelConfig config_;
    std::map<std::string, Entry> by_hf_;
    std::vector<std::string> unmapped_;  // GGUF names with no HF counterpart (rope_freqs aside)
    std::vector<float> freq_factors_;
    int64_t total_bytes_ = 0;
};

}  // namespace

std::unique_ptr<TensorSource> open_gguf_model(const std::string& path) {
    return std::make_unique<GgufSource>(path);
}

}  // namespace lattice
