// GGUF parser (see gguf.h for the layout; the typed accessors of a parsed file are gguf_lookup.cpp).
// Hand-written rather than linking ggml: the format is small, and every field here is validated
// against the bytes present before it is used, which is the point of the exercise for untrusted
// files (llama.cpp's reader trusts far more).
// Limits: counts are checked against the remaining bytes times the smallest possible encoding
// of one element, so a lying count fails before any allocation; arrays nest at most kMaxDepth.
#include "runtime/weights/gguf.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/file.h"
#include "runtime/weights/gguf_internal.h"

namespace lattice {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDepth = 4;             // nested array depth
// Arrays of arrays cost ~150 bytes of GgufValue per 12-byte element; cap their total so a hostile
// file cannot make memory use ~12x its size (no real GGUF comes near this).
constexpr uint64_t kMaxNestedArrays = 1 << 20;
constexpr uint64_t kMaxKeyLen = 1 << 16;
constexpr uint64_t kMaxNameLen = 256;
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxAlignment = 1 << 20;

struct GgmlTypeInfo {
    uint32_t id;
    const char* name;
};
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "f32"},      {1, "f16"},    {2, "q4_0"},    {3, "q4_1"},   {4, "q4_2 (removed)"}, {5, "q4_3 (removed)"},
    {6, "q5_0"},     {7, "q5_1"},   {8, "q8_0"},    {9, "q8_1"},   {10, "q2_K"},          {11, "q3_K"},
    {12, "q4_K"},    {13, "q5_K"},  {14, "q6_K"},   {15, "q8_K"},  {16, "iq2_xxs"},       {17, "iq2_xs"},
    {18, "iq3_xxs"}, {19, "iq1_s"}, {20, "iq4_nl"}, {21, "iq3_s"}, {22, "iq2_s"},         {23, "iq4_xs"},
    {24, "i8"},      {25, "i16"},   {26, "i32"},    {27, "i64"},   {28, "f64"},           {29, "iq1_m"},
    {30, "bf16"},    {34, "tq1_0"}, {35, "tq2_0"},  {39, "mxfp4"},
};

std::optional<DType> supported_dtype(uint32_t ggml_type) {
    switch (ggml_type) {
        case 0:
            return DType::kF32;
        case 1:
            return DType::kF16;
        case 30:
            return DType::kBF16;
        case 8:
            return DType::kQ8_0;
        case 2:
            return DType::kQ4_0;
        case 3:
            return DType::kQ4_1;
        case 6:
            return DType::kQ5_0;
        case 7:
            return DType::kQ5_1;
        case 12:
            return DType::kQ4_K;
        case 13:
            return DType::kQ5_K;
        case 14:
            return DType::kQ6_K;
        default:
            return std::nullopt;
    }
}

// Smallest encoding of one value of `t` (used to bound counts before allocating).
uint64_t min_value_bytes(GgufType t) {
    switch (t) {
        case GgufType::kU8:
        case GgufType::kI8:
        case GgufType::kBool:
            return 1;
        case GgufType::kU16:
        case GgufType::kI16:
            return 2;
        case GgufType::kU32:
        case GgufType::kI32:
        case GgufType::kF32:
            return 4;
        case GgufType::kU64:
        case GgufType::kI64:
        case GgufType::kF64:
        case GgufType::kString:
            return 8;
        case GgufType::kArray:
            return 12;
    }
    return 1;
}

bool valid_type(uint32_t t) {
    return t <= uint32_t(GgufType::kF64);
}

// Bounds-checked little-endian reader over [p, end).
class Cursor {
public:
    Cursor(const uint8_t* base, size_t size, const std::string& name) : base_(base), size_(size), name_(name) {}

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const char* what) const {
        LATTICE_CHECK(n <= remaining(), "{}: truncated file: {} needs {} bytes at offset {}, only {} left", name_, what,
                      n, pos_, remaining());
    }
    const uint8_t* ptr() const { return base_ + pos_; }
    void skip(uint64_t n) { pos_ += size_t(n); }  // caller checked need(n)
    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string read_string(const char* what, uint64_t max_len) {
        uint64_t n = read<uint64_t>(what);
        LATTICE_CHECK(n <= max_len, "{}: {} length {} at offset {} exceeds the limit {}", name_, what, n, pos_ - 8,
                      max_len);
        need(n, what);
        std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(n));
        pos_ += size_t(n);
        return s;
    }

private:
    const uint8_t* base_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& name_;
};

using gguf_internal::is_int_type;

// f32 metadata (eps, theta) as the double of its shortest round-trip decimal, so 1e-5f reads as
// 1e-5 and a GGUF config compares equal to the config.json it was converted from.
double f32_to_double_shortest(float x) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), x);
    if (r.ec != std::errc()) return double(x);
    double d = double(x);
    std::from_chars(buf, r.ptr, d);
    return d;
}

// Decodes one scalar of type t (not string/array) from p.
void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
    v.type = t;
    auto get = [p](auto x) {
        std::memcpy(&x, p, sizeof(x));
        return x;
    };
    switch (t) {
        case GgufType::kU8:
            v.u = get(uint8_t());
            break;
        case GgufType::kI8:
            v.i = get(int8_t());
            break;
        case GgufType::kU16:
            v.u = get(uint16_t());
            break;
        case GgufType::kI16:
            v.i = get(int16_t());
            break;
        case GgufType::kU32:
            v.u = get(uint32_t());
            break;
        case GgufType::kI32:
            v.i = get(int32_t());
            break;
        case GgufType::kU64:
            v.u = get(uint64_t());
            break;
        case GgufType::kI64:
            v.i = get(int64_t());
            break;
        case GgufType::kF32:
            v.f = f32_to_double_shortest(get(float()));
            break;
        case GgufType::kF64:
            v.f = get(double());
            break;
        case GgufType::kBool:
            v.i = get(uint8_t());
            break;
        default:
            break;
    }
}

void read_value(Cursor& c, GgufType t, GgufValue& v, const std::string& file, const std::string& key, int depth,
                uint64_t& nested_budget) {
    v.type = t;
    if (t == GgufType::kString) {
        v.s = c.read_string(key.c_str(), std::numeric_limits<uint64_t>::max());
        return;
    }
    if (t != GgufType::kArray) {
        uint64_t n = min_value_bytes(t);
        c.need(n, key.c_str());
        decode_scalar(t, c.ptr(), v);
        if (t == GgufType::kBool)
            LATTICE_CHECK(v.i == 0 || v.i == 1, "{}: key \"{}\": bool value {} is neither 0 nor 1", file, key, v.i);
        c.skip(n);
        return;
    }
    LATTICE_CHECK(depth < kMaxDepth, "{}: key \"{}\": arrays nested deeper than {}", file, key, kMaxDepth);
    uint32_t et = c.read<uint32_t>(key.c_str());
    LATTICE_CHECK(valid_type(et), "{}: key \"{}\": unknown array element type {}", file, key, et);
    uint64_t n = c.read<uint64_t>(key.c_str());
    uint64_t min_bytes = min_value_bytes(GgufType(et));
    LATTICE_CHECK(n <= c.remaining() / min_bytes,
                  "{}: key \"{}\": array length {} of {} cannot fit in the {} bytes left", file, key, n,
                  gguf_type_name(GgufType(et)), c.remaining());
    v.elem_type = GgufType(et);
    v.count = size_t(n);
    if (v.elem_type == GgufType::kString) {
        v.strs.resize(v.count);
        for (auto& s : v.strs) s = c.read_string(key.c_str(), std::numeric_limits<uint64_t>::max());
    } else if (v.elem_type == GgufType::kArray) {
        v.arr.resize(v.count);
        LATTICE_CHECK(n <= nested_budget, "{}: key \"{}\": more than {} nested arrays in the file", file, key,
                      kMaxNestedArrays);
        nested_budget -= n;
        for (auto& e : v.arr) read_value(c, GgufType::kArray, e, file, key, depth + 1, nested_budget);
    } else {
        uint64_t bytes = n * min_bytes;  // fits: checked against remaining above
        c.need(bytes, key.c_str());
        v.raw.assign(c.ptr(), c.ptr() + bytes);
        if (v.elem_type == GgufType::kBool)
            for (size_t k = 0; k < v.count; ++k)
                LATTICE_CHECK(v.raw[k] <= 1, "{}: key \"{}\": bool element {} = {} is neither 0 nor 1", file, key, k,
                              v.raw[k]);
        c.skip(bytes);
    }
}

}  // namespace

const char* gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::kU8:
            return "u8";
        case GgufType::kI8:
            return "i8";
        case GgufType::kU16:
            return "u16";
        case GgufType::kI16:
            return "i16";
        case GgufType::kU32:
            return "u32";
        case GgufType::kI32:
            return "i32";
        case GgufType::kF32:
            return "f32";
        case GgufType::kBool:
            return "bool";
        case GgufType::kString:
            return "string";
        case GgufType::kArray:
            return "array";
        case GgufType::kU64:
            return "u64";
        case GgufType::kI64:
            return "i64";
        case GgufType::kF64:
            return "f64";
    }
    return "unknown";
}

const char* ggml_type_name(uint32_t ggml_type) {
    for (const auto& t : kGgmlTypes)
        if (t.id == ggml_type) return t.name;
    return "unknown";
}

bool GgufValue::is_integer() const {
    return is_int_type(type);
}

GgufValue GgufValue::element(size_t k) const {
    LATTICE_CHECK(type == GgufType::kArray, "GgufValue::element on a {} value", gguf_type_name(type));
    LATTICE_CHECK(k < count, "GgufValue::element {} of an array of {}", k, count);
    if (elem_type == GgufType::kArray) return arr[k];
    GgufValue v;
    if (elem_type == GgufType::kString) {
        v.type = GgufType::kString;
        v.s = strs[k];
        return v;
    }
    decode_scalar(elem_type, raw.data() + k * min_value_bytes(elem_type), v);
    return v;
}

int64_t GgufTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

void GgufFile::release_pages() const {
    if (map_) madvise(map_, size_, MADV_DONTNEED);
}

GgufFile::~GgufFile() {
    if (map_) munmap(map_, size_);
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
    int64_t size = 0;
    FileDescriptor fd = open_regular_file(path, "GGUF file", &size);
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = path;
    f->size_ = size_t(size);
    LATTICE_CHECK(f->size_ > 0, "{}: empty file, not GGUF", path);
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    LATTICE_CHECK(m != MAP_FAILED, "{}: mmap of {} bytes failed ({})", path, f->size_, std::strerror(errno));
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
    f->parse_all();
    return f;
}

std::unique_ptr<GgufFile> GgufFile::parse(const void* data, size_t size, const std::string& name) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    const auto* p = static_cast<const uint8_t*>(data);
    f->copy_.assign(p, p + size);
    f->base_ = f->copy_.data();
    f->size_ = size;
    f->parse_all();
    return f;
}

void GgufFile::parse_all() {
    const std::string& file = path_;
    Cursor c(base_, size_, file);
    LATTICE_CHECK(size_ >= 24, "{}: truncated file: {} bytes is shorter than a GGUF header (24)", file, size_);
    uint32_t magic = c.read<uint32_t>("magic");
    LATTICE_CHECK(magic == kMagic, "{}: bad magic 0x{:08x}, not a GGUF file", file, magic);
    version_ = c.read<uint32_t>("version");
    if (version_ == 0x02000000u || version_ == 0x03000000u) LATTICE_FAIL("{}: big-endian GGUF is not supported", file);
    LATTICE_CHECK(version_ == 2 || version_ == 3, "{}: unsupported GGUF version {} (only 2 and 3)", file, version_);
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("kv count");
    // Smallest kv: key len (8) + type (4) + 1-byte value. Smallest tensor info: 8 + 4 + 8 + 4 + 8.
    LATTICE_CHECK(n_kv <= c.remaining() / 13, "{}: kv count {} cannot fit in the {} bytes left", file, n_kv,
                  c.remaining());
    LATTICE_CHECK(n_tensors <= c.remaining() / 32, "{}: tensor count {} cannot fit in the {} bytes left", file,
                  n_tensors, c.remaining());

    kv_.reserve(size_t(std::min<uint64_t>(n_kv, 1 << 12)));  // grows with what is actually parsed
    uint64_t nested_budget = kMaxNestedArrays;
    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string key = c.read_string("kv key", kMaxKeyLen);
        LATTICE_CHECK(!kv_index_.count(key), "{}: duplicate metadata key \"{}\"", file, key);
        uint32_t t = c.read<uint32_t>("kv type");
        LATTICE_CHECK(valid_type(t), "{}: key \"{}\": unknown value type {}", file, key, t);
        GgufValue v;
        read_value(c, GgufType(t), v, file, key, 0, nested_budget);
        kv_index_[key] = kv_.size();
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const GgufValue* a = find("general.alignment")) {
        LATTICE_CHECK(a->is_integer() && a->type != GgufType::kI8 && a->type != GgufType::kI16 &&
                          a->type != GgufType::kI32 && a->type != GgufType::kI64,
                      "{}: general.alignment has type {}, expected an unsigned integer", file, gguf_type_name(a->type));
        LATTICE_CHECK(a->u > 0 && a->u <= kMaxAlignment && (a->u & (a->u - 1)) == 0,
                      "{}: general.alignment {} is not a power of two in [1, {}]", file, a->u, kMaxAlignment);
        alignment_ = a->u;
    }

    tensors_.reserve(size_t(std::min<uint64_t>(n_tensors, 1 << 16)));
    for (uint64_t k = 0; k < n_tensors; ++k) {
        GgufTensor t;
        t.name = c.read_string("tensor name", kMaxNameLen);
        LATTICE_CHECK(!tensor_index_.count(t.name), "{}: duplicate tensor name \"{}\"", file, t.name);
        uint32_t nd = c.read<uint32_t>("tensor n_dims");
        LATTICE_CHECK(nd >= 1 && nd <= kMaxDims, "{}: tensor \"{}\": {} dimensions (expected 1..{})", file, t.name, nd,
                      kMaxDims);
        int64_t numel = 1;
        for (uint32_t d = 0; d < nd; ++d) {
            uint64_t n = c.read<uint64_t>("tensor dim");
            LATTICE_CHECK(n >= 1 && n <= (uint64_t(1) << 40) && uint64_t(numel) <= (uint64_t(1) << 50) / n,
                          "{}: tensor \"{}\": dimension {} = {} is out of range", file, t.name, d, n);
            t.ne.push_back(int64_t(n));
            numel *= int64_t(n);
        }
        t.ggml_type = c.read<uint32_t>("tensor type");
        auto dt = supported_dtype(t.ggml_type);
        LATTICE_CHECK(dt.has_value(),
                      "{}: tensor \"{}\": ggml type {} ({}) is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, "
                      "q5_1, q4_K, q5_K, q6_K)",
                      file, t.name, t.ggml_type, ggml_type_name(t.ggml_type));
        t.dtype = *dt;
        LATTICE_CHECK(t.ne[0] % dtype_block_elems(t.dtype) == 0,
                      "{}: tensor \"{}\": innermost dimension {} is not a multiple of the {} block size {}", file,
                      t.name, t.ne[0], dtype_name(t.dtype), dtype_block_elems(t.dtype));
        t.nbytes = uint64_t(dtype_bytes(t.dtype, numel));
        t.offset = c.read<uint64_t>("tensor offset");
        LATTICE_CHECK(t.offset % alignment_ == 0, "{}: tensor \"{}\": offset {} is not a multiple of the alignment {}",
                      file, t.name, t.offset, alignment_);
        tensor_index_[t.name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }

    uint64_t end = c.pos();
    data_offset_ = (end + alignment_ - 1) / alignment_ * alignment_;
    if (!tensors_.empty())
        LATTICE_CHECK(data_offset_ <= size_, "{}: data section at offset {} lies past the end of the file ({} bytes)",
                      file, data_offset_, size_);
    uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
    for (const auto& t : tensors_) {
        LATTICE_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
                      "{}: tensor \"{}\": data [{}, {}) of the data section lies beyond the end of the file "
                      "(data section {} bytes)",
                      file, t.name, t.offset, t.offset + t.nbytes, data_size);
    }
    std::vector<const GgufTensor*> order;
    order.reserve(tensors_.size());
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensor* a = order[k - 1];
        const GgufTensor* b = order[k];
        LATTICE_CHECK(a->offset + a->nbytes <= b->offset, "{}: tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap",
                      file, a->name, a->offset, a->offset + a->nbytes, b->name, b->offset, b->offset + b->nbytes);
    }
    if (!tensors_.empty()) check_regions(order, end);
}

// Every byte accounted for: the padding after the tensor infos is zeros, the tensors tile the data
// section with gaps shorter than the alignment, and nothing longer than that follows the last one.
// A file whose tensor count was lowered fails here: the left-over tensor infos would otherwise be
// read as padding (or shift the data section) and the file would run as a different model.
void GgufFile::check_regions(const std::vector<const GgufTensor*>& order, uint64_t infos_end) const {
    const std::string& file = path_;
    for (uint64_t p = infos_end; p < data_offset_; ++p)
        LATTICE_CHECK(base_[p] == 0,
                      "{}: byte {} between the tensor infos (end at {}) and the data section (at {}) is not zero "
                      "padding: the tensor count ({}) does not describe the file",
                      file, p, infos_end, data_offset_, tensors_.size());
    uint64_t prev_end = 0;
    std::string prev = "the start of the data section";
    for (const GgufTensor* t : order) {
        LATTICE_CHECK(t->offset - prev_end < alignment_,
                      "{}: {} unaccounted bytes in the data section between {} and tensor \"{}\" (offset {}): the "
                      "tensor count ({}) or offsets do not describe the file",
                      file, t->offset - prev_end, prev, t->name, t->offset, tensors_.size());
        prev_end = t->offset + t->nbytes;
        prev = "tensor \"" + t->name + "\"";
    }
    const uint64_t trailing = size_ - data_offset_ - prev_end;
    LATTICE_CHECK(trailing < alignment_,
                  "{}: {} unaccounted bytes after the last tensor ({}): the tensor count ({}) or offsets do not "
                  "describe the file",
                  file, trailing, prev, tensors_.size());
}

}  // namespace lattice
