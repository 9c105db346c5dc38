// lattice convert in 4 bits under mpirun -np 2: at tp 2 and pp 2 the ranks convert in parallel (each writes its
// own file) and loading the folder gives logits bit-identical to running the source directly on the same layout,
// and the same greedy tokens on every rank: float golden checkpoints quantized at conversion (each rank's slice
// from its own first column, as a load quantizes it), w4a8 and w4a16, and an AWQ checkpoint at tp 2 (its groups
// split on their boundaries, zero points kept). Each rank reads exactly its own file.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstring>

#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"
#include "runtime/weights/converted_source.h"
#include "tests/runtime/converter/convert_mpi_util.h"
#include "tests/runtime/converter/convert_test_util.h"

using namespace lattice;
using namespace lattice::testing;

TEST_CASE("4-bit folders converted in parallel equal the source at tp 2 and pp 2") {
    REQUIRE(mpi_session().size() == 2);
    const int rank = mpi_session().rank();
    ParallelContext ctx = make_parallel_context(2, 1, 60.0);  // the converting ranks: both
    const std::string dir = shared_temp_dir("lattice_convert_int4");
    const std::string data = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/";
    struct Case {
        std::string path;
        std::vector<int32_t> prompt;
    };
    std::vector<Case> cases;
    for (const char* g : {"tiny-llama2", "tiny-gqa-llama3", "tiny-fp16-tied"})
        cases.push_back({golden_dir(g), load_golden(g)[0].prompt});
    cases.push_back({data + "tiny-awq", {5, 9, 17, 3, 40, 22, 11, 8}});
    int n = 0, runs = 0;
    for (const Case& c : cases) {
        auto src = open_model(c.path);
        for (const auto& layout : {std::pair{2, 1}, std::pair{1, 2}}) {
            const int tp = layout.first, pp = layout.second;  // (clang: a structured binding cannot be captured)
            if (!layout_fits(src->config(), tp, pp)) continue;
            for (QuantMode q : {QuantMode::kW4A8, QuantMode::kW4A16}) {
                CAPTURE(c.path);
                CAPTURE(tp);
                CAPTURE(pp);
                CAPTURE(quant_mode_name(q));
                const std::string out = dir + "/c" + std::to_string(n++);
                ConvertOptions opt;
                opt.out = out;
                opt.tp = tp;
                opt.pp = pp;
                opt.quant = q;
                convert_checkpoint(*src, opt, *ctx.world_comm);
                RunResult want = run_built(build(cpu_options(tp, pp, true, q), *src), c.prompt, 6);
                RunResult got = run_built(build(cpu_options(tp, pp, true, q), spec_of(out, true)), c.prompt, 6);
                if (rank == 0) {
                    REQUIRE(got.logits.size() == want.logits.size());
                    CHECK(same_bits(got.logits, want.logits));
                }
                CHECK(got.tokens == want.tokens);
                CHECK(got.weight_bytes == want.weight_bytes);
                REQUIRE(got.bytes_read.size() == 2);
                auto file = open_converted_model(out, {tp, pp, rank});
                CHECK(file->info("model.layers." +
                                 std::to_string(pp == 2 && rank == 1 ? src->config().n_layers - 1 : 0) +
                                 ".self_attn.o_proj.weight")
                          .int4_group > 0);
                CHECK(got.bytes_read[size_t(rank)] == file->total_bytes());
                ++runs;
                remove_shared(out);
            }
        }
    }
    CHECK(runs >= 12);
    remove_shared(dir);
}
