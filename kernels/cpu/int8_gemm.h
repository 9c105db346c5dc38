// INT8 GEMMs for the CPU backend: W8A8 (int8 x int8 -> int32, exact) and W8A16 (int8 weights, f32
// activations), with a scalar reference and AVX2 / AVX-VNNI / AVX-512 VNNI paths chosen at run time.
//
// Scheme (docs/quantization.md): weights symmetric per output channel, q = round(w / s),
// s = max|w_row| / 127; W8A8 activations per token (row), dynamic and symmetric (kernels/common/quantize.h).
//
// Packed layout (PackedInt8, prepared once at load): output channels in panels of 16 (n padded to a
// multiple of 16 with zero rows), k padded to a multiple of 4 with zeros. Panel p is contiguous,
// k_padded * 16 bytes; inside it, k-group g (4 consecutive k) is 64 bytes:
//     data[p * 16 * k_padded + g * 64 + j * 4 + t] = q[16 p + j, 4 g + t]   (j < 16, t < 4)
// i.e. one zmm per k-group holds 16 channels x 4 k, the operand form of vpdpbusd; ymm paths read
// the two 32-byte halves (channels 0..7, 8..15). One layout serves every ISA, so `isa` only picks
// the kernel. VNNI paths use vpdpbusd's u8 x s8 form on a + 128 and subtract 128 * col_sums[n];
// the AVX2 path sign-extends to int16 and uses vpmaddwd. Every path is exact in int32 for
// k <= kInt8MaxK (|sum| <= 128 * 128 * k < 2^31; VNNI intermediates wrap mod 2^32 and the
// correction restores the exact value).
//
// Threads split N (panels), never K, in contiguous chunks claimed from a shared counter
// (ThreadPool::parallel_chunks); results do not depend on the thread count. Outputs must not alias inputs. The
// gemm calls keep a thread_local activation scratch of the calling thread (m * k_padded bytes, grown on demand).
// ISA: the level is the one decision of isa.h, taken when the weights are packed (PackedInt8::isa). The amx level
// runs W8A8 / s8s8 at m >= kInt8AmxMinM on AMX-INT8 tiles over the same panels (int8_gemm_amx_avx512.cpp: a
// panel's k-group is a tile row; exact int32, so the same bits) and everything else on the avx512 kernels;
// avxvnni's W8A16 runs the avx2 one.
// Provider (Int8Provider): at m >= kInt8OnednnMinM the W8A8 / s8s8 GEMMs run oneDNN's matmul instead where
// the weights carry a oneDNN copy (PackedInt8::onednn, made at packing when int8_uses_onednn(isa)): by
// default at the amx level only, where oneDNN's tile kernels measured 2.8 TOP/s against the VNNI kernel's 1.1
// (onednn_int8.h) and lattice's own tiles have not been measured yet (`own` runs them; the default stays
// oneDNN until a machine with AMX compares the two). Decode (m < kInt8OnednnMinM) always runs the kernels here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice {

// Largest k for which every path is exact in int32.
inline constexpr int64_t kInt8MaxK = 131071;
// Smallest m the oneDNN provider takes (below it, the GEMV-class kernels here stream the panels).
inline constexpr int64_t kInt8OnednnMinM = 16;
// Smallest m lattice's AMX tiles take (one tile's rows), at the amx level where oneDNN does not run the GEMM.
inline constexpr int64_t kInt8AmxMinM = 16;
// Output channels per packed panel and k per group.
inline constexpr int64_t kInt8PanelN = 16;
inline constexpr int64_t kInt8GroupK = 4;

// 64-byte aligned allocator so that packed panels can be read with aligned zmm loads; from 2 MiB
// on, memory comes from map_huge (huge pages: the packed weights are what decode streams).
template <class T>
struct AlignedAllocator64 {
    using value_type = T;
    AlignedAllocator64() = default;
    template <class U>
    AlignedAllocator64(const AlignedAllocator64<U>&) noexcept {}
    static std::size_t bytes_for(std::size_t n) { return (n * sizeof(T) + 63) / 64 * 64; }
    T* allocate(std::size_t n) {
        if (n == 0) return nullptr;
        const std::size_t bytes = bytes_for(n);
        void* p = bytes >= kHugePageBytes ? map_huge(bytes) : std::aligned_alloc(64, bytes);
        if (!p) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        const std::size_t bytes = bytes_for(n);
        if (bytes >= kHugePageBytes)
            unmap_huge(p, bytes);
        else
            std::free(p);
    }
    template <class U>
    bool operator==(const AlignedAllocator64<U>&) const noexcept { return true; }
};

struct OnednnInt8;  // onednn_int8.h

// Who runs the W8A8 / s8s8 GEMMs at m >= kInt8OnednnMinM. kAuto: oneDNN at the amx level when the build has
// it, else lattice's kernels; kOwn: always lattice's; kOnednn: oneDNN at the avx512 and amx levels (throws
// at packing when the build has no oneDNN). Read when weights are packed; a process-wide setting.
enum class Int8Provider : uint8_t { kAuto, kOwn, kOnednn };
void set_int8_provider(Int8Provider p);
Int8Provider int8_provider();
Int8Provider parse_int8_provider(std::string_view s);  // "auto", "own", "onednn"; throws Error otherwise
// Whether weights packed for `isa` get a oneDNN copy under the current provider setting.
bool int8_uses_onednn(IsaLevel isa);
// Who ran the last W8A8 / s8s8 GEMM ("own" or "onednn"; "" before any), for tests and diagnostics.
std::string_view last_int8_provider();
// Who runs the W8A8 / s8s8 GEMMs at m >= 16 of weights packed for `isa` under the current provider setting, in
// words, for `lattice doctor`: "oneDNN's matmul", "lattice's AMX-INT8 tiles", "lattice's avx512 kernel" ...
std::string int8_prefill_kernel(IsaLevel isa);

// Weights packed for the kernels (layout above). Move-only in practice (large).
struct PackedInt8 {
    std::vector<int8_t, AlignedAllocator64<int8_t>> data;  // [n_panels][k_padded / 4][16][4]
    int64_t n = 0;                                          // output channels
    int64_t k = 0;                                          // input channels
    int64_t k_padded = 0;                                   // k rounded up to a multiple of 4
    int64_t n_panels = 0;                                   // ceil(n / 16)
    std::vector<int32_t> col_sums;                          // [n_panels * 16] sum_k q[n, k] (0 past n)
    IsaLevel isa = IsaLevel::kScalar;                       // kernel used by the gemm calls
    std::shared_ptr<const OnednnInt8> onednn;               // oneDNN's copy (m >= kInt8OnednnMinM), or null

    int64_t panel_bytes() const { return k_padded * kInt8PanelN; }
    const int8_t* panel(int64_t p) const { return data.data() + p * panel_bytes(); }
};

// Symmetric per-output-channel quantization of w [n, k] (row-major f32):
// q = round(w / s) (half away from zero), s = max|w_row| / 127 (s = 1 if the row is all zero).
// Throws on non-finite weights. scales: [n].
void quantize_weights_per_channel(const float* w, int64_t n, int64_t k, int8_t* q, float* scales);
// The same from f32, f16 or bf16 rows, each converted to f32 as it is quantized (a row's worth of scratch, not a
// float copy of the matrix: a load quantizes every linear of the model this way), the rows split among the
// pool's threads when one is given (the same bits either way).
void quantize_weights_per_channel(const void* w, DType dtype, int64_t n, int64_t k, int8_t* q, float* scales,
                                  ThreadPool* pool = nullptr);

// Packs q [n, k] (row-major int8) for `isa`. Throws when the CPU cannot run `isa` or k > kInt8MaxK.
// w8a8: the weights serve gemm_w8a8 / gemm_s8s8_s32 (a oneDNN copy is made when int8_uses_onednn(isa));
// false for weights only gemm_w8a16 reads, which never get one.
PackedInt8 pack_int8_weights(const int8_t* q, int64_t n, int64_t k, IsaLevel isa, bool w8a8 = true);

// W8A8: y[m, n] = sum_k xq[m, k] * q[n, k] * (sx[m] * sw[n]) with xq, sx from quantize_row_int8
// (per token); int32 accumulation, exact; the float epilogue is float(c) * (sx[m] * sw[n]), so all
// ISA paths give bit-identical y. x: [m, k], y: [m, n], w_scales: [n].
void gemm_w8a8(const float* x, int64_t m, int64_t k, const PackedInt8& w, const float* w_scales, float* y,
               ThreadPool& pool);

// W8A16 (weight-only): y[m, n] = (sum_k x[m, k] * float(q[n, k])) * sw[n]; weights converted to f32
// inside the kernel, f32 FMA accumulation (summation order differs between ISA paths).
void gemm_w8a16(const float* x, int64_t m, int64_t k, const PackedInt8& w, const float* w_scales, float* y,
                ThreadPool& pool);

// quantize_row_int8 (kernels/common/quantize.h) in SIMD where the CPU has it, bit-identical: the
// per-token activation quantize of gemm_w8a8 and the per-channel weight quantize. Returns the scale.
float quantize_row_int8_simd(const float* x, int64_t k, int8_t* q);

// gemm_w8a8 on activations quantized beforehand (quantize_row_int8_simd): xq [m, ldx] int8 (first k
// columns used), x_scales [m]. Equals gemm_w8a8 of the float rows they came from, bit for bit.
void gemm_w8a8_quantized(const int8_t* xq, int64_t ldx, const float* x_scales, int64_t m, int64_t k,
                         const PackedInt8& w, const float* w_scales, float* y, ThreadPool& pool);

// Raw int32 GEMM: c[m, n] = sum_k a[m, k] * q[n, k]; a: [m, k] int8 row-major, c: [m, n].
void gemm_s8s8_s32(const int8_t* a, int64_t m, int64_t k, const PackedInt8& w, int32_t* c, ThreadPool& pool);

}  // namespace lattice
