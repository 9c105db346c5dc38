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

}  // namespace lattice::test
