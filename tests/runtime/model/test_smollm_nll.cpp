// The default SmolLM2-135M-Instruct (Q4_1 GGUF, models/ of the checkout, installed by
// scripts/setup.sh): mean NLL per token of a fixed English paragraph for fp32, W8A16, W8A8 and
// W8A8 + SmoothQuant (calibrated on a different text), and f32 weights with f32, f16 and INT8 KV caches
// (INT8 within 0.01 nats of f16). W8A16 must stay within 2% of fp32 and W8A8 within 5% (the accuracy
// each quantization mode is held to); W8A8 + SmoothQuant must not be worse than plain W8A8 by more than
// W8A8's own noise (0.03 nats). A missing model file is a failure, not a skip: CI installs it.
#include "tests/test_paths.h"
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/model/smoothquant.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/model/nll.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

// Evaluation text (written for this test).
const char* kEvalText =
    "The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night, its keeper "
    "climbed the narrow stairs to light the lamp, and every morning he wrote a few lines in a thick leather book: "
    "the weather, the ships that passed, and anything unusual he had seen on the water. When the last keeper retired, "
    "the town council decided to turn the building into a small museum. Volunteers cleaned the rooms, repaired the "
    "windows and painted the walls white again. The leather books were placed in a glass case near the entrance, "
    "so that visitors could read about storms, rescues and quiet summer evenings from long ago. Children liked the "
    "top of the tower best, where the great lens still turned slowly in the sunlight and threw small rainbows "
    "across the floor. Teachers brought their classes in the spring to learn about navigation, tides and the "
    "history of the coast. Some visitors came only for the view, which on a clear day reached all the way to the "
    "islands in the north. Others sat for hours in the reading room, copying passages from the old books into their "
    "notebooks. The museum does not earn much money, but the town believes it is worth keeping open, because it "
    "reminds everyone that the sea is both generous and dangerous, and that people once watched over it with great "
    "care.";

// Calibration text: different topic and words, so the test does not calibrate on what it scores.
const char* kCalibText =
    "To make a simple loaf of bread, mix flour, water, salt and a little yeast in a large bowl. Knead the dough on a "
    "floured table for about ten minutes, until it feels smooth and elastic. Cover it with a damp cloth and let it "
    "rise in a warm place for an hour, or until it has doubled in size. Then press out the air, shape it into a "
    "round loaf and place it on a baking tray. Let it rise again while the oven heats up. Bake it for thirty to "
    "forty minutes; the bread is ready when the crust is golden brown and the bottom sounds hollow when you tap it. "
    "Computers store numbers in binary, using only the digits zero and one. A group of eight bits is called a byte, "
    "and it can represent two hundred and fifty six different values. Programs are lists of instructions that the "
    "processor reads from memory and executes one after another, many millions of times per second. In 1969, "
    "astronauts landed on the Moon for the first time, and millions of people watched the pictures on television. "
    "Mountains form when the plates of the Earth's crust push against each other over millions of years.";

std::string model_path() {
    return test::default_model_file();
}

// The default model (scripts/setup.sh installs it; CI does) and kEvalText's ids.
struct Smol {
    std::unique_ptr<TensorSource> src;
    std::unique_ptr<Tokenizer> tok;
    std::vector<int32_t> ids;
};
Smol open_smol() {
    const std::string path = model_path();
    REQUIRE_MESSAGE(std::filesystem::exists(path),
                    path << " is missing: run scripts/setup.sh (it installs the default model; CI does)");
    Smol m{open_model(path), load_tokenizer(path), {}};
    m.ids = m.tok->encode(kEvalText, m.tok->add_bos_default());
    return m;
}

double nll_of(const TensorSource& src, const ModelOptions& mo, const std::vector<int32_t>& ids) {
    CpuBackend be(CpuBackendOptions{2, false, false});
    Model model(src, be, mo, nullptr);
    auto gen = make_local_engine(model);
    return mean_nll(gen->score(ids), ids, src.config().vocab);
}

}  // namespace

TEST_CASE("SmolLM2-135M: NLL per token of fp32, W8A16, W8A8, W8A8 + SmoothQuant") {
    const Smol smol = open_smol();
    const TensorSource* src = smol.src.get();
    const std::vector<int32_t>& ids = smol.ids;
    const std::vector<int32_t> calib = smol.tok->encode(kCalibText, smol.tok->add_bos_default());
    REQUIRE(ids.size() > 250);
    REQUIRE(calib.size() > 200);

    const std::string smooth =
        (std::filesystem::temp_directory_path() / ("lattice_smollm_" + std::to_string(getpid()) + ".safetensors"))
            .string();
    struct Remove {
        std::string p;
        ~Remove() { std::filesystem::remove(p); }
    } remove{smooth};
    auto t0 = std::chrono::steady_clock::now();
    {
        CpuBackend be(CpuBackendOptions{2, false, false});
        ModelOptions mo;
        mo.max_seq = 512;
        Model model(*src, be, mo, nullptr);
        ActivationStats st = collect_activation_stats(model, calib, 512);
        write_smooth_factors(smooth, compute_smooth_factors(*src, st, 0.5));
    }
    const double calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const double f32 = nll_of(*src, quant_options(QuantMode::kNone, {}, 512), ids);
    const double w16 = nll_of(*src, quant_options(QuantMode::kW8A16, {}, 512), ids);
    const double w8 = nll_of(*src, quant_options(QuantMode::kW8A8, {}, 512), ids);
    const double w8s = nll_of(*src, quant_options(QuantMode::kW8A8, smooth, 512), ids);
    MESSAGE("SmolLM2-135M NLL/token over " << ids.size() - 1 << " tokens: fp32 " << f32 << ", W8A16 " << w16 << " ("
                                           << 100 * (w16 / f32 - 1) << "%), W8A8 " << w8 << " (" << 100 * (w8 / f32 - 1)
                                           << "%), W8A8+SmoothQuant " << w8s << " (" << 100 * (w8s / f32 - 1)
                                           << "%); calibration on " << calib.size() << " tokens took " << calib_s
                                           << " s (load included)");
    CHECK(f32 > 0.5);
    CHECK(f32 < 4.5);
    CHECK(std::fabs(w16 / f32 - 1) < 0.02);
    CHECK(std::fabs(w8 / f32 - 1) < 0.05);
    CHECK(std::fabs(w8s / f32 - 1) < 0.05);
    // Quantization did happen: the NLLs differ from fp32.
    CHECK(w16 != f32);
    CHECK(w8 != f32);
    CHECK(w8s != w8);
    // Smoothing must not cost accuracy beyond the noise of W8A8 itself: on this model (no strong
    // outlier channels) W8A8's NLL moves by ~0.03 nats between code versions and machines through
    // activation rounding (3.347 on 2026-11-29, 3.315 on 2026-12-03, same model and text), and
    // SmoothQuant measured -0.027 then and +0.013 now. Where smoothing must help (planted outliers)
    // test_smoothquant asserts it.
    CHECK(w8s < w8 + 0.03);
}

TEST_CASE("SmolLM2-135M: NLL per token with an INT8 KV cache within 0.01 nats of an f16 one") {
    const Smol smol = open_smol();
    const TensorSource* src = smol.src.get();
    const std::vector<int32_t>& ids = smol.ids;
    const auto with_kv = [&](KvDtype kv) {
        ModelOptions mo = quant_options(QuantMode::kNone, {}, 512);
        mo.kv_dtype = kv;
        return nll_of(*src, mo, ids);
    };
    const double f32 = with_kv(KvDtype::kF32), f16 = with_kv(KvDtype::kF16), i8 = with_kv(KvDtype::kInt8);
    MESSAGE("SmolLM2-135M NLL/token over " << ids.size() - 1 << " tokens by KV cache: f32 " << f32 << ", f16 " << f16
                                           << ", int8 " << i8 << " (int8 - f16 = " << i8 - f16 << ")");
    CHECK(std::fabs(i8 - f16) < 0.01);
    CHECK(std::fabs(f16 - f32) < 0.01);
    CHECK(i8 != f16);  // the cache did change: int8 rows are not f16's
}

TEST_CASE("SmolLM2-135M: W4A8 and W4A16 from the Q4_1 blocks within 0.05 nats of the same file in fp32") {
    // The bound for 4-bit: the GGUF's own Q4_1 blocks (nothing rounded again) against the same blocks
    // dequantized to f32; the W4A8 - fp32 gap is activation rounding alone (8-bit per token), the W4A16 one
    // the kernels' float order. The LM head (Q8_0 in this file) is int8 in both 4-bit runs, as --quant auto
    // runs it (rank_weights.h), which adds W8A8's head rounding to W4A8 and W8A16's to W4A16.
    const Smol smol = open_smol();
    const TensorSource* src = smol.src.get();
    const std::vector<int32_t>& ids = smol.ids;
    REQUIRE(src->info("model.layers.0.mlp.down_proj.weight").dtype == DType::kQ4_1);
    auto with_head = [](QuantMode q) {
        ModelOptions mo = quant_options(q, {}, 512);
        mo.quant_head = true;
        return mo;
    };
    const double f32 = nll_of(*src, quant_options(QuantMode::kNone, {}, 512), ids);
    const double w4a8 = nll_of(*src, with_head(QuantMode::kW4A8), ids);
    const double w4a16 = nll_of(*src, with_head(QuantMode::kW4A16), ids);
    MESSAGE("SmolLM2-135M NLL/token over " << ids.size() - 1 << " tokens: fp32 " << f32 << ", W4A8 " << w4a8 << " ("
                                           << w4a8 - f32 << " nats), W4A16 " << w4a16 << " (" << w4a16 - f32
                                           << " nats)");
    CHECK(std::fabs(w4a8 - f32) < 0.05);
    CHECK(std::fabs(w4a16 - f32) < 0.05);
    CHECK(w4a8 != f32);  // the activations were rounded
}
