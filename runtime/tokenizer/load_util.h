// Helpers shared by the tokenizer loaders (internal to runtime/tokenizer).
#pragma once

#include <string>

#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

inline constexpr size_t kMaxTokenizerFileBytes = size_t(256) << 20;

// Whole file, refusing files over `limit` bytes. Throws Error naming the path.
std::string tokenizer_read_file(const std::string& path, size_t limit);

// Applies a Hugging Face tokenizer_config.json (bos_token, eos_token, add_bos_token, chat_template).
void apply_tokenizer_config(TokenizerSpec& spec, const std::string& config_path);

// Fills what a format may leave out: end-of-generation ids from well-known token texts.
void finish_spec(TokenizerSpec& spec);

}  // namespace lattice
