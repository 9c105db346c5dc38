// SmoothQuant under tensor and pipeline parallelism (mpirun -np 2): a smoothed model loaded as
// tp 2 or pp 2 gives the single-rank smoothed logits (1e-5 relative; --quant none). Each TP rank
// scales the columns (= hidden, never sharded for wqkv / w_gate_up) of its own row slice by the
// whole factor vector and divides its replicated norm weights; each stage reads only its layers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/test_build.h"
#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"
#include "runtime/builder/build.h"
#include "runtime/model/smoothquant.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/model/golden.h"

using namespace lattice;
using namespace lattice::testing;

TEST_CASE("smoothed model: tp 2 and pp 2 equal the single-rank smoothed run") {
    const int world = mpi_session().size();
    REQUIRE(world == 2);
    for (const auto& name : golden_models()) {
        CAPTURE(name);
        OutlierSource src(open_model(golden_dir(name)), 9, 50.0f);
        // Every rank calibrates the same way (deterministic) into its own file: no shared-file race.
        const std::string path = (std::filesystem::temp_directory_path() /
                                  ("lattice_sq_layout_" + std::to_string(getpid()) + ".safetensors"))
                                     .string();
        {
            CpuBackend be(CpuBackendOptions{1, false, false});
            Model m(src, be, ModelOptions{}, nullptr);
            write_smooth_factors(
                path, compute_smooth_factors(
                          src, collect_activation_stats(m, random_ids(100, src.config().vocab, 5), 50), 0.5));
        }
        const std::vector<int32_t> prompt = load_golden(name).back().prompt;
        const std::vector<float> want = score_all(src, quant_options(QuantMode::kNone, path), {prompt}, 1)[0];
        const std::vector<float> plain = score_all(src, quant_options(QuantMode::kNone), {prompt}, 1)[0];
        CHECK(rel_error(want.data(), plain.data(), plain.size()) < 1e-5);
        for (const auto& layout : {std::pair{2, 1}, std::pair{1, 2}}) {
            const int tp = layout.first, pp = layout.second;
            const ModelConfig& c = src.config();
            try {
                check_model_layout(c.dims(), tp, pp);
            } catch (const Error&) {
                continue;  // the heads do not allow this layout
            }
            CAPTURE(tp);
            BuildOptions opt = test::cpu_options(1, tp, pp);
            opt.model = quant_options(QuantMode::kNone, path);
            RankRuntime rt = build(opt, src);
            std::vector<float> got = rt.engine->score(prompt);
            if (rt.world.rank == 0) {
                REQUIRE(got.size() == want.size());
                CHECK(rel_error(got.data(), want.data(), want.size()) < 1e-5);
            }
        }
        std::filesystem::remove(path);
    }
}
