// GGUF (v2/v3, little-endian) reader: header, metadata key/values, tensor infos, data section.
// Layout: magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv | kv* | tensor_info* | pad to
// general.alignment (default 32) | data. A kv is {string key, u32 type, value}; a string is
// {u64 len, bytes}; an array is {u32 elem type, u64 count, elems} (arrays may nest). A tensor info
// is {string name, u32 n_dims, u64 ne[n_dims] (innermost first), u32 ggml type, u64 offset}
// with offset relative to the data section.
// Invariants after open()/parse(): every count, length, dim and offset was checked against the
// bytes actually present before anything was allocated; tensor data ranges lie inside the file,
// are aligned, do not overlap and account for every byte of the data section (gaps and the tail
// shorter than the alignment, zero padding after the infos); keys and tensor names are unique; only tensor types F32,
// F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are accepted (others: an Error naming the type and
// this list). The file is mmapped read-only; string and array values are copied out at
// parse time (small), tensor bytes are read straight from the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

enum class GgufType : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
};
const char* gguf_type_name(GgufType t);
// Name of a ggml tensor type number ("q4_K", ...) or "unknown".
const char* ggml_type_name(uint32_t ggml_type);

// One metadata value. Scalars: integers in i (signed types and bool) or u (unsigned types),
// floats in f, strings in s. Arrays keep `count` elements of elem_type compactly: numeric and
// bool elements as their raw little-endian bytes (raw), strings in strs, nested arrays in arr.
struct GgufValue {
    GgufType type = GgufType::kU8;
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0.0;
    std::string s;
    GgufType elem_type = GgufType::kU8;  // arrays only
    size_t count = 0;                    // arrays only
    std::vector<uint8_t> raw;            // arrays of numbers / bools
    std::vector<std::string> strs;       // arrays of strings
    std::vector<GgufValue> arr;          // arrays of arrays

    bool is_integer() const;  // any of u8..i64 (not bool)
    bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
    // Element k of an array as a stand-alone value (throws Error when out of range or not an array).
    GgufValue element(size_t k) const;
};

struct GgufTensor {
    std::string name;           // GGUF name, e.g. "blk.0.attn_q.weight"
    uint32_t ggml_type = 0;     // raw ggml type number
    DType dtype = DType::kF32;  // f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K
    std::vector<int64_t> ne;    // GGUF order: ne[0] innermost (= HF's last dim)
    uint64_t offset = 0;        // relative to the data section
    uint64_t nbytes = 0;
    int64_t numel() const;
};

class GgufFile {
public:
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    // mmaps `path` read-only and parses it. Throws Error naming the path and the culprit.
    static std::unique_ptr<GgufFile> open(const std::string& path);
    // Parses a copy of bytes [data, data+size); `name` labels errors. Used by the fuzzer and tests.
    static std::unique_ptr<GgufFile> parse(const void* data, size_t size, const std::string& name);

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
    size_t file_size() const { return size_; }

    // Metadata. Scalar getters return nullopt when the key is absent and throw Error when it holds
    // another type. int_value accepts every integer type (u64 above INT64_MAX throws); float_value
    // accepts f32/f64 and integers. Array getters return {} when absent, throw on another type;
    // int_array accepts any integer element type (range-checked to int32), float_array f32/f64.
    bool has(const std::string& key) const;
    const GgufValue* find(const std::string& key) const;  // nullptr if absent
    std::vector<std::string> keys() const;                // in file order
    std::optional<std::string> string_value(const std::string& key) const;
    std::optional<int64_t> int_value(const std::string& key) const;
    std::optional<double> float_value(const std::string& key) const;
    std::optional<bool> bool_value(const std::string& key) const;
    std::vector<std::string> string_array(const std::string& key) const;
    std::vector<float> float_array(const std::string& key) const;
    std::vector<int32_t> int_array(const std::string& key) const;
    // Element count of an array value (any element type), nullopt if absent; throws if not an array.
    std::optional<size_t> array_size(const std::string& key) const;

    // Tensors, in file order.
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find_tensor(const std::string& name) const;  // nullptr if absent
    const GgufTensor& tensor(const std::string& name) const;       // throws Error if absent
    // First byte of the tensor's data (inside the mapping; valid while this object lives).
    const uint8_t* tensor_data(const GgufTensor& t) const { return base_ + data_offset_ + t.offset; }
    // Drops this process's page mappings of the file (open() only; the page cache keeps the data).
    void release_pages() const;

private:
    GgufFile() = default;
    void parse_all();
    void check_regions(const std::vector<const GgufTensor*>& by_offset, uint64_t infos_end) const;

    std::string path_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    void* map_ = nullptr;        // mmap region (open) or nullptr
    std::vector<uint8_t> copy_;  // owned bytes (parse)
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<GgufTensor> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

// ModelConfig from <arch>.* metadata of a family in the architecture table (general.architecture
// "llama" or "qwen2"; runtime/arch/architecture.h maps the tensor names), and tensor shapes for vocab /
// tie. Throws Error naming the file, or the architecture and the supported ones.
ModelConfig gguf_model_config(const GgufFile& f);

// TensorSource over a .gguf file (HF names, HF shapes, q/k rows in GGUF interleaved order).
std::unique_ptr<TensorSource> open_gguf_model(const std::string& path);

// llama.cpp's converter stores each q/k head's rows interleaved: GGUF row h*d + 2*i + j holds
// HF row h*d + j*(d/2) + i (i < d/2, j in {0,1}). Permutes `rows` ([n_heads*head_dim, cols],
// row-major f32, whole heads) in place from GGUF order back to HF's half-split order.
void unpermute_qk_rows(float* rows, int64_t n_heads, int64_t head_dim, int64_t cols);
// The same on rows of any element type, each `row_bytes` bytes long (f16/bf16 buffers).
void unpermute_qk_rows_bytes(void* rows, int64_t n_heads, int64_t head_dim, int64_t row_bytes);

}  // namespace lattice
