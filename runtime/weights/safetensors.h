// safetensors reading and writing.
// File layout: u64 little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the data section; offsets are relative to its start (8 + N).
// Every byte is untrusted: header length bounded by the file and kMaxSafetensorsHeaderBytes, its
// JSON nesting, size and tensor count bounded before it is parsed (base/json_limits.h), dtypes from a
// closed set, element counts consistent with the byte ranges, ranges inside the data section and
// non-overlapping. Files are memory-mapped read-only; callers copy what they keep (weights live in
// anonymous memory, DESIGN.md "Numerics").
#pragma once

#include "base/dtype.h"
#include "runtime/weights/dequant.h"  // convert_elements, used with the tensors read here
#include "runtime/weights/sha256.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    int64_t begin = 0;  // byte offset from the start of the file (header included)
    int64_t end = 0;
};

// Real headers are tens of KB (a few hundred tensors per file, ~150 bytes each); the format's own
// reader allows 100 MB, which only serves a file that wants the loader to allocate gigabytes.
constexpr int64_t kMaxSafetensorsHeaderBytes = 16ll << 20;
constexpr int64_t kMaxSafetensorsTensors = 65536;  // per file
constexpr int kMaxSafetensorsJsonDepth = 8;        // {"t": {"shape": [..]}} is 3 deep

// Parses and validates the header of a complete safetensors image of `size` bytes.
// `name` labels errors. Throws Error naming the file and tensor at fault.
std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* data, size_t size, const std::string& name);

// The "__metadata__" object of a safetensors header (string values only, as the format says);
// empty when absent. Call on a header parse_safetensors_header accepted.
std::map<std::string, std::string> parse_safetensors_metadata(const uint8_t* data, size_t size,
                                                              const std::string& name);

// Read-only memory map of a file (MAP_PRIVATE), unmapped on destruction.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Drops this process's page mappings (the page cache keeps the data; a later touch maps it again),
    // so streaming through a large file does not grow the resident set to the file's size.
    void release_pages() const;

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// One safetensors file: mapped, header validated, entries by name.
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);
    const std::string& path() const { return map_.path(); }
    const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
    const SafetensorsEntry* find(const std::string& name) const;
    const uint8_t* bytes(const SafetensorsEntry& e) const { return map_.data() + e.begin; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    size_t size() const { return map_.size(); }
    void release_pages() const { map_.release_pages(); }

private:
    MappedFile map_;
    std::map<std::string, SafetensorsEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

// A tensor to write: contiguous host data of `dtype` and `shape`.
struct TensorToWrite {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    const void* data = nullptr;
};
// Writes a safetensors file atomically (temp file + rename, base/file.h) so a failure never leaves a
// torn file; `path` must be absent or a regular file (never a symlink, FIFO or device, which a
// rename would replace).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

// Streaming writer: the header (every name, dtype, shape, in file order) is written first, then each
// tensor's bytes are appended in that order, one tensor (or several pieces of it) at a time, so a
// file far larger than memory is written holding one tensor. The bytes are hashed as they are
// written (SHA-256 of the whole file, header included). finish() checks every tensor was complete,
// fsyncs and closes; a writer destroyed before finish() leaves a torn file for its caller to remove.
struct SafetensorsSpec {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    int64_t bytes() const;
};
class SafetensorsWriter {
public:
    SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> tensors,
                      const std::map<std::string, std::string>& metadata = {});
    ~SafetensorsWriter();
    SafetensorsWriter(const SafetensorsWriter&) = delete;
    SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
    // Appends bytes of the current tensor (`name` must be it); throws when they overflow it.
    void write(const std::string& name, const void* data, int64_t bytes);
    struct Result {
        int64_t bytes = 0;   // file size
        std::string sha256;  // of the whole file
    };
    Result finish();
    int64_t data_bytes() const { return data_bytes_; }  // sum of the tensors' bytes

private:
    void put(const void* data, size_t bytes);
    std::string path_;
    int fd_ = -1;
    std::vector<SafetensorsSpec> tensors_;
    size_t current_ = 0;     // tensor being written
    int64_t written_ = 0;    // bytes of it so far
    int64_t file_bytes_ = 0;
    int64_t data_bytes_ = 0;
    std::unique_ptr<Sha256> hash_;
};

}  // namespace lattice
