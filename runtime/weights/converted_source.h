// A converted checkpoint (`lattice convert`, runtime/converter/convert.h) read back: a folder with
// manifest.json (runtime/weights/manifest.h), one safetensors file per rank and the tokenizer files.
//
// open_converted_model maps only the calling rank's file. Before anything is mapped it checks that
// the folder was converted for the layout the caller runs (else an Error naming the layout the
// folder holds), that the rank's file exists and has the manifest's size (always: a truncated or
// replaced file is caught at every start), and, with `verify`, its SHA-256. The file's header
// metadata must name the same format, layout and rank (a file copied over another rank's is caught
// even when the sizes agree). Tensors (rank-local, see runtime/model/rank_weights.h for the names):
//   float tensors as the converter kept them (f32 / f16 / bf16), read() converts like any source;
//   int8 linears "X" i8 [n, k] with f32 scales "X_scale" [n]; read() of an i8 tensor only as i8;
//   4-bit linears "X" (u8 [n, k], TensorInfo::int4_group > 0) from their parts and the header's "int4:X"
//   metadata (manifest.h), every shape checked at open; read_int4 gives the whole tensor (its values checked
//   as every 4-bit load checks them, errors naming the tensor), read() refuses it.
// Every load checks the manifest's seal (manifest.h: its own content, cheap) and refuses an edited
// manifest naming it; an unsealed one (an older conversion) loads, with a warning under `verify`.
// verify_converted checks the manifest's seal first, then every file the manifest lists (size, then
// SHA-256) in parallel threads, and reports each verdict; `lattice verify` prints them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/weights/manifest.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

// The layout and world rank a caller runs (world rank = pp_rank * tp + tp_rank).
struct ConvertedRank {
    int tp = 1, pp = 1, rank = 0;
};

bool is_converted_folder(const std::string& path);  // a directory holding manifest.json

std::unique_ptr<TensorSource> open_converted_model(const std::string& folder, const ConvertedRank& want,
                                                   bool verify = false);

struct FileVerdict {
    std::string path;  // inside the folder
    bool ok = false;
    std::string problem;  // why not ok: "missing", "N bytes, the manifest says M", "SHA-256 ... differs ..."
};
struct ConvertedVerdict {
    // "manifest.json": ok when its seal matches its content; not ok with the mismatch as the problem,
    // or (sealed false) with no seal to check: then neither intact nor corrupt, unchecked.
    FileVerdict manifest;
    bool sealed = false;
    std::vector<FileVerdict> files;  // every file the manifest lists, in manifest order
    bool ok() const;                 // a sealed, matching manifest and every file intact
};
// `threads` <= 0: one per core (at most 8). `on_bytes` (optional, called from the worker threads)
// sees each chunk hashed. Throws Error only when the manifest is missing or a field of it invalid
// (an edited but valid manifest is a verdict: its files are still checked against what it lists).
ConvertedVerdict verify_converted(const std::string& folder, int threads = 0,
                                  const std::function<void(int64_t)>& on_bytes = {});

}  // namespace lattice
