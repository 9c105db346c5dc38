// The one CPU ISA decision every kernel family obeys: the int8 and 4-bit GEMMs (the level their weights are
// packed for), the float GEMM, attention and the elementwise vector loops (the level of each call).
//
// Levels, each a superset of the one before:
//   scalar   the portable code compiled for the baseline ISA (x86-64: SSE2); no hand-written SIMD
//   avx2     AVX2 + FMA + F16C
//   avxvnni  avx2 + VEX vpdpbusd (ymm); int8 GEMMs only, everything else runs its avx2 form
//   avx512   AVX-512 F/BW/VL/DQ + VNNI
//   amx      avx512 + AMX-TILE/INT8 with the tile data permission granted by the kernel
//            (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once per process, the first time
//            cpu_features() runs, which every kernel family's level check does before its first call; oneDNN
//            asks again for itself, later, and is granted the same). At this level the W8A8 / s8s8 GEMMs at
//            m >= 16 run on AMX tiles: oneDNN's matmul where the build has libdnnl and the provider is auto
//            (onednn_int8.h), else lattice's own tile kernel (int8_gemm_amx_avx512.cpp), and the group form's
//            W4A8 at m >= 16 on lattice's (int4_gemm_amx_avx512.cpp); every other family runs its avx512
//            kernels.
// A family that has no form for a level runs the highest form it has below it (vector_level below for the
// float loops); what ran is recorded per family (last_path) so that tests can see it instead of assuming it.
//
// Where the decision comes from: detect_isa() is the override when one is set, else best_isa() (cpuid, the
// OS's XSAVE state and the AMX permission). kernels/ never reads the environment: launch/main.cpp maps
// LATTICE_ISA=scalar|avx2|avxvnni|avx512|amx to set_isa_override(parse_isa(v)) before any command runs, and
// tests set the override themselves (tests/kernels/cpu/int8_test_util.h reads LATTICE_ISA to cap the levels
// it checks). The level is read per call (one relaxed atomic load), so an override set after start-up
// reaches the float loops at once and the packed GEMMs from their next packing.
//
// The decision itself is a pure function of the CPU's features (choose_isa), and the features come from a
// probe (CpuProbe: cpuid, XCR0 and the permission request) that tests replace, so a refused AMX permission and
// a CPU without AMX are testable on any machine. Forcing a level this machine cannot run (LATTICE_ISA=amx
// without AMX or without the permission) is an error that says why (set_isa_override).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace lattice {

enum class IsaLevel : uint8_t { kScalar, kAvx2, kAvxVnni, kAvx512Vnni, kAmx };

// Every level, lowest first.
std::span<const IsaLevel> all_isa_levels();
std::string_view isa_name(IsaLevel isa);  // "scalar", "avx2", "avxvnni", "avx512", "amx"
// Parses "scalar|avx2|avxvnni|avx512|amx" (also "avx512vnni", "avx-vnni"); throws Error naming the bad value.
IsaLevel parse_isa(std::string_view s);
// Whether this CPU (cpuid, OS state, AMX permission) can run the level.
bool isa_supported(IsaLevel isa);
// Best level this CPU runs, ignoring any override.
IsaLevel best_isa();
// The override when one is set, else best_isa(): the level every kernel family runs.
IsaLevel detect_isa();
// Forces detect_isa() to return `isa`; throws Error when this CPU cannot run it.
void set_isa_override(IsaLevel isa);
void clear_isa_override();

// The form a family that has only scalar / avx2 / avx512 code (float loops, attention, the W8A16 and
// 4-bit kernels) runs at `isa`: kAvxVnni -> kAvx2, kAmx -> kAvx512Vnni, the rest themselves.
inline IsaLevel vector_level(IsaLevel isa) {
    return isa == IsaLevel::kAvxVnni ? IsaLevel::kAvx2 : isa == IsaLevel::kAmx ? IsaLevel::kAvx512Vnni : isa;
}

// What the CPU reports (cpuid, XCR0) and what the kernel granted; the input of the decision.
struct CpuFeatures {
    bool avx2 = false;      // AVX2 + FMA + F16C, with the OS saving YMM state
    bool avxvnni = false;   // CPUID.(7,1):EAX[4]
    bool avx512 = false;    // F, BW, VL, DQ, VNNI, with the OS saving ZMM state
    bool avx512bf16 = false;  // AVX512_BF16 (CPUID.(7,1):EAX[5]) with avx512: vdpbf16ps (Zen 4, Cooper Lake, SPR)
    bool amx_cpu = false;   // AMX-TILE and AMX-INT8 (CPUID.(7,0):EDX[24, 25])
    bool amx_os = false;    // XCR0 bits 17 and 18 (XTILECFG, XTILEDATA): the kernel manages tile state
    bool amx_granted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded
    std::string amx_refusal;   // when asked and refused: why (strerror of the call)
};

struct IsaChoice {
    IsaLevel best = IsaLevel::kScalar;
    std::string amx_note;  // empty when AMX is used; else why not (one line)
};

// The decision: the highest level whose features are all present; AMX also needs the OS and the permission.
IsaChoice choose_isa(const CpuFeatures& f);

// What detection reads from the machine; cpu_probe() is the real one.
struct CpuProbe {
    bool avx2 = false, avxvnni = false, avx512 = false;  // as in CpuFeatures (cpuid with the OS's YMM/ZMM state)
    bool avx512bf16 = false;                             // CPUID.(7,1):EAX[5]
    bool amx_cpu = false;                                 // CPUID.(7,0):EDX[24, 25]
    uint64_t xcr0 = 0;                                    // XGETBV(0)
    // Asks the kernel for the tile data permission; "" when granted, else why not.
    std::string (*request_amx_permission)() = nullptr;
};
CpuProbe cpu_probe();
// The features a probe reports: the permission is asked for (once, by this call) only when the CPU has
// AMX-TILE/INT8 and AVX-512 VNNI and the OS enables the tile state; never otherwise.
CpuFeatures features_from_probe(const CpuProbe& p);
// This machine's features (asks the kernel for the tile permission when the CPU and OS have AMX; once).
const CpuFeatures& cpu_features();
// Why this process does not use AMX ("" when it does): for `lattice info` and the INFO line logged, once,
// when the CPU has AMX but it cannot be used.
std::string_view amx_note();

// Which path each kernel family ran last (for tests and diagnostics; relaxed atomics, stored only on change).
enum class KernelFamily : uint8_t { kGemmInt8, kGemmInt4, kGemmF32, kAttention, kElementwise };
inline constexpr int kKernelFamilies = 5;
std::string_view kernel_family_name(KernelFamily f);
void note_path(KernelFamily f, IsaLevel ran);
// The level of the kernel the family ran last since clear_paths(); nullopt when it has not run.
std::optional<IsaLevel> last_path(KernelFamily f);
void clear_paths();

}  // namespace lattice
