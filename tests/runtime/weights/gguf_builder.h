// Test helper: writes GGUF images in memory, valid by default, with the positions of the fields
// tests corrupt on purpose (counts, lengths, tensor types and offsets) recorded for patching.
// Tensors are laid out in order at `alignment`-aligned offsets after the tensor infos.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lattice::test {

class GgufBuilder {
public:
    struct Tensor {
        std::string name;
        uint32_t ggml_type;
        std::vector<uint64_t> ne;
        std::vector<uint8_t> data;
    };

    static void put(std::vector<uint8_t>& b, const void* p, size_t n) {
        const auto* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
    }
    template <typename T>
    static void put(std::vector<uint8_t>& b, T v) {
        put(b, &v, sizeof(T));
    }
    static void put_str(std::vector<uint8_t>& b, const std::string& s) {
        put<uint64_t>(b, s.size());
        put(b, s.data(), s.size());
    }

    // Metadata; each kv_* records where its key-length field lands in kv_bytes.
    void kv_header(const std::string& key, uint32_t type) {
        kv_pos.push_back(kv_bytes.size());
        put_str(kv_bytes, key);
        put<uint32_t>(kv_bytes, type);
        ++n_kv;
    }
    void kv_u32(const std::string& k, uint32_t v) { kv_header(k, 4), put(kv_bytes, v); }
    void kv_i32(const std::string& k, int32_t v) { kv_header(k, 5), put(kv_bytes, v); }
    void kv_u64(const std::string& k, uint64_t v) { kv_header(k, 10), put(kv_bytes, v); }
    void kv_i8(const std::string& k, int8_t v) { kv_header(k, 1), put(kv_bytes, v); }
    void kv_u16(const std::string& k, uint16_t v) { kv_header(k, 2), put(kv_bytes, v); }
    void kv_f32(const std::string& k, float v) { kv_header(k, 6), put(kv_bytes, v); }
    void kv_f64(const std::string& k, double v) { kv_header(k, 12), put(kv_bytes, v); }
    void kv_bool(const std::string& k, bool v) { kv_header(k, 7), put<uint8_t>(kv_bytes, v ? 1 : 0); }
    void kv_str(const std::string& k, const std::string& v) { kv_header(k, 8), put_str(kv_bytes, v); }
    void kv_str_array(const std::string& k, const std::vector<std::string>& v) {
        kv_header(k, 9);
        put<uint32_t>(kv_bytes, 8);
        array_count_pos.push_back(kv_bytes.size());
        put<uint64_t>(kv_bytes, v.size());
        for (const auto& s : v) put_str(kv_bytes, s);
    }
    template <typename T>
    void kv_array(const std::string& k, uint32_t elem_type, const std::vector<T>& v) {
        kv_header(k, 9);
        put<uint32_t>(kv_bytes, elem_type);
        array_count_pos.push_back(kv_bytes.size());
        put<uint64_t>(kv_bytes, v.size());
        for (const T& x : v) put(kv_bytes, x);
    }
    // Raw value bytes after a header (for nested arrays and invalid types).
    void kv_raw(const std::string& k, uint32_t type, const std::vector<uint8_t>& value) {
        kv_header(k, type);
        put(kv_bytes, value.data(), value.size());
    }

    void tensor(const std::string& name, uint32_t ggml_type, std::vector<uint64_t> ne, std::vector<uint8_t> data) {
        tensors.push_back({name, ggml_type, std::move(ne), std::move(data)});
    }

    // Assembles the file. Absolute positions of patchable fields are filled in.
    std::vector<uint8_t> build(uint32_t version = 3, uint64_t alignment = 32) {
        std::vector<uint8_t> b;
        put<uint32_t>(b, 0x46554747);
        put<uint32_t>(b, version);
        put<uint64_t>(b, tensors.size());
        put<uint64_t>(b, n_kv);
        kv_start = b.size();
        put(b, kv_bytes.data(), kv_bytes.size());
        tensor_type_pos.clear();
        tensor_offset_pos.clear();
        tensor_name_pos.clear();
        std::vector<uint64_t> offsets;
        uint64_t off = 0;
        for (const auto& t : tensors) {
            tensor_name_pos.push_back(b.size());
            put_str(b, t.name);
            put<uint32_t>(b, uint32_t(t.ne.size()));
            for (uint64_t d : t.ne) put(b, d);
            tensor_type_pos.push_back(b.size());
            put<uint32_t>(b, t.ggml_type);
            tensor_offset_pos.push_back(b.size());
            put<uint64_t>(b, off);
            offsets.push_back(off);
            off += (t.data.size() + alignment - 1) / alignment * alignment;
        }
        while (b.size() % alignment) b.push_back(0);
        data_start = b.size();
        for (size_t i = 0; i < tensors.size(); ++i) {
            b.resize(data_start + offsets[i]);
            put(b, tensors[i].data.data(), tensors[i].data.size());
        }
        return b;
    }

    template <typename T>
    static void patch(std::vector<uint8_t>& b, size_t pos, T v) {
        std::memcpy(b.data() + pos, &v, sizeof(T));
    }

    std::vector<uint8_t> kv_bytes;
    uint64_t n_kv = 0;
    std::vector<size_t> kv_pos;           // relative to kv_start
    std::vector<size_t> array_count_pos;  // relative to kv_start
    std::vector<Tensor> tensors;
    size_t kv_start = 0, data_start = 0;
    std::vector<size_t> tensor_name_pos, tensor_type_pos, tensor_offset_pos;  // absolute
};

// The key-values of the one-layer llama fixtures of the 4-bit and K-quant tests (q4_gguf.h, kquant_gguf.h):
// rms eps 1e-6, rope base 10000, context 128, bos 1, eos 2.
inline void add_one_layer_llama_kv(GgufBuilder& g, uint64_t hidden, uint64_t ffn, uint32_t heads, uint32_t kv_heads) {
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.embedding_length", uint32_t(hidden));
    g.kv_u32("llama.feed_forward_length", uint32_t(ffn));
    g.kv_u32("llama.block_count", 1);
    g.kv_u32("llama.attention.head_count", heads);
    g.kv_u32("llama.attention.head_count_kv", kv_heads);
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
    g.kv_f32("llama.rope.freq_base", 10000.0f);
    g.kv_u32("llama.context_length", 128);
    g.kv_u32("tokenizer.ggml.bos_token_id", 1);
    g.kv_u32("tokenizer.ggml.eos_token_id", 2);
}

// n f32 norm weights 1 + 0.01 (k % 13), as the bytes of an F32 tensor.
inline std::vector<uint8_t> norm_weight_bytes(int64_t n) {
    std::vector<uint8_t> v(size_t(n) * 4);
    for (int64_t k = 0; k < n; ++k) {
        const float x = 1.0f + 0.01f * float(k % 13);
        std::memcpy(&v[size_t(k) * 4], &x, 4);
    }
    return v;
}

}  // namespace lattice::test
