// The typed accessors of a parsed GGUF file (gguf.h): metadata lookups by key (has, find, keys, the
// scalar *_value and *_array getters) and tensor lookups by name. The parse itself is gguf.cpp.
// Invariants: a missing key reads as nullopt (scalars) or throws (arrays, tensor()); a key present
// with another type is an Error naming the file, the key, the wanted and the found type; integers are
// range-checked into the requested width, never wrapped.
#include <limits>

#include "base/error.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/gguf_internal.h"

namespace lattice {

using gguf_internal::is_int_type;

bool GgufFile::has(const std::string& key) const {
    return kv_index_.count(key) != 0;
}

const GgufValue* GgufFile::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

std::vector<std::string> GgufFile::keys() const {
    std::vector<std::string> out;
    out.reserve(kv_.size());
    for (const auto& kv : kv_) out.push_back(kv.first);
    return out;
}

namespace {
[[noreturn]] void wrong_type(const std::string& file, const std::string& key, const GgufValue& v,
                             const char* expected) {
    if (v.type == GgufType::kArray)
        LATTICE_FAIL("{}: key \"{}\" is an array of {}, expected {}", file, key, gguf_type_name(v.elem_type), expected);
    LATTICE_FAIL("{}: key \"{}\" has type {}, expected {}", file, key, gguf_type_name(v.type), expected);
}

int64_t to_int64(const GgufValue& v, const std::string& file, const std::string& key) {
    if (v.type == GgufType::kU8 || v.type == GgufType::kU16 || v.type == GgufType::kU32 || v.type == GgufType::kU64) {
        LATTICE_CHECK(v.u <= uint64_t(std::numeric_limits<int64_t>::max()), "{}: key \"{}\": value {} overflows int64",
                      file, key, v.u);
        return int64_t(v.u);
    }
    return v.i;
}
}  // namespace

std::optional<std::string> GgufFile::string_value(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kString) wrong_type(path_, key, *v, "string");
    return v->s;
}

std::optional<int64_t> GgufFile::int_value(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer()) wrong_type(path_, key, *v, "an integer");
    return to_int64(*v, path_, key);
}

std::optional<double> GgufFile::float_value(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_float()) return v->f;
    if (!v->is_integer()) wrong_type(path_, key, *v, "a number");
    return double(to_int64(*v, path_, key));
}

std::optional<bool> GgufFile::bool_value(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kBool) wrong_type(path_, key, *v, "bool");
    return v->i != 0;
}

std::optional<size_t> GgufFile::array_size(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kArray) wrong_type(path_, key, *v, "an array");
    return v->count;
}

std::vector<std::string> GgufFile::string_array(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return {};
    if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) wrong_type(path_, key, *v, "array of string");
    return v->strs;
}

std::vector<float> GgufFile::float_array(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return {};
    if (v->type != GgufType::kArray || (v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64))
        wrong_type(path_, key, *v, "array of f32/f64");
    std::vector<float> out(v->count);
    for (size_t k = 0; k < v->count; ++k) out[k] = float(v->element(k).f);
    return out;
}

std::vector<int32_t> GgufFile::int_array(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return {};
    if (v->type != GgufType::kArray || !is_int_type(v->elem_type)) wrong_type(path_, key, *v, "array of integers");
    std::vector<int32_t> out(v->count);
    for (size_t k = 0; k < v->count; ++k) {
        int64_t x = to_int64(v->element(k), path_, key);
        LATTICE_CHECK(x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(),
                      "{}: key \"{}\": element {} = {} overflows int32", path_, key, k, x);
        out[k] = int32_t(x);
    }
    return out;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
    const GgufTensor* t = find_tensor(name);
    LATTICE_CHECK(t != nullptr, "{}: no tensor \"{}\"", path_, name);
    return *t;
}

}  // namespace lattice
