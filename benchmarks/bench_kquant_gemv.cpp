// The W4A8 decode GEMV (m = 1) on the 4-bit group form (Q4_1's: an f16 scale and minimum per 32) against the
// K-quant layout of GGUF Q4_K and Q6_K (kernels/cpu/int4_gemm.h), one core, weights from DRAM (rotating copies
// of each packed matrix past 1 GiB), process CPU time per GEMV (a busy machine moves it much less than the wall
// clock), rounds interleaved. The super-blocks are random bytes with small scales: the kernels' time does not
// depend on the values. Prints ms per GEMV and the packed bytes' rate; the K-quant rows read 10% fewer
// (Q4_K) and 31% more (Q6_K) bytes than the group form.
// Usage: bench_kquant_gemv [n k rounds [hot]]   (default 11008 4096 3; "hot": one copy of each matrix, so a
// matrix that fits in L2 measures the kernel's compute rate, not DRAM's)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/int4_quantize.h"
#include "kernels/cpu/int4_gemm.h"
#include "benchmarks/bench_kquant_util.h"

using namespace lattice;

namespace {

using bench::cpu_seconds;

}  // namespace

int main(int argc, char** argv) {
    const int64_t n = argc > 2 ? std::atoll(argv[1]) : 11008, k = argc > 2 ? std::atoll(argv[2]) : 4096;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
    std::mt19937 rng(1);
    const IsaLevel isa = detect_isa();
    std::vector<PackedInt4> layouts = bench::pack_kquant_layouts(n, k, isa, rng);
    std::vector<PackedInt4> sets[3];
    for (int i = 0; i < 3; ++i) sets[i].push_back(std::move(layouts[size_t(i)]));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    const bool hot = argc > 4 && std::string(argv[4]) == "hot";
    for (auto& s : sets)
        while (!hot && int64_t(s.size()) * s[0].bytes() < (int64_t(1) << 30)) s.push_back(s[0]);
    ThreadPool pool(1, false);
    std::vector<float> x(static_cast<size_t>(k)), y(static_cast<size_t>(n));
    for (float& v : x) v = nd(rng);
    const char* names[3] = {"group form (Q4_1's)", "Q4_K layout", "Q6_K layout"};
    std::printf("%s, n %lld, k %lld, 1 core, %s (K-quant layout: %s)\n", std::string(isa_name(isa)).c_str(),
                (long long)n, (long long)k, hot ? "weights hot (one copy)" : "from DRAM",
                sets[1][0].kq ? "yes" : "no: this ISA packs the group form");
    std::printf("| round | layout | MB | ms per GEMV (CPU) | GB/s |\n|---|---|---|---|---|\n");
    for (int r = 0; r < rounds; ++r)
        for (int i = 0; i < 3; ++i) {
            const double t0 = cpu_seconds();
            int calls = 0;
            for (int rep = 0; rep < (hot ? 2000 : 2); ++rep)
                for (const PackedInt4& p : sets[i]) {
                    gemm_w4a8(x.data(), 1, k, p, y.data(), pool);
                    ++calls;
                }
            const double t = (cpu_seconds() - t0) / calls;
            std::printf("| %d | %s | %.1f | %.3f | %.1f |\n", r, names[i], double(sets[i][0].bytes()) / 1e6, t * 1e3,
                        double(sets[i][0].bytes()) / t / 1e9);
        }
    return 0;
}
