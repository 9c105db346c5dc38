// safetensors parsing, mapping, writing (see safetensors.h for the format and the checks).
#include "runtime/weights/safetensors.h"

#include "base/error.h"
#include "base/file.h"
#include "base/json_limits.h"

#include <nlohmann/json.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace lattice {

namespace {
bool parse_dtype(const std::string& s, DType* out) {
    if (s == "F32") *out = DType::kF32;
    else if (s == "F16") *out = DType::kF16;
    else if (s == "BF16") *out = DType::kBF16;
    else if (s == "I8") *out = DType::kI8;
    else if (s == "U8") *out = DType::kU8;
    else if (s == "I32") *out = DType::kI32;
    else if (s == "I64") *out = DType::kI64;
    else return false;
    return true;
}

const char* dtype_tag(DType t) {
    switch (t) {
        case DType::kF32: return "F32";
        case DType::kF16: return "F16";
        case DType::kBF16: return "BF16";
        case DType::kI8: return "I8";
        case DType::kU8: return "U8";
        case DType::kI32: return "I32";
        case DType::kI64: return "I64";
        default: LATTICE_FAIL("safetensors: cannot write dtype {}", dtype_name(t));
    }
}
}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* data, size_t size, const std::string& name) {
    LATTICE_CHECK(size >= 8, "{}: truncated safetensors file ({} bytes, need at least 8 for the header length)", name,
                  size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    LATTICE_CHECK(n <= uint64_t(kMaxSafetensorsHeaderBytes),
                  "{}: safetensors header length {} exceeds the {} byte limit", name, n, kMaxSafetensorsHeaderBytes);
    LATTICE_CHECK(n <= size - 8, "{}: safetensors header length {} goes beyond the end of the file ({} bytes)", name, n,
                  size);
    const int64_t data_start = 8 + int64_t(n);
    const int64_t data_size = int64_t(size) - data_start;
    JsonLimits lim;
    lim.max_depth = kMaxSafetensorsJsonDepth;
    lim.max_top_members = kMaxSafetensorsTensors;
    lim.max_elements = 32 * kMaxSafetensorsTensors;
    lim.member_name = "tensors (__metadata__ included) in the safetensors header";
    check_json_limits(std::string_view(reinterpret_cast<const char*>(data + 8), size_t(n)), name, lim);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(data + 8, data + 8 + n);
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: safetensors header is not valid JSON ({})", name, e.what());
    }
    LATTICE_CHECK(j.is_object(), "{}: safetensors header must be a JSON object", name);
    std::vector<SafetensorsEntry> out;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const std::string& tn = it.key();
        const auto& v = it.value();
        LATTICE_CHECK(v.is_object(), "{}: tensor \"{}\": header entry must be an object", name, tn);
        LATTICE_CHECK(v.contains("dtype"), "{}: tensor \"{}\": missing dtype", name, tn);
        LATTICE_CHECK(v["dtype"].is_string(), "{}: tensor \"{}\": dtype {} is not a string", name, tn,
                      v["dtype"].dump());
        LATTICE_CHECK(v.contains("shape"), "{}: tensor \"{}\": missing shape", name, tn);
        LATTICE_CHECK(v["shape"].is_array(), "{}: tensor \"{}\": shape {} is not a list of integers", name, tn,
                      v["shape"].dump().substr(0, 64));
        LATTICE_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                      "{}: tensor \"{}\": data_offsets must be [begin, end]", name, tn);
        SafetensorsEntry e;
        e.name = tn;
        std::string dt = v["dtype"].get<std::string>();
        LATTICE_CHECK(parse_dtype(dt, &e.dtype), "{}: tensor \"{}\": unknown dtype \"{}\"", name, tn, dt);
        LATTICE_CHECK(v["shape"].size() <= 8, "{}: tensor \"{}\": {} dimensions", name, tn, v["shape"].size());
        int64_t numel = 1;
        for (const auto& d : v["shape"]) {
            LATTICE_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                          "{}: tensor \"{}\": shape entries must be non-negative integers", name, tn);
            int64_t x = d.get<int64_t>();
            LATTICE_CHECK(x <= (int64_t(1) << 40) && (x == 0 || numel <= (int64_t(1) << 40) / x),
                          "{}: tensor \"{}\": shape too large", name, tn);
            numel *= x;
            e.shape.push_back(x);
        }
        const auto& off = v["data_offsets"];
        LATTICE_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                      "{}: tensor \"{}\": data_offsets must be non-negative integers", name, tn);
        uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
        LATTICE_CHECK(b <= en && en <= uint64_t(data_size),
                      "{}: tensor \"{}\": data_offsets [{}, {}] out of range (data section is {} bytes)", name, tn, b,
                      en, data_size);
        LATTICE_CHECK(int64_t(en - b) == numel * dtype_size(e.dtype),
                      "{}: tensor \"{}\": data_offsets span {} bytes but shape x dtype needs {}", name, tn, en - b,
                      numel * dtype_size(e.dtype));
        e.begin = data_start + int64_t(b);
        e.end = data_start + int64_t(en);
        out.push_back(std::move(e));
    }
    std::vector<const SafetensorsEntry*> sorted;
    for (const auto& e : out) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < sorted.size(); ++i)
        LATTICE_CHECK(sorted[i]->begin >= sorted[i - 1]->end || sorted[i - 1]->begin == sorted[i - 1]->end,
                      "{}: tensors \"{}\" and \"{}\" overlap in the data section", name, sorted[i - 1]->name,
                      sorted[i]->name);
    return out;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int64_t size = 0;
    FileDescriptor fd = open_regular_file(path, "safetensors file", &size);
    size_ = size_t(size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
        LATTICE_CHECK(p != MAP_FAILED, "{}: mmap of {} bytes failed ({})", path, size_, std::strerror(errno));
        data_ = static_cast<const uint8_t*>(p);
    }
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
    static const uint8_t kEmpty[1] = {0};
    for (auto& e : parse_safetensors_header(map_.data() ? map_.data() : kEmpty, map_.size(), path))
        entries_.emplace(e.name, std::move(e));
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    int64_t offset = 0;
    for (const auto& t : tensors) {
        int64_t numel = 1;
        for (int64_t d : t.shape) numel *= d;
        int64_t bytes = numel * dtype_size(t.dtype);
        header[t.name] = {{"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string h = header.dump();
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep the data section 8-byte aligned
    AtomicWriter f(path, "safetensors output");
    uint64_t n = h.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xff);
    f.write(len, 8);
    f.write(h);
    for (const auto& t : tensors) {
        int64_t numel = 1;
        for (int64_t d : t.shape) numel *= d;
        f.write(t.data, size_t(numel * dtype_size(t.dtype)));
    }
    f.commit();
}

}  // namespace lattice
