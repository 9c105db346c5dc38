// A GGUF file of metadata only: some key/values of an existing GGUF, no tensors. `lattice convert`
// keeps a GGUF source's vocabulary this way (tokenizer.gguf in the converted folder) so the
// tokenizer loader reads it exactly as it reads the original (runtime/tokenizer/load_gguf.cpp).
// Layout written: "GGUF" | u32 3 | u64 0 tensors | u64 n_kv | kv* (same encoding as read, see gguf.h).
#pragma once

#include <string>
#include <vector>

#include "runtime/weights/gguf.h"

namespace lattice {

// Keys of `src` to keep for a tokenizer: every "tokenizer.*" key and general.architecture / name.
std::vector<std::string> gguf_tokenizer_keys(const GgufFile& src);

// Writes `keys` of `src` (in that order) to `path`; throws Error naming a missing key or a failed write.
void write_gguf_metadata(const std::string& path, const GgufFile& src, const std::vector<std::string>& keys);

}  // namespace lattice
