// AWQ and GPTQ 4-bit linears of a Hugging Face checkpoint (config.json "quantization_config"), turned into
// lattice's 4-bit form (kernels/common/int4.h, zero-point kind) for a 4-bit run, or dequantized for any other.
//
// Formats (per linear P, weight [n, k] as y = x W^T; packed int32 little-endian, 8 nibbles each, nibble i at
// bits 4i):
//   GPTQ  P.qweight i32 [k / 8, n]   q(k, n) = nibble k % 8 of qweight[k / 8][n]
//         P.qzeros  i32 [k / G, n / 8]  z'(g, n) = nibble n % 8 of qzeros[g][n / 8]
//         P.scales  f16 [k / G, n]
//         P.g_idx   i32 [k]          the group of input channel k (act-order, desc_act: not k / G)
//         w(n, k) = (q(k, n) - z(g, n)) * s(g, n), g = g_idx[k], z = z' + 1 in the usual ("gptq", v1) files,
//         which store z - 1 (a zero of 0 reads back as 16, as AutoGPTQ and exllama read it), z = z' for
//         checkpoint_format "gptq_v2"
//   AWQ   P.qweight i32 [k, n / 8]   q(k, n) = nibble r(n % 8) of qweight[k][n / 8], r = [0, 4, 1, 5, 2, 6, 3, 7]
//         P.qzeros  i32 [k / G, n / 8]  z(g, n) = nibble r(n % 8) of qzeros[g][n / 8] (AutoAWQ's "gemm" packing)
//         P.scales  f16 [k / G, n]
//         w(n, k) = (q - z(k / G, n)) * s(k / G, n)
// Values are those expressions in f32 (q - z is a small integer, the product with an f16 scale is exact), which
// is also what the NumPy reference of the tests computes; fp16 kernels (AutoAWQ's, exllama's) round it to fp16.
// Supported: bits 4, group_size 32, 64 or 128 (lattice's kernels); AWQ version "gemm" with zero points; GPTQ
// with or without desc_act. Anything else is refused naming config.json and the key. An act-order linear
// becomes 4-bit weights whose columns are the input channels sorted by group (a permutation the kernels apply
// to the activations); each group must then hold exactly G channels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/int4.h"
#include "runtime/weights/safetensors.h"

namespace lattice {

struct HfQuantConfig {
    std::string method;           // "awq" | "gptq"
    int64_t group = 128;          // group_size
    bool desc_act = false;        // GPTQ act-order (g_idx)
    bool zeros_minus_one = true;  // GPTQ v1 files store z - 1
};

// The checkpoint's quantization from config.json's text; nullopt without "quantization_config". Throws Error
// naming `path` and the key for an unsupported method, bit width, group size or format.
std::optional<HfQuantConfig> parse_hf_quant_config(const std::string& config_text, const std::string& path);

// One AWQ / GPTQ linear: views of its tensors in the mapped files (the files outlive it).
class HfInt4Linear {
public:
    struct Part {
        const SafetensorsEntry* entry = nullptr;
        const uint8_t* data = nullptr;
        std::string file;
    };
    // Checks every shape and dtype against each other and the config (and the zero points, scales and g_idx
    // values); throws Error naming the file and the tensor.
    HfInt4Linear(const HfQuantConfig& cfg, std::string name, Part qweight, Part qzeros, Part scales, Part g_idx);
    int64_t n() const { return n_; }
    int64_t k() const { return k_; }
    bool permuted() const { return !perm_.empty(); }  // act-order with a non-trivial order
    int64_t stored_bytes() const { return bytes_; }
    // Rows (output channels) [row0, +rows) x columns (input channels) [col0, +cols) in 4 bits (int4.h, kind
    // zero-point, groups of G). An AWQ slice keeps whole packs of 8 rows; columns keep whole groups; an
    // act-order linear is read whole along its columns. Throws Error naming the tensor otherwise.
    Int4Weights read_int4(int64_t row0, int64_t rows, int64_t col0, int64_t cols) const;
    // The same slice dequantized, f32 [rows, cols], any slice.
    void read_f32(int64_t row0, int64_t rows, int64_t col0, int64_t cols, float* out) const;

private:
    uint8_t q(int64_t n, int64_t k) const;
    uint8_t zero(int64_t g, int64_t n) const;  // 0..16
    uint16_t scale(int64_t g, int64_t n) const;
    int64_t group_of(int64_t k) const { return g_idx_.empty() ? k / cfg_.group : g_idx_[size_t(k)]; }

    HfQuantConfig cfg_;
    std::string name_, file_;
    const uint8_t *qweight_ = nullptr, *qzeros_ = nullptr, *scales_ = nullptr;
    int64_t n_ = 0, k_ = 0, groups_ = 0, bytes_ = 0;
    std::vector<int32_t> g_idx_;  // act-order only
    std::vector<int32_t> perm_;   // act-order: input channels sorted by group (stable)
};

}  // namespace lattice
