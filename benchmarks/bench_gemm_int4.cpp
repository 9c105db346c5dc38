// The W4A8 GEMM at decode and prefill sizes (m = 1, 16, 128, 512 by default) on the 4-bit group form (Q4_1's: an
// f16 scale and minimum per 32, 5 bits a weight) against the K-quant layout of GGUF Q4_K (4.5 bits) and Q6_K (6.6)
// (kernels/cpu/int4_gemm.h), the same [n, k] and activations, one thread, process CPU time per GEMM (a busy
// machine moves it much less than the wall clock). Rounds interleave every (m, layout) pair; the table gives each
// row's median over the rounds in ms and GOP/s (2 m n k), and the K-quant rows' ratio to the group form's. The
// weights are hot for m >= 16 (each call reuses one packed copy); m = 1 reads them from wherever the previous
// calls left them (mostly L3/DRAM at the default shape). The super-blocks are random bytes with small scales:
// the kernels' time does not depend on the values.
// At the amx level (an AMX Xeon; `--isa avx512` pins the VNNI kernels) m >= 16 runs the AMX tile kernels.
// Usage: bench_gemm_int4 [--n 4096] [--k 4096] [--m 1,16,128,512] [--rounds 5] [--isa LEVEL] [--json FILE]
#include "benchmarks/bench_common.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
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
using bench::median;

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"W4A8 GEMM: group form against the K-quant layout (Q4_K, Q6_K), one thread, CPU time"};
    int64_t n = 4096, k = 4096;
    int rounds = 5;
    std::vector<int64_t> ms = {1, 16, 128, 512};
    std::string json, isa_arg;
    app.add_option("--n", n);
    app.add_option("--k", k, "a multiple of 256");
    app.add_option("--m", ms)->delimiter(',');
    app.add_option("--rounds", rounds);
    app.add_option("--json", json);
    app.add_option("--isa", isa_arg, "CPU ISA level (scalar, avx2, avxvnni, avx512, amx): as LATTICE_ISA");
    CLI11_PARSE(app, argc, argv);
    try {
        if (!isa_arg.empty()) set_isa_override(parse_isa(isa_arg));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gemm_int4: %s\n", e.what());
        return 2;
    }
    std::mt19937 rng(1);
    const IsaLevel isa = detect_isa();
    const std::vector<PackedInt4> packs = bench::pack_kquant_layouts(n, k, isa, rng);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    const char* names[3] = {"group form (5 bits)", "Q4_K layout (4.5)", "Q6_K layout (6.6)"};
    const int64_t m_max = *std::max_element(ms.begin(), ms.end());
    std::vector<float> x(static_cast<size_t>(m_max * k)), y(static_cast<size_t>(m_max * n));
    for (float& v : x) v = nd(rng);
    ThreadPool pool(1, false);
    // times[mi][layout] over rounds.
    std::vector<std::vector<std::vector<double>>> times(ms.size(), std::vector<std::vector<double>>(3));
    for (int r = 0; r < rounds; ++r)
        for (size_t mi = 0; mi < ms.size(); ++mi)
            for (int i = 0; i < 3; ++i) {
                const int64_t m = ms[mi];
                // About 40 M multiply-adds a sample (at least 2 calls), so each sample is tens of ms.
                const int calls = int(std::max<int64_t>(2, int64_t(4e7) / (m * n * k / 64 + 1) + 1));
                gemm_w4a8(x.data(), m, k, packs[size_t(i)], y.data(), pool);  // warm
                const double t0 = cpu_seconds();
                for (int c = 0; c < calls; ++c) gemm_w4a8(x.data(), m, k, packs[size_t(i)], y.data(), pool);
                times[mi][size_t(i)].push_back((cpu_seconds() - t0) / calls);
            }
    std::printf("%s, n %lld, k %lld, 1 thread, CPU time, median of %d interleaved rounds (K-quant layout: %s)\n",
                std::string(isa_name(isa)).c_str(), (long long)n, (long long)k, rounds,
                packs[1].kq ? "yes" : "no: this ISA packs the group form");
    std::printf("| m | layout | MB | ms (median) | GOP/s | vs group form |\n|---|---|---|---|---|---|\n");
    nlohmann::json rows = nlohmann::json::array();
    for (size_t mi = 0; mi < ms.size(); ++mi) {
        const double base = median(times[mi][0]);
        for (int i = 0; i < 3; ++i) {
            const double t = median(times[mi][size_t(i)]);
            const double gops = 2.0 * double(ms[mi]) * double(n) * double(k) / t / 1e9;
            std::printf("| %lld | %s | %.1f | %.3f | %.1f | %.2fx |\n", (long long)ms[mi], names[i],
                        double(packs[size_t(i)].bytes()) / 1e6, t * 1e3, gops, base / t);
            rows.push_back({{"m", ms[mi]}, {"layout", names[i]}, {"ms", t * 1e3}, {"gops", gops},
                            {"speed_vs_group", base / t}, {"samples_ms", times[mi][size_t(i)]}});
        }
    }
    if (!json.empty())
        bench::write_json(json, {{"isa", std::string(isa_name(isa))}, {"n", n}, {"k", k}, {"rounds", rounds},
                                 {"rows", rows}});
    return 0;
}
