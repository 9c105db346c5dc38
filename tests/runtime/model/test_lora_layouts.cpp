// LoRA adapters under tensor and pipeline parallelism (mpirun -np 2: tp 2 and pp 2; -np 3: tp 3 of the
// 6 / 3-head tp3-base): each fixture adapter, its A and B sharded with the layer (column-parallel: B by
// output rows; row-parallel: A by input columns, added before the one all-reduce), gives the float64
// merged reference's logits within 1e-5 on every layout the heads allow; a mixed batch of base and
// adapter sequences gives the single-sequence tokens there too. `lattice convert --lora` to the same layout
// (merged on the full weights, then sharded) gives the reference's logits within 1e-5 too.
#include <doctest/doctest.h>
#include <mpi.h>

#include "parallel/communicator.h"
#include "parallel/mpi_session.h"
#include "runtime/converter/convert.h"
#include "tests/runtime/converter/convert_mpi_util.h"
#include "tests/runtime/model/lora_test_util.h"
#include "tests/runtime/model/quant_test_util.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

void check_layout(const std::string& base, int tp, int pp) {
    CAPTURE(base);
    CAPTURE(tp);
    CAPTURE(pp);
    auto src = open_model(lora_base_path(base));
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.model.max_batch_tokens = 64;
    opt.engine.max_lora_rank = 16;
    RankRuntime rt = build(opt, *src);
    add_fixture_adapters(*rt.engine, base);
    const LoraCases cases(base);
    EngineClient client(*rt.engine, nullptr, true);
    for (const std::string& a : lora_adapters()) {
        CAPTURE(a);
        const std::vector<float> got = client.score(cases.prompts[0], a);
        if (rt.world.rank != 0) continue;
        const std::vector<float> ref = cases.logits(a, 0);
        REQUIRE(got.size() == ref.size());
        const double err = rel_error(got.data(), ref.data(), ref.size());
        MESSAGE(base << " tp " << tp << " pp " << pp << " " << a << ": rel err " << err);
        CHECK(err < 1e-5);
    }
    // Mixed batch: every rank runs it (followers follow), the leader compares.
    std::vector<ClientRequest> reqs;
    const std::vector<std::string> who = {"", "a4", "b16", "c8"};
    for (int s = 0; s < 8; ++s) {
        ClientRequest r;
        r.prompt = random_ids(4 + s, src->config().vocab, uint32_t(40 + s));
        r.max_tokens = 4;
        r.ignore_eos = true;
        r.lora = who[size_t(s) % who.size()];
        reqs.push_back(r);
    }
    const std::vector<ClientOutput> batch = client.run(reqs);
    for (size_t s = 0; s < reqs.size(); ++s) {
        const std::vector<ClientOutput> alone = client.run({reqs[s]});
        if (rt.world.rank == 0) CHECK(batch[s].tokens == alone[0].tokens);
    }
}

// Rank 0 converts `base` with adapter b16 merged into a tp x pp float folder; every rank loads its file.
void check_merged_layout(const std::string& base, int tp, int pp) {
#if defined(LATTICE_HAVE_OPENSSL)
    CAPTURE(base);
    CAPTURE(tp);
    CAPTURE(pp);
    const std::string dir = shared_temp_dir("lattice_lora_convert");
    if (mpi_session().rank() == 0) {
        auto src = open_model(lora_base_path(base));
        ConvertOptions o;
        o.out = dir + "/merged";
        o.tp = tp;
        o.pp = pp;
        o.lora_path = lora_dir(base) + "/b16";
        LocalComm alone;
        convert_checkpoint(*src, o, alone);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.model.max_batch_tokens = 64;
    ModelSpec spec;
    spec.path = dir + "/merged";
    RankRuntime rt = build(opt, spec);
    const LoraCases cases(base);
    const std::vector<float> got = rt.engine->score(cases.prompts[0]);
    if (rt.world.rank == 0) {
        const std::vector<float> ref = cases.logits("b16", 0);
        REQUIRE(got.size() == ref.size());
        const double err = rel_error(got.data(), ref.data(), ref.size());
        MESSAGE(base << " b16 merged by convert, tp " << tp << " pp " << pp << ": rel err " << err);
        CHECK(err < 1e-5);
    }
    remove_shared(dir);
#else
    (void)base, (void)tp, (void)pp;
    MESSAGE("built without OpenSSL: lattice convert cannot hash, the merged layouts are not checked");
#endif
}

}  // namespace

TEST_CASE("LoRA: tp and pp layouts equal the float64 merged reference") {
    const int world = mpi_session().size();
    int layouts = 0;
    for (const std::string base : {"tiny-llama2", "tp3-base"}) {
        auto src = open_model(lora_base_path(base));
        for (const auto& layout : {std::pair{world, 1}, std::pair{1, world}}) {
            try {
                check_model_layout(src->config().dims(), layout.first, layout.second);
            } catch (const Error&) {
                continue;  // the heads (or layers) do not allow this layout
            }
            check_layout(base, layout.first, layout.second);
            check_merged_layout(base, layout.first, layout.second);
            ++layouts;
        }
    }
    CHECK(layouts >= 1);
    if (world == 3) CHECK(layouts == 1);  // tp3-base at tp 3 (2 layers: no pp 3)
}
