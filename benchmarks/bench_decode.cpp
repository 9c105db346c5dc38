// End-to-end single-rank CPU benchmark on a random-weight model of a built-in shape
// (default TinyLlama-1.1B: hidden 2048, 22 layers, 32/4 heads, ffn 5632, vocab 32000).
// Ceiling: decode reads every weight once per token (all but the embedding table, of which it reads
// one row), so the floor time per token is streamed weight bytes / measured read bandwidth; we
// report the achieved weight-read GB/s and its ratio to that floor.
// Prefill is compute bound; we report tokens/s and GFLOP/s (2 x parameters x tokens).
// Usage: bench_decode [--config tinyllama-1.1b] [--threads N] [--prompt 128] [--decode 32]
//                     [--quant none|w8a16|w8a8] [--json FILE]
#include "benchmarks/bench_common.h"

#include "base/log.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/builder/build.h"
#include "runtime/weights/random_source.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

using namespace lattice;

int main(int argc, char** argv) {
    CLI::App app{"lattice decode/prefill benchmark (random weights)"};
    std::string preset = "tinyllama-1.1b", quant = "none", json;
    int threads = 0;
    int64_t prompt = 128, decode = 32;
    app.add_option("--config", preset);
    app.add_option("--threads", threads);
    app.add_option("--prompt", prompt);
    app.add_option("--decode", decode);
    app.add_option("--quant", quant);
    app.add_option("--json", json);
    CLI11_PARSE(app, argc, argv);
    try {
        ModelConfig cfg = preset_config(preset);
        auto src = make_random_source(cfg, 42);
        double bw = 0;
        {
            ThreadPool pool(threads, true);  // the ceiling, on as many pinned threads as the model gets
            bw = bench::measure_read_bandwidth(pool);
        }
        BuildOptions opt;
        opt.model.quant = parse_quant_mode(quant);
        opt.model.max_seq = prompt + decode + 1;
        opt.model.max_batch_tokens = std::min<int64_t>(prompt, 256);
        opt.backend.kind = BackendKind::kCpu;
        opt.backend.threads = threads;
        RankRuntime rt = build(opt, *src);
        const double load_s = rt.load_seconds;
        src.reset();
        Model& model = *rt.model;
        Engine& engine = *rt.engine;
        GenerateRequest req;
        for (int64_t i = 0; i < prompt; ++i) req.prompt.push_back(int32_t((i * 7919 + 13) % cfg.vocab));
        req.max_new_tokens = decode;
        req.ignore_eos = true;
        engine.generate(GenerateRequest{{1, 2, 3}, 2, 0, {}, true, {}});  // warm-up: page in, spin up threads
        GenerateResult r = engine.generate(req);
        const double bytes = double(model.streamed_weight_bytes());
        const double decode_tps = double(r.stats.generated_tokens - 1) / r.stats.decode_seconds;
        const double prefill_tps = double(prompt) / r.stats.prefill_seconds;
        const double achieved_bw = bytes * decode_tps * 1e-9;
        const double floor_tps = bw * 1e9 / bytes;
        const double gflops = 2.0 * double(cfg.parameter_count()) * prefill_tps * 1e-9;
        fmt::print("| model | quant | threads | streamed GiB/token | prefill tok/s | prefill GFLOP/s | decode tok/s | "
                   "weight GB/s | mem GB/s | ratio to floor |\n");
        fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
        fmt::print("| {} | {} | {} | {:.2f} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} | {:.2f} |\n", preset, quant,
                   rt.backend->threads(), bytes / double(1 << 30), prefill_tps, gflops, decode_tps, achieved_bw, bw,
                   decode_tps / floor_tps);
        bench::write_json(json, {{"model", preset},
                                 {"quant", quant},
                                 {"threads", rt.backend->threads()},
                                 {"weight_bytes", bytes},
                                 {"load_seconds", load_s},
                                 {"prompt_tokens", prompt},
                                 {"prefill_tokens_per_s", prefill_tps},
                                 {"prefill_gflops", gflops},
                                 {"decode_tokens", r.stats.generated_tokens},
                                 {"decode_tokens_per_s", decode_tps},
                                 {"weight_read_gb_per_s", achieved_bw},
                                 {"memory_bandwidth_gb_per_s", bw},
                                 {"decode_floor_tokens_per_s", floor_tps},
                                 {"ratio_to_floor", decode_tps / floor_tps}});
    } catch (const Error& e) {
        fmt::print(stderr, "bench_decode: error: {}\n", e.what());
        return 1;
    }
    return 0;
}
