// lattice convert under mpirun (-np 2 and -np 4): for every TP x PP layout of the world size and
// every golden checkpoint (HF and GGUF) the layout fits, with quant none / w8a16 / w8a8, with and
// without SmoothQuant factors, the ranks convert in parallel (each writes its own files, rank 0 the
// manifest), and loading the converted folder gives logits bit-identical to loading the original
// with the same settings on the same layout, and the same greedy tokens on every rank. A parallel
// conversion writes the same bytes as one process converting alone; vocab padding (vocab % tp != 0)
// converts too; a folder of another layout is refused on every rank, with the same message, no hang.
// At -np 4 (three layouts) the quant x SmoothQuant settings rotate over the (layout, checkpoint) pairs:
// each pair runs two of the six settings and each layout all six across its checkpoints; -np 2 runs the
// whole product (the -np 4 product took 139 s of the 120 s a test may take on a loaded CI machine).
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstring>

#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"
#include "runtime/weights/converted_source.h"
#include "runtime/weights/random_source.h"
#include "tests/runtime/converter/convert_mpi_util.h"
#include "tests/runtime/converter/convert_test_util.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

std::vector<std::pair<int, int>> layouts_for(int world) {
    std::vector<std::pair<int, int>> out;
    for (int tp : {1, 2, 4})
        for (int pp : {1, 2, 4})
            if (tp * pp == world) out.emplace_back(tp, pp);
    return out;
}

ConvertResult convert(const TensorSource& src, Communicator& world, const std::string& out, int tp, int pp, QuantMode q,
                      const std::string& smooth = {}) {
    ConvertOptions opt;
    opt.out = out;
    opt.tp = tp;
    opt.pp = pp;
    opt.quant = q;
    opt.smooth_path = smooth;
    return convert_checkpoint(src, opt, world);
}

void compare(const RunResult& got, const RunResult& want, int rank) {
    if (rank == 0) {
        REQUIRE(got.logits.size() == want.logits.size());
        CHECK(same_bits(got.logits, want.logits));
    }
    CHECK(got.tokens == want.tokens);
}

}  // namespace

TEST_CASE("converted golden checkpoints equal the originals on every layout, converted in parallel") {
    const int world = mpi_session().size();
    const int rank = mpi_session().rank();
    ParallelContext ctx = make_parallel_context(world, 1, 60.0);  // the converting ranks: all of them
    const std::string dir = shared_temp_dir("lattice_convert_mpi");
    int n = 0, pair = 0;
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        for (const std::string& path : layout_checkpoints()) {
            auto src = open_model(path);
            if (!layout_fits(src->config(), tp, pp)) continue;
            const int this_pair = pair++;
            int setting = 0;
            const std::vector<int32_t> prompt = load_golden(golden_name_of(path))[0].prompt;
            const std::string smooth_file = dir + "/smooth" + std::to_string(n) + ".safetensors";
            if (rank == 0) write_random_smooth(src->config(), smooth_file, uint32_t(n));
            MPI_Barrier(MPI_COMM_WORLD);
            for (QuantMode q : {QuantMode::kNone, QuantMode::kW8A16, QuantMode::kW8A8}) {
                for (bool smooth : {false, true}) {
                    if (world == 4 && (setting++ + this_pair) % 3 != 0) continue;
                    CAPTURE(path);
                    CAPTURE(tp);
                    CAPTURE(pp);
                    CAPTURE(quant_mode_name(q));
                    CAPTURE(smooth);
                    const std::string sm = smooth ? smooth_file : std::string();
                    const std::string out = dir + "/c" + std::to_string(n++);
                    const ConvertResult cr = convert(*src, *ctx.world_comm, out, tp, pp, q, sm);
                    if (rank == 0) CHECK(cr.manifest.files.size() == size_t(tp * pp));
                    RunResult want = run_built(build(cpu_options(tp, pp, true, q, sm), *src), prompt, 8);
                    ModelSpec spec;
                    spec.path = out;
                    spec.verify = true;
                    RunResult got = run_built(build(cpu_options(tp, pp, true, q), spec), prompt, 8);
                    compare(got, want, rank);
                    CHECK(got.weight_bytes == want.weight_bytes);
                    if (q != QuantMode::kNone) CHECK(got.bytes_read[size_t(rank)] < want.bytes_read[size_t(rank)]);
                    // Each rank read exactly the tensors of its own file: no other rank's file, nothing twice
                    // (the rope frequency factors of a GGUF source are read when the file opens, not counted).
                    REQUIRE(got.bytes_read.size() == size_t(tp * pp));
                    for (int r = 0; r < tp * pp; ++r) {
                        auto file = open_converted_model(out, {tp, pp, r});
                        const int64_t rope = int64_t(file->rope_freq_factors().size() * sizeof(float));
                        CHECK(got.bytes_read[size_t(r)] == file->total_bytes() - rope);
                    }
                    remove_shared(out);
                }
            }
        }
    }
    remove_shared(dir);
}

TEST_CASE("a parallel conversion writes the bytes one process writes alone") {
    const int world = mpi_session().size();
    const int rank = mpi_session().rank();
    ParallelContext ctx = make_parallel_context(world, 1, 60.0);
    const std::string dir = shared_temp_dir("lattice_convert_mpi");
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    // More files than ranks: each rank writes several (world 2: 4 files; world 4: 8 files).
    const int tp = 2, pp = world == 2 ? 2 : 4;
    const ConvertResult par = convert(*src, *ctx.world_comm, dir + "/par", tp, pp, QuantMode::kW8A8);
    if (rank == 0) {
        LocalComm alone;
        ConvertOptions opt;
        opt.out = dir + "/alone";
        opt.tp = tp;
        opt.pp = pp;
        opt.quant = QuantMode::kW8A8;
        const ConvertResult one = convert_checkpoint(*src, opt, alone);
        REQUIRE(par.manifest.files.size() == size_t(tp * pp));
        REQUIRE(one.manifest.files.size() == par.manifest.files.size());
        for (size_t i = 0; i < one.manifest.files.size(); ++i) {
            CHECK(one.manifest.files[i].sha256 == par.manifest.files[i].sha256);
            CHECK(one.manifest.files[i].rank == int(i));
        }
    }
    remove_shared(dir);
}

TEST_CASE("vocab padding (vocab % tp != 0, random weights): converted equals original") {
    const int world = mpi_session().size();
    const int rank = mpi_session().rank();
    ParallelContext ctx = make_parallel_context(world, 1, 60.0);
    const std::string dir = shared_temp_dir("lattice_convert_mpi");
    ModelConfig cfg;
    cfg.source = "test";
    cfg.hidden = 64;
    cfg.intermediate = 96;
    cfg.n_layers = 4;
    cfg.n_heads = 4;
    cfg.n_kv_heads = 1;
    cfg.head_dim = 16;
    cfg.vocab = 301;
    cfg.max_position = 128;
    cfg.tie_embeddings = true;  // and a tied head, quantized on the last stage
    cfg.eos_ids = {2};
    auto src = make_random_source(cfg, 7, DType::kF32);
    const std::vector<int32_t> prompt = {1, 17, 300, 42, 99, 250, 3};
    int n = 0;
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        CAPTURE(tp);
        CAPTURE(pp);
        ConvertOptions opt;
        opt.out = dir + "/v" + std::to_string(n++);
        opt.tp = tp;
        opt.pp = pp;
        opt.quant = QuantMode::kW8A8;
        opt.quant_head = true;
        convert_checkpoint(*src, opt, *ctx.world_comm);
        BuildOptions build_opt = cpu_options(tp, pp, true, QuantMode::kW8A8);
        build_opt.model.quant_head = true;
        RunResult want = run_built(build(build_opt, *src), prompt, 12);
        RunResult got = run_built(build(build_opt, spec_of(opt.out)), prompt, 12);
        compare(got, want, rank);
        for (int32_t t : got.tokens) CHECK(t < cfg.vocab);
    }
    remove_shared(dir);
}

TEST_CASE("a folder of another layout: every rank refuses it with the same message, nobody hangs") {
    const int world = mpi_session().size();
    const std::string dir = shared_temp_dir("lattice_convert_mpi");
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    if (mpi_session().rank() == 0) {
        LocalComm alone;
        ConvertOptions opt;
        opt.out = dir + "/one";
        convert_checkpoint(*src, opt, alone);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    std::string msg;
    try {
        RankRuntime rt = build(cpu_options(world, 1, true, QuantMode::kNone), spec_of(dir + "/one"));
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("converted for tp 1 x pp 1 (1 rank(s), quant none), but this run is tp " + std::to_string(world) +
                   " x pp 1") != std::string::npos);
    remove_shared(dir);
}
