// Metadata-only GGUF writer (see gguf_writer.h).
#include "runtime/weights/gguf_writer.h"

#include <cstring>
#include <fstream>

#include "base/error.h"

namespace lattice {

namespace {

class Out {
public:
    template <typename T>
    void put(T x) {
        char b[sizeof(T)];
        std::memcpy(b, &x, sizeof(T));
        bytes_.append(b, sizeof(T));
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        bytes_.append(s);
    }
    void raw(const std::vector<uint8_t>& r) { bytes_.append(reinterpret_cast<const char*>(r.data()), r.size()); }
    const std::string& bytes() const { return bytes_; }

private:
    std::string bytes_;
};

void put_scalar(Out& o, const GgufValue& v) {
    switch (v.type) {
        case GgufType::kU8:
            o.put<uint8_t>(uint8_t(v.u));
            break;
        case GgufType::kI8:
            o.put<int8_t>(int8_t(v.i));
            break;
        case GgufType::kU16:
            o.put<uint16_t>(uint16_t(v.u));
            break;
        case GgufType::kI16:
            o.put<int16_t>(int16_t(v.i));
            break;
        case GgufType::kU32:
            o.put<uint32_t>(uint32_t(v.u));
            break;
        case GgufType::kI32:
            o.put<int32_t>(int32_t(v.i));
            break;
        case GgufType::kU64:
            o.put<uint64_t>(v.u);
            break;
        case GgufType::kI64:
            o.put<int64_t>(v.i);
            break;
        case GgufType::kF32:
            o.put<float>(float(v.f));
            break;  // v.f is the float's shortest decimal: exact
        case GgufType::kF64:
            o.put<double>(v.f);
            break;
        case GgufType::kBool:
            o.put<uint8_t>(uint8_t(v.i));
            break;
        default:
            LATTICE_FAIL("GGUF writer: {} is not a scalar type", gguf_type_name(v.type));
    }
}

void put_value(Out& o, const GgufValue& v) {
    if (v.type == GgufType::kString) return o.str(v.s);
    if (v.type != GgufType::kArray) return put_scalar(o, v);
    o.put<uint32_t>(uint32_t(v.elem_type));
    o.put<uint64_t>(v.count);
    if (v.elem_type == GgufType::kString)
        for (const auto& s : v.strs) o.str(s);
    else if (v.elem_type == GgufType::kArray)
        for (const auto& e : v.arr) put_value(o, e);
    else
        o.raw(v.raw);
}

}  // namespace

std::vector<std::string> gguf_tokenizer_keys(const GgufFile& src) {
    std::vector<std::string> keys;
    for (const auto& k : src.keys())
        if (k.rfind("tokenizer.", 0) == 0 || k == "general.architecture" || k == "general.name") keys.push_back(k);
    return keys;
}

void write_gguf_metadata(const std::string& path, const GgufFile& src, const std::vector<std::string>& keys) {
    Out o;
    o.put<uint32_t>(0x46554747u);  // "GGUF" little-endian
    o.put<uint32_t>(3);
    o.put<uint64_t>(0);
    o.put<uint64_t>(keys.size());
    for (const auto& k : keys) {
        const GgufValue* v = src.find(k);
        LATTICE_CHECK(v != nullptr, "{}: no metadata key \"{}\" to copy", src.path(), k);
        o.str(k);
        o.put<uint32_t>(uint32_t(v->type));
        put_value(o, *v);
    }
    while (o.bytes().size() % 32 != 0) o.put<uint8_t>(0);  // the (empty) data section starts aligned
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    LATTICE_CHECK(f.good(), "{}: cannot open for writing", path);
    f.write(o.bytes().data(), std::streamsize(o.bytes().size()));
    f.flush();
    LATTICE_CHECK(f.good(), "{}: write failed", path);
}

}  // namespace lattice
