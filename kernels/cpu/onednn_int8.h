// oneDNN (Debian's libdnnl, found by CMake when installed: LATTICE_HAVE_ONEDNN) as a provider of the W8A8
// GEMM at m >= kInt8OnednnMinM: a u8 x s8 -> s32 matmul on the rows int8_gemm.cpp prepares anyway for the
// VNNI kernels (a + 128 as u8), then lattice's own epilogue. On Xeons with AMX, oneDNN's matmul picks
// `brg:avx512_core_amx_int8` by itself (its tile kernels; it asks the kernel for the tile permission too,
// after isa.cpp has), which is how the W8A8 GEMM reaches the tile units; elsewhere `brg:avx512_core_vnni`.
//
// Which provider runs (int8_gemm.h, Int8Provider): by default oneDNN at the amx level only. Measured on a
// 2-vCPU AMD EPYC (Zen 4, AVX-512 VNNI, no AMX; bench_gemm_int8, one core, CPU time, same run): lattice's
// VNNI kernel 413 / 427 / 436 GOP/s at m = 16 / 128 / 512 on 4096x4096 and 382 / 440 / 440 on 11008x4096;
// oneDNN 2.6.3 here (brg:avx512_core_vnni, this file's chunks and epilogue) 367 / 401 / 381 and
// 302 / 403 / 403, so lattice's kernel is 1.06-1.26x faster (a bare oneDNN call without the epilogue
// measured ~450 GOP/s: still no more than 1.05x). That does not pay for a second copy of every int8 weight
// (decode keeps lattice's packed panels: its GEMV streams them at the memory's rate), so the default without
// AMX is lattice's kernel. On AMX, oneDNN's tile kernels are 2.5x lattice's VNNI (2.8 TOP/s against 1.1 on
// a 2-vCPU Sapphire Rapids, u8 x s8 -> s32), which does; the second copy is the price (onednn_int8_bytes).
//
// Layout: the weights q [n, k] are cut into column chunks of kOnednnChunkN output channels (the last one
// shorter) and each chunk is reordered once, at pack time, into the blocked layout oneDNN chooses for it
// (format `any`: BA16a64b4a on AVX-512 VNNI; lattice's own panel order is BA16a16b4a, which oneDNN accepts
// but runs 4-5x slower). Threads: lattice's pool claims chunks (parallel_chunks, threads split N as in the
// rest of kernels/cpu), and each thread runs its chunk's matmul single-threaded. Debian's libdnnl uses the
// OpenMP runtime (libgomp); every thread that calls it is set to one OpenMP thread first, so no OpenMP team
// ever starts and the only threads are the pool's (no oversubscription, no second set of spinning workers).
//
// Exactness: oneDNN's sums are the exact int32 sum_k (a + 128) * q (no saturation); the epilogue subtracts
// 128 * col_sums[n] in int32 and applies float(c) * (row_scale * col_scale), the same operations as the
// VNNI kernels, so y is bit-identical to them (tests/kernels/cpu/test_onednn_int8.cpp).
//
// Primitives are created per (m, k, chunk width, lda) on first use and cached (at most kOnednnMaxPrims;
// the cache is cleared when full), each with a user scratchpad per calling thread, so concurrent chunks
// never share oneDNN state. Without libdnnl every function here throws except onednn_compiled().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice {

inline constexpr int64_t kOnednnChunkN = 256;
inline constexpr size_t kOnednnMaxPrims = 512;

// Weights reordered for oneDNN (opaque; immutable after packing, shared between copies of a PackedInt8).
struct OnednnInt8;

// Whether this build links libdnnl.
bool onednn_compiled();
// "oneDNN 2.6.3" (the library's own version), or why it is absent.
std::string onednn_describe();

// Reorders q [n, k] (row-major int8) into oneDNN's layout, chunk by chunk, for the ISA level `isa`
// (kAvx512Vnni or kAmx: the first call caps oneDNN's own ISA choice at it, dnnl::set_max_cpu_isa, so that
// LATTICE_ISA=avx512 keeps oneDNN off the tile units too). Returns nullptr, with the reason in *why, when
// oneDNN cannot serve this level in this process (a different level was fixed earlier). Throws Error when
// not compiled or when oneDNN fails.
std::shared_ptr<const OnednnInt8> onednn_pack_int8(const int8_t* q, int64_t n, int64_t k, IsaLevel isa,
                                                   std::string* why = nullptr);
int64_t onednn_int8_bytes(const OnednnInt8& w);

// The W8A8 / s8s8 GEMM on prepared rows: a [m, lda] u8 (= int8 + 128, first k columns used), col_sums [n]
// (sum_k q[n, k]), written through `ep` (int8_gemm_kernels.h). Returns false (having written nothing)
// when oneDNN offers no primitive for this m, so that the caller runs its own kernels.
bool onednn_int8_gemm(const uint8_t* a, int64_t m, int64_t lda, const OnednnInt8& w, const int32_t* col_sums,
                      const int8_detail::Int8Epilogue& ep, ThreadPool& pool);

// The implementation oneDNN picked for m rows of these weights (e.g. "brg:avx512_core_amx_int8").
std::string onednn_int8_impl(const OnednnInt8& w, int64_t m, int64_t lda);

// The same for the bf16-pair GEMM (gemm_bf16.h, `--dtype bf16`), by the same provider policy (int8_uses_onednn):
// oneDNN's bf16 x bf16 -> f32 matmul, whose tile kernels on Xeons with AMX are AMX-BF16
// (`brg:avx512_core_amx`), on a copy of the weights reordered chunk by chunk as the int8 ones. w is [n, k] bf16
// row-major; xb the rows of x in bf16, leading dimension lda; y [m, n] f32 written in place. oneDNN sums in its
// own order: its rows equal the pairs' to f32 rounding, not bit for bit.
struct OnednnBf16;
std::shared_ptr<const OnednnBf16> onednn_pack_bf16(const uint16_t* w, int64_t n, int64_t k, IsaLevel isa,
                                                   std::string* why = nullptr);
int64_t onednn_bf16_bytes(const OnednnBf16& w);
bool onednn_bf16_gemm(const uint16_t* xb, int64_t m, int64_t lda, const OnednnBf16& w, float* y, ThreadPool& pool);
std::string onednn_bf16_impl(const OnednnBf16& w, int64_t m, int64_t lda);

}  // namespace lattice
