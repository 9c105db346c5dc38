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

void MappedFile::release_pages() const {
    if (data_) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
    static const uint8_t kEmpty[1] = {0};
    const uint8_t* data = map_.data() ? map_.data() : kEmpty;
    for (auto& e : parse_safetensors_header(data, map_.size(), path)) entries_.emplace(e.name, std::move(e));
    metadata_ = parse_safetensors_metadata(data, map_.size(), path);
}

std::map<std::string, std::string> parse_safetensors_metadata(const uint8_t* data, size_t size,
                                                              const std::string& name) {
    LATTICE_CHECK(size >= 8, "{}: truncated safetensors file", name);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    LATTICE_CHECK(n <= uint64_t(kMaxSafetensorsHeaderBytes) && n <= size - 8, "{}: bad safetensors header length",
                  name);
    std::map<std::string, std::string> out;
    nlohmann::json j = nlohmann::json::parse(data + 8, data + 8 + n, nullptr, false);
    if (!j.is_object() || !j.contains("__metadata__")) return out;
    const auto& m = j["__metadata__"];
    LATTICE_CHECK(m.is_object(), "{}: safetensors \"__metadata__\" must be an object", name);
    for (auto it = m.begin(); it != m.end(); ++it) {
        LATTICE_CHECK(it.value().is_string(), "{}: safetensors __metadata__[\"{}\"] must be a string", name,
                      it.key());
        out[it.key()] = it.value().get<std::string>();
    }
    return out;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
}

int64_t SafetensorsSpec::bytes() const {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    return numel * dtype_size(dtype);
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)), hash_(std::make_unique<Sha256>()) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    int64_t offset = 0;
    for (const auto& t : tensors_) {
        LATTICE_CHECK(!header.contains(t.name) && t.name != "__metadata__", "{}: tensor \"{}\" written twice", path,
                      t.name);
        for (int64_t d : t.shape) LATTICE_CHECK(d >= 0, "{}: tensor \"{}\" has a negative dimension", path, t.name);
        const int64_t bytes = t.bytes();
        header[t.name] = {{"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    data_bytes_ = offset;
    std::string h = header.dump();
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep the data section 8-byte aligned
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    LATTICE_CHECK(fd_ >= 0, "{}: cannot open for writing ({})", path, std::strerror(errno));
    const uint64_t n = h.size();
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t((n >> (8 * i)) & 0xff);
    put(len, 8);
    put(h.data(), h.size());
    while (current_ < tensors_.size() && tensors_[current_].bytes() == 0) ++current_;
}

SafetensorsWriter::~SafetensorsWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::put(const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t left = bytes;
    while (left > 0) {
        const ssize_t w = ::write(fd_, p, std::min<size_t>(left, size_t(1) << 30));
        if (w < 0 && errno == EINTR) continue;
        LATTICE_CHECK(w > 0, "{}: write failed after {} bytes ({})", path_, file_bytes_, std::strerror(errno));
        p += w;
        left -= size_t(w);
        file_bytes_ += w;
    }
    hash_->update(data, bytes);
}

void SafetensorsWriter::write(const std::string& name, const void* data, int64_t bytes) {
    LATTICE_CHECK(fd_ >= 0, "{}: write after finish", path_);
    LATTICE_CHECK(current_ < tensors_.size() && tensors_[current_].name == name,
                  "{}: tensor \"{}\" written out of order (expected \"{}\")", path_, name,
                  current_ < tensors_.size() ? tensors_[current_].name : std::string("nothing more"));
    const int64_t want = tensors_[current_].bytes();
    LATTICE_CHECK(bytes >= 0 && written_ + bytes <= want, "{}: tensor \"{}\": {} more bytes overflow its {} bytes",
                  path_, name, bytes, want - written_);
    put(data, size_t(bytes));
    written_ += bytes;
    if (written_ == want) {
        written_ = 0;
        ++current_;
        while (current_ < tensors_.size() && tensors_[current_].bytes() == 0) ++current_;
    }
}

SafetensorsWriter::Result SafetensorsWriter::finish() {
    LATTICE_CHECK(fd_ >= 0, "{}: finish called twice", path_);
    LATTICE_CHECK(current_ == tensors_.size(), "{}: finished with tensor \"{}\" incomplete ({} bytes written)", path_,
                  current_ < tensors_.size() ? tensors_[current_].name : "", written_);
    LATTICE_CHECK(::fsync(fd_) == 0, "{}: fsync failed ({})", path_, std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    LATTICE_CHECK(rc == 0, "{}: close failed ({})", path_, std::strerror(errno));
    return {file_bytes_, sha256_hex(hash_->finish())};
}

// Harden's output rules (base/file.h): the target must be a regular file or absent, the data goes to a
// private temporary file renamed over it only when complete.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
    check_output_path(path, "safetensors output");
    std::vector<SafetensorsSpec> specs;
    for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    try {
        SafetensorsWriter w(tmp, specs);
        for (size_t i = 0; i < tensors.size(); ++i) w.write(tensors[i].name, tensors[i].data, specs[i].bytes());
        w.finish();
        check_output_path(path, "safetensors output");
        LATTICE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "safetensors output {}: rename from {} failed ({})",
                      path, tmp, std::strerror(errno));
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
}

}  // namespace lattice
