// TensorSource: a checkpoint seen as named 2-D (or 1-D) tensors, whatever the file format.
// Loaders (safetensors, GGUF) validate their headers up front; read() converts a rectangular
// slice [row0, row0+rows) x [col0, col0+cols) of one tensor into a caller buffer, so a
// tensor-parallel rank touches only the bytes of its own shard. Shapes are HF order: [rows, cols]
// with cols innermost (GGUF's ne[0]).
#pragma once

#include "base/dtype.h"
#include "kernels/common/int4.h"
#include "parallel/world_config.h"
#include "runtime/arch/config.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

// "[r, c]" for error messages.
inline std::string shape_string(const std::vector<int64_t>& shape) {
    std::string r = "[";
    for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
    return r + "]";
}

struct TensorInfo {
    std::string name;  // canonical HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
    DType dtype = DType::kF32;   // as stored (a 4-bit AWQ / GPTQ linear: u8, see int4_group)
    std::vector<int64_t> shape;  // HF order, outermost first
    std::string file;            // file holding it (for error messages)
    // > 0: a linear stored in 4 bits in groups of this many columns (GGUF Q4_0 / Q4_1 / Q4_K, AWQ, GPTQ), which
    // read_int4 gives without dequantizing; its kind, and whether its columns carry an act-order permutation.
    int64_t int4_group = 0;
    Int4Kind int4_kind = Int4Kind::kAffine;
    bool int4_perm = false;
    // A GGUF Q6_K linear (int4_group 0: not a 4-bit tensor): read_int4 also gives it, as affine groups of 32
    // re-quantized from its values with its own super-blocks beside (Int4Weights::kq), for a 4-bit run.
    bool int4_requant = false;
    int64_t rows() const { return shape.size() >= 2 ? shape[0] : 1; }
    int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
};

// What `lattice convert` prepared a checkpoint for (runtime/weights/converted_source.h): the file of
// one rank of a tp x pp layout, holding exactly that rank's tensors under rank-local names
// (fused q|k|v and gate|up, SmoothQuant folded in), int8 + per-channel scales for int8 modes.
struct PreparedLayout {
    std::string folder;
    int tp = 1, pp = 1;
    int rank = 0;                       // world rank whose file this source reads
    std::vector<int64_t> stage_layers;  // layers per pipeline stage
    std::string quant = "none";         // none | w8a16 | w8a8 (runtime/backend/backend.h QuantMode names)
    bool quant_head = false;            // the LM head is int8 too
    std::string kv_cache_dtype = "auto";  // the KV cache a run uses unless told (--kv-cache-dtype)
    std::string smooth;                 // name of the folded SmoothQuant factor file, "" when none
    // The rank's place in the layout: WorldConfig's arithmetic (throws Error for an invalid one).
    WorldConfig world() const { return WorldConfig::make(tp * pp, tp, pp, rank); }
    int tp_rank() const { return world().tp_rank(); }
    int pp_rank() const { return world().pp_rank(); }
    // "tp 2 x pp 1 (quant w8a8)"
    std::string describe() const {
        return "tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " (quant " + quant +
               (quant_head ? ", int8 LM head" : "") + (smooth.empty() ? "" : ", smoothed with " + smooth) + ")";
    }
};

class TensorSource {
public:
    virtual ~TensorSource() = default;
    virtual const ModelConfig& config() const = 0;
    virtual bool has(const std::string& name) const = 0;
    virtual const TensorInfo& info(const std::string& name) const = 0;  // throws Error if missing
    // Converts the slice to `out_dtype` (f32, f16 or bf16) into dst, row-major [rows, cols].
    // Block-quantized tensors need col0 and cols to be multiples of 32; a GGUF source also gives them as
    // they are when `out_dtype` is the tensor's own block type (rows of whole blocks, scales checked finite).
    virtual void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                      DType out_dtype, void* dst) const = 0;
    // The 4-bit form (kernels/common/int4.h) of rows [row0, row0 + rows) x columns [col0, col0 + cols) of a
    // tensor with info().int4_group > 0: nibbles, f16 scales, zero points or minimums as stored, nothing
    // dequantized. col0 and cols must be multiples of the group (and of a GGUF block type's block: 256 for Q4_K,
    // whose groups are its 32-element sub-blocks), and a tensor with an act-order permutation
    // can only be read whole along its columns; a slice that breaks either is an Error naming the tensor.
    virtual Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                                  int64_t cols) const;
    // The same slice for a consumer that packs GGUF K-quant super-blocks as they are (the CPU's W4A8): a Q4_K or
    // Q6_K tensor comes as its super-blocks only (Int4Weights::kq, kquant_only(): no group form, so a Q6_K is not
    // re-quantized and a Q4_K not repacked for nothing); any other tensor as read_int4 gives it (the default).
    virtual Int4Weights read_kquant(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                                    int64_t cols) const {
        return read_int4(name, row0, rows, col0, cols);
    }
    // Optional per-pair rope frequency divisors (GGUF rope_freqs.weight), empty if none.
    virtual std::vector<float> rope_freq_factors() const { return {}; }
    virtual std::string describe() const = 0;  // path and format, for logs and errors
    virtual int64_t total_bytes() const = 0;   // bytes of all tensor data in the checkpoint
    // Every tensor the checkpoint holds (HF names where mapped, the file's own name otherwise);
    // empty when the source cannot list them (check_tensor_set then checks only what the model needs).
    virtual std::vector<std::string> tensor_names() const { return {}; }
    // Non-null for a converted checkpoint: the layout, rank and quantization its tensors are for.
    virtual const PreparedLayout* prepared() const { return nullptr; }
    // Hint after a caller copied what it read: drop this process's mappings of the file pages (the
    // page cache keeps them), so streaming a checkpoint keeps the resident set near one tensor.
    virtual void release_pages() const {}
};

// Checks a checkpoint against its config before anything is loaded: every tensor the Llama forward
// needs exists with the shape the config implies, and every tensor present is one it uses (a
// checkpoint with more layers than num_hidden_layers, or with tensors of an unsupported feature such
// as biases, is refused rather than run without them). tie_word_embeddings beside an lm_head.weight:
// accepted when the two hold the same values (some exporters save both), refused when they differ.
// Throws Error naming the config, the file and the tensors.
void check_tensor_set(const TensorSource& src);
// Elements of all tensors the source lists (0 when it lists none).
int64_t listed_elements(const TensorSource& src);

// Index of the first NaN or infinity among n f32/f16/bf16 values, -1 when all are finite.
int64_t first_non_finite(const void* data, DType t, int64_t n);
// For sources' read(): throws Error naming the file, the tensor and [row, col] of the first
// non-finite value of a converted row slice (row `row`, starting at column `col0`).
void check_finite_row(const void* data, DType t, int64_t n, const TensorInfo& info, int64_t row, int64_t col0);
// For sources' read(): throws Error naming the file and tensor unless rows [row0, row0 + rows) and
// columns [col0, col0 + cols) lie inside the tensor (checked without overflow).
void check_slice(const TensorInfo& info, int64_t row0, int64_t rows, int64_t col0, int64_t cols);

// Opens a model: a HF directory (config.json + safetensors), a .gguf file, or a converted folder
// (manifest.json) of a single-rank layout (other layouts: open_converted_model, which needs the rank).
std::unique_ptr<TensorSource> open_model(const std::string& path);
// The GGUF reader behind open_model for *.gguf paths (runtime/weights/gguf_source.cpp).
std::unique_ptr<TensorSource> open_gguf_model(const std::string& path);

}  // namespace lattice
