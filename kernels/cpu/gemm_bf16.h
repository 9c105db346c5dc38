// Float GEMM in bf16 pairs, the CPU backend's `--dtype bf16` math (CpuBackendOptions::bf16): y[m, n] =
// bf16(x) . W^T, W [n, k] rounded to bf16 (nearest even; exact for a bf16 checkpoint) and packed once at load.
// Each call rounds the rows of x to bf16 once; each product of two bf16 is exact in f32 and vdpbf16ps
// (AVX512_BF16: Zen 4, Cooper Lake, Sapphire Rapids) adds 32 of them a register into f32 accumulators, where the
// widened math of gemm_f32.h runs two FMAs (and two shifts) for the same 32. That is the step below AMX-BF16, on
// the same numerics; on Xeons with AMX oneDNN's bf16 matmul uses the tile units (bench_gemm_bf16 runs it beside
// this kernel in the same run).
//
// Layout (PackedBf16): panels of 16 output channels, each [ceil(k / 2)][16][2]: the pair (2q, 2q + 1) of the 16
// channels in one 64-byte line, so that one aligned zmm load feeds 16 lanes (the channels) and the pair of x is
// a broadcast: no horizontal sums, 64 bytes of weights per 32 multiply-adds of each row. Channels past n and the
// element past an odd k are zeros.
// Tiles: MR (<= 6) rows of x by NB (<= 4) panels, 24 accumulators. Decode (m <= 6) streams each panel once with
// software prefetch into L2; prefill runs the rows of x over each group of NB panels while it is in L2.
//
// Why lattice's own kernel, with oneDNN's bf16 matmul measured beside it (bench_gemm_bf16, same run; Zen 4, one
// core): this kernel 221-228 GFLOP/s at m = 128 and 512 on 4096 x 4096 and 11008 x 4096 (96-97% of vdpbf16ps'
// register rate), oneDNN 2.6.3 (brg:avx512_core_bf16) 218-222, at m = 16 210-214 against 165-185; and oneDNN
// takes no f32 rows with bf16 weights (x converted first) and wants its own blocked copy of the weights per
// primitive, beside the packed panels decode streams. On Xeons with AMX its tile kernels (AMX-BF16) have several
// times vdpbf16ps' rate, so there, by the int8 GEMM's provider policy (int8_uses_onednn: the amx level by
// default), the GEMMs at m >= 16 run oneDNN's matmul on a copy of the weights (PackedBf16::onednn); not measured
// on AMX yet (no AMX on the machines so far; bench_gemm_bf16 prints what oneDNN picks).
//
// Numerics: every output is one fixed sequence of operations whatever m, the tile or the thread split: its lane
// adds the pairs q = 0, 1, .. in order (vdpbf16ps: x[2q] w[2q] and x[2q + 1] w[2q + 1] into the lane). So a
// prompt's rows equal the same rows computed one token at a time, bit for bit. vdpbf16ps and the rounding of x
// (vcvtne2ps2bf16) treat denormal inputs as zero, flush denormal results and round to nearest even whatever MXCSR
// says.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/onednn_int8.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice {

inline constexpr int64_t kBf16PanelN = 16;

struct PackedBf16 {
    std::vector<uint16_t, AlignedAllocator64<uint16_t>> data;  // [n_panels][pairs][16][2]
    int64_t n = 0, k = 0;
    int64_t pairs = 0;     // ceil(k / 2)
    int64_t n_panels = 0;  // ceil(n / 16)
    std::shared_ptr<const OnednnBf16> onednn;  // oneDNN's copy (m >= kInt8OnednnMinM), or null
    int64_t panel_elems() const { return pairs * kBf16PanelN * 2; }
    const uint16_t* panel(int64_t p) const { return data.data() + p * panel_elems(); }
    int64_t bytes() const {
        return int64_t(data.size() * sizeof(uint16_t)) + (onednn ? onednn_bf16_bytes(*onednn) : 0);
    }
};

// Whether the bf16-pair GEMM runs at `isa` on this CPU: vector_level(isa) is avx512 and the CPU has AVX512_BF16.
bool gemm_bf16_dot_available(IsaLevel isa);
inline bool gemm_bf16_dot_available() {
    return gemm_bf16_dot_available(detect_isa());
}

// w [n, k] row-major f32, f16 or bf16, rounded to bf16 (nearest even, NaN kept NaN) and packed; the rows split
// among the pool's threads when one is given. Where the provider policy gives the GEMMs at m >= 16 to oneDNN
// (int8_uses_onednn at this ISA level: by default the amx level, where oneDNN's tile kernels run AMX-BF16), a
// oneDNN copy too (onednn_int8.h); its rows equal the pairs' to f32 rounding, not bit for bit, so at that level
// a prompt's rows and the same tokens one at a time differ by rounding.
PackedBf16 pack_bf16_weights(const void* w, DType wt, int64_t n, int64_t k, ThreadPool* pool = nullptr);

// The bytes pack_bf16_weights' panels of an [n, k] matrix take (without a oneDNN copy).
inline int64_t packed_bf16_bytes(int64_t n, int64_t k) {
    return (n + kBf16PanelN - 1) / kBf16PanelN * ((k + 1) / 2) * kBf16PanelN * 2 * int64_t(sizeof(uint16_t));
}

// y[m, n] = bf16(x) . W^T (see above); x [m, k] f32. Weights packed run the pairs whatever the ISA override since
// (as packed int8 panels run their level: isa.h); throws Error on a CPU without AVX-512 and AVX512_BF16.
void gemm_bf16_dot(const float* x, int64_t m, const PackedBf16& w, float* y, ThreadPool& pool);

}  // namespace lattice
