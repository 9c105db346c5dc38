// manifest.json of a converted checkpoint (written by `lattice convert`, runtime/converter/convert.h):
//   {"format": "lattice-converted", "format_version": 1, "writer": "lattice ...", "source": "...",
//    "config": {the model's config in Hugging Face config.json form},
//    "layout": {"tp": T, "pp": P, "stage_layers": [layers of stage 0, ..., of stage P-1]},
//    "quantization": {"mode": "none" | "w8a16" | "w8a8" | "w4a16" | "w4a8", "quant_head": bool, "scheme": "...",
//                     "smooth": "factors.safetensors" | null, "smooth_sha256": hex | null},
//    "files": [{"path": "rank-00000-of-00004.safetensors", "kind": "rank", "rank": 0,
//               "bytes": N, "sha256": "64 hex"}, ...,
//              {"path": "tokenizer.json", "kind": "tokenizer", "bytes": N, "sha256": "..."}],
//    "manifest_sha256": "64 hex"}
// "manifest_sha256" seals the manifest's own content (the per-file hashes cover only the other files):
// the SHA-256 of its canonical form, the parsed JSON without that field dumped compactly (nlohmann's
// dump: keys sorted, no spaces, numbers in shortest round-trip form). Reformatting the file keeps the
// seal; a changed value (hidden_size, a layer count, vocab, quant mode, a file's hash) breaks it and
// every load refuses the manifest, naming it. A manifest without the field (written before the seal
// existed, or with the field deleted for a deliberate edit) loads, and `lattice verify` reports its
// content as unchecked (Manifest::sealed false) rather than intact.
// World rank r (= pp_rank * tp + tp_rank, parallel/world_config.h) reads only its rank file.
// The manifest is untrusted input: parse_manifest checks every field (types, ranges, file names that
// stay inside the folder, exactly one file per rank, stage layers that add up to the model's) and
// names the manifest and the field at fault. A manifest of another format version is refused with
// its version named, never guessed at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/arch/config.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

inline constexpr char kConvertedFormat[] = "lattice-converted";
inline constexpr int kConvertedFormatVersion = 1;
inline constexpr int64_t kMaxManifestBytes = int64_t(16) << 20;
// The per-output-channel scales of int8 tensor "X" are the f32 [rows] tensor "X" + kScaleSuffix.
inline constexpr char kScaleSuffix[] = "_scale";
// A 4-bit linear "X" [n, k] in groups of G (kernels/common/int4.h; a 4-bit run's every linear but an 8-bit
// LM head) is stored as its unpacked form, nothing re-rounded:
//   "X"       u8  [n, k_padded / 2]  nibbles, int4.h's order        "X_d"    f16 [n, groups]  scales
//   "X_m"     f16 [n, groups]        minimums (kind affine only)    "X_z"    u8  [n, groups]  zero points
//   "X_perm"  i32 [k]                act-order permutation (only when the source has one)
// and the rank file's header metadata "int4:X" = "k=K group=G kind=offset8|zero-point|affine" (k is not
// implied by the padded nibbles). The reader (converted_source.cpp) checks every shape against it.
inline constexpr char kInt4MetaPrefix[] = "int4:";
inline constexpr char kInt4ScaleSuffix[] = "_d";
inline constexpr char kInt4MinSuffix[] = "_m";
inline constexpr char kInt4ZeroSuffix[] = "_z";
inline constexpr char kInt4PermSuffix[] = "_perm";
// The header metadata value of a 4-bit tensor, and its parse (false when malformed).
std::string int4_meta_value(int64_t k, int64_t group, Int4Kind kind);
bool parse_int4_meta_value(const std::string& v, int64_t* k, int64_t* group, Int4Kind* kind);

struct ManifestFile {
    std::string path;  // name inside the folder (no '/')
    std::string kind;  // "rank" or "tokenizer"
    int rank = -1;     // kind "rank": the world rank that reads it
    int64_t bytes = 0;
    std::string sha256;  // 64 lowercase hex
};

struct Manifest {
    int format_version = kConvertedFormatVersion;
    std::string writer, source;
    ModelConfig config;
    int tp = 1, pp = 1;
    std::vector<int64_t> stage_layers;
    std::string quant = "none";
    bool quant_head = false;
    std::string smooth, smooth_sha256;  // "" when none
    std::string kv_cache_dtype = "auto";  // "defaults": what a run uses unless told otherwise (--kv-cache-dtype)
    std::vector<ManifestFile> files;
    bool sealed = false;  // parsed: had a manifest_sha256 (and it matched, or the parse would have thrown)

    int world() const { return tp * pp; }
    const ManifestFile& rank_file(int rank) const;  // throws Error when absent
    PreparedLayout layout(const std::string& folder, int rank) const;
};

// "rank-00003-of-00004.safetensors"
std::string rank_file_name(int rank, int world);

// The config in Hugging Face config.json form; parse_hf_config of it gives back every field.
std::string hf_config_json(const ModelConfig& c);

std::string manifest_json(const Manifest& m);  // pretty-printed, newline-terminated, sealed
// Every field checked, then the seal. A seal that does not match throws Error naming `source`, unless
// `seal_problem` is given: then the mismatch is written there ("" when it matches) and the manifest
// returned (`lattice verify` reports it beside the other files' verdicts).
Manifest parse_manifest(const std::string& text, const std::string& source, std::string* seal_problem = nullptr);
Manifest read_manifest(const std::string& folder, std::string* seal_problem = nullptr);  // folder/manifest.json

}  // namespace lattice
