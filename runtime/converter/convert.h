// convert_checkpoint: `lattice convert`'s work. Turns a checkpoint (HF, GGUF, random) into a folder
// of one safetensors file per rank of a tp x pp layout, each holding exactly the tensors that rank
// loads (runtime/model/rank_weights.h: sharded, q|k|v and gate|up fused, SmoothQuant folded in) and,
// for int8 modes, already quantized (i8 [n, k] + f32 scales "<name>_scale" [n], the backends' own
// formula); for 4-bit modes (w4a8, w4a16) each linear in its 4-bit parts (runtime/weights/manifest.h): the
// source's own groups where the rank reads it in 4 bits (GGUF Q4 blocks, AWQ / GPTQ), else quantized by the
// backends' own function (kernels/common/int4_quantize.h), the LM head int8 unless the source's is 4-bit;
// plus manifest.json (runtime/weights/manifest.h) and the tokenizer files (copied from a
// HF folder; a GGUF's vocabulary as a metadata-only tokenizer.gguf). With a LoRA adapter (lora_path) the
// weights are the base's with the adapter merged in (W + s B A in float64, before anything else).
//
// Streaming: one tensor at a time is read, quantized, written and hashed, and the source's file
// pages are released after each, so peak memory stays near the largest fused tensor (a few times
// its size), not the model's. Atomic: everything is written into <parent>/.<name>.partial-<pid>
// and renamed to `out` (which must not exist) only after the manifest, the last file, is complete
// and synced; an interrupted conversion leaves at most a hidden partial folder without a manifest,
// which no loader accepts. Collective: every rank of `world` calls it; world rank r writes rank
// files r, r + W, r + 2W ... (W = world size, any W >= 1), rank 0 gathers every file's size and
// SHA-256 and writes the manifest. A failure on any rank fails every rank (no hang) and removes the
// partial folder. The ranks must share the output file system.
// This room (runtime/converter/) sits above the model and the weights, beside the builder (neither
// includes the other); which tensors a rank holds is runtime/model/rank_weights.h's, so a converted
// folder and a load of the original agree by construction.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/weights/manifest.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

struct ConvertProgress {
    int64_t bytes_done = 0, bytes_total = 0;  // tensor bytes of this process's files
    int files_done = 0, files_total = 0;      // this process's files
    std::string file;                         // file being written
};

struct ConvertOptions {
    std::string out;  // folder to create; must not exist
    int tp = 1, pp = 1;
    std::vector<int64_t> pp_layers;  // layers per stage; empty: balanced (parallel/world_config.h)
    QuantMode quant = QuantMode::kNone;
    bool quant_head = false;  // quantized LM head too (int8 modes; 8-bit in 4-bit modes unless stored in 4 bits)
    std::string kv_cache_dtype = "auto";  // the manifest's default KV cache for runs (--kv-cache-dtype)
    std::string smooth_path;  // SmoothQuant factors to fold in ("" none)
    std::string source_path;  // where the tokenizer files are: HF folder or .gguf ("" none)
    // A LoRA adapter (PEFT folder or GGUF LoRA file) merged into the weights before they are sharded,
    // folded and quantized (runtime/converter/lora_merge.h); "" none. Its name is lora_name (the path's
    // last component when empty); its scale times lora_scale.
    std::string lora_path, lora_name;
    double lora_scale = 1.0;
    std::string writer = "lattice";
    // Called by each rank after every tensor it wrote (tests use it to interrupt a conversion).
    std::function<void(const ConvertProgress&)> on_progress;
    // Polled after every tensor: true stops the conversion as a failure (the partial folder is
    // removed, nothing is left half-written). launch/ sets it from SIGTERM / SIGINT / SIGUSR1.
    std::function<bool()> interrupted;
};

struct ConvertResult {
    std::string folder;         // the finished folder (== out)
    Manifest manifest;          // complete on rank 0; others hold the layout and their own files
    int64_t bytes_written = 0;  // by this rank
    double seconds = 0;
};

ConvertResult convert_checkpoint(const TensorSource& src, const ConvertOptions& opt, Communicator& world);

}  // namespace lattice
