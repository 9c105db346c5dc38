// Byte-level BPE pre-tokenizers: split text into the "words" that BPE merges never cross, exactly as
// each family's Split regex does (Hugging Face tokenizers / llama.cpp), without a regex engine
// (std::regex has no \p{L}/\p{N}). One hand-written matcher per pattern family:
//   kGpt2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//           \s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2  as kLlama3 with \p{N} (one digit per word)
//   kSmolLM every \p{N} isolated first (HF Digits(individual_digits)), then kGpt2 on the rest
// Output: byte ranges of text; they tile text exactly (concatenated they give text back).
#pragma once

#include <string_view>
#include <vector>

namespace lattice {

enum class PreTokenizer { kGpt2, kLlama3, kQwen2, kSmolLM };

const char* pre_tokenizer_name(PreTokenizer p);

// Appends the words of text to out (views into text).
void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& out);

}  // namespace lattice
