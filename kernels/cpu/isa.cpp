// The CPU ISA decision (see isa.h): feature detection, the AMX tile permission, the override and the
// per-family record of the path that ran.
#include "kernels/cpu/isa.h"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lattice {

namespace {

constexpr std::array<IsaLevel, 5> kLevels = {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvxVnni,
                                             IsaLevel::kAvx512Vnni, IsaLevel::kAmx};

std::atomic<int> g_isa_override{-1};

constexpr uint8_t kNotRun = 0xFF;
std::atomic<uint8_t> g_paths[kKernelFamilies] = {kNotRun, kNotRun, kNotRun, kNotRun, kNotRun};

#if defined(__x86_64__)
uint64_t xcr0() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE: xgetbv is allowed
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t(hi) << 32) | lo;
}

// The kernel's permission to use the tile data state (Linux >= 5.16); refused on older kernels and in VMs
// that hide it. Returns "" when granted, else why not.
std::string request_amx_permission() {
#if defined(__linux__)
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return {};
    return fmt::format("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: {}", std::strerror(errno));
#else
    return "the tile permission is only asked for on Linux";
#endif
}

CpuProbe probe_this_cpu() {
    CpuProbe p;
    __builtin_cpu_init();
    p.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    unsigned a = 0, b = 0, c = 0, d = 0;
    // F16C: CPUID.1:ECX[29] (clang 14's __builtin_cpu_supports does not know "f16c").
    p.avx2 = p.avx2 && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    // AVX-VNNI: CPUID.(7,1):EAX[4] (nor "avxvnni"); the YMM state is covered by the avx2 check.
    p.avxvnni = p.avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u);
    p.avx512 = p.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
    // AVX512_BF16: CPUID.(7,1):EAX[5] (read directly, like AVX-VNNI: clang 14 knows neither by name).
    p.avx512bf16 = p.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u);
    p.amx_cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 24) & 1u) && ((d >> 25) & 1u);
    p.xcr0 = xcr0();
    p.request_amx_permission = &request_amx_permission;
    return p;
}
#else
CpuProbe probe_this_cpu() { return {}; }
#endif

bool level_has_features(IsaLevel l, const CpuFeatures& f) {
    switch (l) {
        case IsaLevel::kScalar: return true;
        case IsaLevel::kAvx2: return f.avx2;
        case IsaLevel::kAvxVnni: return f.avx2 && f.avxvnni;
        case IsaLevel::kAvx512Vnni: return f.avx512;
        case IsaLevel::kAmx: return f.avx512 && f.amx_cpu && f.amx_os && f.amx_granted;
    }
    return false;
}

const IsaChoice& choice() {
    static const IsaChoice c = [] {
        IsaChoice r = choose_isa(cpu_features());
        // The CPU has AMX but this process cannot use it: say why, once (a CPU without AMX needs no line).
        if (cpu_features().amx_cpu && r.best != IsaLevel::kAmx)
            LOG_INFO("cpu kernels: AMX not used, {}; running {}", r.amx_note, isa_name(r.best));
        return r;
    }();
    return c;
}

}  // namespace

std::span<const IsaLevel> all_isa_levels() { return kLevels; }

std::string_view isa_name(IsaLevel isa) {
    switch (isa) {
        case IsaLevel::kScalar: return "scalar";
        case IsaLevel::kAvx2: return "avx2";
        case IsaLevel::kAvxVnni: return "avxvnni";
        case IsaLevel::kAvx512Vnni: return "avx512";
        case IsaLevel::kAmx: return "amx";
    }
    return "?";
}

IsaLevel parse_isa(std::string_view s) {
    if (s == "scalar") return IsaLevel::kScalar;
    if (s == "avx2") return IsaLevel::kAvx2;
    if (s == "avxvnni" || s == "avx-vnni") return IsaLevel::kAvxVnni;
    if (s == "avx512" || s == "avx512vnni" || s == "avx512_vnni") return IsaLevel::kAvx512Vnni;
    if (s == "amx") return IsaLevel::kAmx;
    LATTICE_FAIL("unknown ISA level '{}' (expected scalar, avx2, avxvnni, avx512 or amx)", s);
}

IsaChoice choose_isa(const CpuFeatures& f) {
    IsaChoice r;
    for (IsaLevel l : kLevels)
        if (level_has_features(l, f)) r.best = l;
    if (r.best == IsaLevel::kAmx) return r;
    if (!f.amx_cpu)
        r.amx_note = "the CPU has no AMX-INT8";
    else if (!f.avx512)
        r.amx_note = "the CPU has AMX but not the AVX-512 VNNI it is paired with";
    else if (!f.amx_os)
        r.amx_note = "the OS does not enable the tile state (XCR0 bits 17-18)";
    else
        r.amx_note = "the kernel refused the tile data permission: " +
                     (f.amx_refusal.empty() ? std::string("not asked") : f.amx_refusal);
    return r;
}

CpuProbe cpu_probe() { return probe_this_cpu(); }

CpuFeatures features_from_probe(const CpuProbe& p) {
    CpuFeatures f;
    f.avx2 = p.avx2;
    f.avxvnni = p.avx2 && p.avxvnni;
    f.avx512 = p.avx2 && p.avx512;
    f.avx512bf16 = f.avx512 && p.avx512bf16;
    f.amx_cpu = p.amx_cpu;
    f.amx_os = p.amx_cpu && (p.xcr0 & (uint64_t(3) << 17)) == (uint64_t(3) << 17);
    if (f.avx512 && f.amx_cpu && f.amx_os) {
        f.amx_refusal = p.request_amx_permission ? p.request_amx_permission() : "no way to ask on this platform";
        f.amx_granted = f.amx_refusal.empty();
    }
    return f;
}

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = features_from_probe(probe_this_cpu());
    return f;
}

std::string_view amx_note() { return choice().amx_note; }

bool isa_supported(IsaLevel isa) { return level_has_features(isa, cpu_features()); }

IsaLevel best_isa() { return choice().best; }

IsaLevel detect_isa() {
    const int o = g_isa_override.load(std::memory_order_relaxed);
    return o >= 0 ? IsaLevel(o) : best_isa();
}

void set_isa_override(IsaLevel isa) {
    LATTICE_CHECK(isa_supported(isa), "ISA override '{}' is not supported by this CPU (best: {}){}", isa_name(isa),
                  isa_name(best_isa()), isa == IsaLevel::kAmx ? fmt::format(": {}", amx_note()) : std::string());
    g_isa_override.store(int(isa), std::memory_order_relaxed);
}

void clear_isa_override() { g_isa_override.store(-1, std::memory_order_relaxed); }

std::string_view kernel_family_name(KernelFamily f) {
    switch (f) {
        case KernelFamily::kGemmInt8: return "gemm_int8";
        case KernelFamily::kGemmInt4: return "gemm_int4";
        case KernelFamily::kGemmF32: return "gemm_f32";
        case KernelFamily::kAttention: return "attention";
        case KernelFamily::kElementwise: return "elementwise";
    }
    return "?";
}

void note_path(KernelFamily f, IsaLevel ran) {
    std::atomic<uint8_t>& p = g_paths[size_t(f)];
    if (p.load(std::memory_order_relaxed) != uint8_t(ran)) p.store(uint8_t(ran), std::memory_order_relaxed);
}

std::optional<IsaLevel> last_path(KernelFamily f) {
    const uint8_t v = g_paths[size_t(f)].load(std::memory_order_relaxed);
    return v == kNotRun ? std::nullopt : std::optional<IsaLevel>(IsaLevel(v));
}

void clear_paths() {
    for (auto& p : g_paths) p.store(kNotRun, std::memory_order_relaxed);
}

}  // namespace lattice
