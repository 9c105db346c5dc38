// A converted checkpoint that is damaged or does not fit the run fails with its own clear message:
// a flipped byte (with --verify; `lattice verify` names the file), a truncated file and a missing
// file (always, sizes are checked at every load), an edited manifest (its seal, at every load and in
// `lattice verify`), a manifest of another layout or another format version, a rank file copied over another rank's, quantization / smoothing / stage split that
// contradict the conversion, and conversions that must not start.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <vector>
#include <nlohmann/json.hpp>

#include "runtime/model/rank_weights.h"
#include "runtime/weights/converted_source.h"
#include "tests/runtime/converter/convert_test_util.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

void convert_to(const TensorSource& src, const std::string& out, QuantMode q, int tp = 1, int pp = 1) {
    ConvertOptions opt;
    opt.out = out;
    opt.tp = tp;
    opt.pp = pp;
    opt.quant = q;
    LocalComm world;
    convert_checkpoint(src, opt, world);
}

std::string load_error(const std::string& dir, BuildOptions opt, bool verify = false) {
    ModelSpec spec;
    spec.path = dir;
    spec.verify = verify;
    try {
        RankRuntime rt = build(opt, spec);
    } catch (const Error& e) {
        return e.what();
    }
    return "(loaded)";
}

bool contains(const std::string& s, const std::string& part) {
    if (s.find(part) != std::string::npos) return true;
    MESSAGE("\"" << part << "\" not in: " << s);
    return false;
}

}  // namespace

TEST_CASE("damaged files: flipped byte, truncated, missing") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-llama2"));
    const std::string dir = tmp / "c";
    convert_to(*src, dir, QuantMode::kW8A8);
    const std::string file = rank_file_name(0, 1), path = dir + "/" + file;
    const BuildOptions opt = cpu_options(1, 1, false, QuantMode::kW8A8);
    CHECK(load_error(dir, opt, true) == "(loaded)");
    CHECK(verify_converted(dir).ok());

    SUBCASE("a flipped byte: --verify and lattice verify name the file; a load without --verify does not hash") {
        const auto size = fs::file_size(path);
        {
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            f.seekg(std::streamoff(size - 100));
            char c = 0;
            f.read(&c, 1);
            c = char(c ^ 0x10);
            f.seekp(std::streamoff(size - 100));
            f.write(&c, 1);
        }
        const std::string e = load_error(dir, opt, true);
        CHECK(contains(e, path));
        CHECK(contains(e, "SHA-256"));
        CHECK(contains(e, "corrupt"));
        CHECK(load_error(dir, opt, false) == "(loaded)");
        const auto cv = verify_converted(dir);
        CHECK(cv.manifest.ok);
        CHECK_FALSE(cv.ok());
        const auto& v = cv.files;
        REQUIRE(v.size() == 1);
        CHECK_FALSE(v[0].ok);
        CHECK(v[0].path == file);
        CHECK(contains(v[0].problem, "SHA-256"));
    }
    SUBCASE("a truncated file: every load says so, no hashing needed") {
        fs::resize_file(path, fs::file_size(path) - 10);
        const std::string e = load_error(dir, opt);
        CHECK(contains(e, path));
        CHECK(contains(e, "the manifest says"));
        CHECK(contains(e, "truncated"));
        CHECK(contains(verify_converted(dir).files[0].problem, "truncated"));
    }
    SUBCASE("a missing file") {
        fs::remove(path);
        const std::string e = load_error(dir, opt);
        CHECK(contains(e, path));
        CHECK(contains(e, "missing"));
        CHECK(verify_converted(dir).files[0].problem == "missing");
    }
    SUBCASE("a manifest of another format version") {
        nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
        j["format_version"] = 7;
        std::ofstream(dir + "/manifest.json") << j.dump();
        const std::string e = load_error(dir, opt);
        CHECK(contains(e, "manifest.json"));
        CHECK(contains(e, "format version 7, but this lattice reads version 1"));
        CHECK_THROWS_AS(verify_converted(dir), Error);
    }
    SUBCASE("an edited manifest: every load refuses it by its seal; verify says so and still checks the files") {
        // Valid values a load would otherwise take, so only the seal can tell: w8a16 runs the same int8 files
        // with other activations, a rope base or an eos id changes every answer without an error.
        const std::string mpath = dir + "/manifest.json";
        const nlohmann::json orig = nlohmann::json::parse(std::ifstream(mpath));
        for (const auto& edit : std::vector<std::function<void(nlohmann::json&)>>{
                 [](auto& j) { j["quantization"]["mode"] = "w8a16"; },
                 [](auto& j) { j["config"]["rope_theta"] = 500000.0; },
                 [](auto& j) { j["config"]["eos_token_id"] = 3; },
                 [](auto& j) { j["config"]["hidden_size"] = 128; },
                 [](auto& j) { j["files"][0]["sha256"] = std::string(64, 'a'); }}) {
            nlohmann::json j = orig;
            edit(j);
            std::ofstream(mpath) << j.dump(4);
            CAPTURE(j.dump());
            const std::string e = load_error(dir, opt);
            CHECK(contains(e, mpath));
            CHECK(contains(e, "differs from its \"manifest_sha256\""));
            CHECK(contains(e, "edited or damaged"));
            const auto v = verify_converted(dir);
            CHECK(v.sealed);
            CHECK_FALSE(v.manifest.ok);
            CHECK(contains(v.manifest.problem, "edited or damaged"));
            CHECK_FALSE(v.ok());
            REQUIRE(v.files.size() == 1);
        }
        // Reformatted (other indentation, key order kept by the parser's sort): still intact.
        std::ofstream(mpath) << orig.dump(1);
        CHECK(load_error(dir, opt, true) == "(loaded)");
        CHECK(verify_converted(dir).ok());
        // A seal that is not a digest is a bad field.
        nlohmann::json bad = orig;
        bad["manifest_sha256"] = 5;
        std::ofstream(mpath) << bad.dump();
        CHECK(contains(load_error(dir, opt), "\"manifest_sha256\" is not 64 lowercase hex digits"));
        // Without the seal (an older conversion, or deleted for a deliberate edit): loads; verify says
        // the manifest is unchecked, and the whole is not "ok" though every file is.
        nlohmann::json unsealed = orig;
        unsealed.erase("manifest_sha256");
        std::ofstream(mpath) << unsealed.dump(2);
        CHECK(load_error(dir, opt, true) == "(loaded)");
        const auto v = verify_converted(dir);
        CHECK_FALSE(v.sealed);
        CHECK_FALSE(v.ok());
        CHECK(contains(v.manifest.problem, "no manifest_sha256"));
        CHECK(v.files.at(0).ok);
    }
    SUBCASE("a manifest of another layout") {
        nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
        j.erase("manifest_sha256");  // a deliberate edit (else its seal refuses it first)
        j["layout"]["pp"] = 2;
        j["layout"]["stage_layers"] = {1, 1};
        j["files"].push_back({{"path", rank_file_name(1, 2)},
                              {"kind", "rank"},
                              {"rank", 1},
                              {"bytes", 1},
                              {"sha256", std::string(64, '0')}});
        std::ofstream(dir + "/manifest.json") << j.dump();
        CHECK(contains(load_error(dir, opt),
                       "converted for tp 1 x pp 2 (2 rank(s), quant w8a8), but this run is tp 1 x pp 1"));
    }
}

TEST_CASE("layout, rank and settings that contradict the conversion") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-gqa-llama3"));  // 8 heads, 2 kv heads, 4 layers
    const std::string tp2 = tmp / "tp2", one = tmp / "one", pp2 = tmp / "pp2";
    convert_to(*src, tp2, QuantMode::kW8A16, 2, 1);
    convert_to(*src, one, QuantMode::kW8A8);
    convert_to(*src, pp2, QuantMode::kNone, 1, 2);

    // The folder names its layout and how to run it.
    const std::string e = load_error(tp2, cpu_options(1, 1, false, QuantMode::kW8A16));
    CHECK(contains(e, "converted for tp 2 x pp 1"));
    CHECK(contains(e, "--tp 2 --pp 1"));
    CHECK(contains(e, "this run is tp 1 x pp 1"));

    // Rank 1's file copied over rank 0's: same size, caught by the header.
    fs::copy_file(tp2 + "/" + rank_file_name(1, 2), tp2 + "/" + rank_file_name(0, 2),
                  fs::copy_options::overwrite_existing);
    std::string msg;
    try {
        open_converted_model(tp2, ConvertedRank{2, 1, 0});
    } catch (const Error& err) {
        msg = err.what();
    }
    CHECK(contains(msg, "rank 1; the manifest expects"));
    CHECK(verify_converted(tp2).files[0].ok == false);  // and the hash differs

    // Quantization: explicit settings must match; auto follows the folder.
    CHECK(contains(load_error(one, cpu_options(1, 1, false, QuantMode::kW8A16)),
                   "converted with --quant w8a8, but this run asks for --quant w8a16"));
    BuildOptions head = cpu_options(1, 1, false, QuantMode::kW8A8);
    head.model.quant_head = true;
    CHECK(contains(load_error(one, head), "--quant w8a8 --quant-head"));
    BuildOptions autoq = cpu_options(1, 1, false, QuantMode::kNone);
    autoq.quant_auto = true;
    {
        RankRuntime rt = build(autoq, spec_of(one));
        CHECK(rt.model->options().quant == QuantMode::kW8A8);
    }
    CHECK(contains(load_error(one, cpu_options(1, 1, false, QuantMode::kW8A8, tmp / "smooth.safetensors")),
                   "folded in at conversion"));

    // The stage split is the folder's: a rank loading other layers is refused.
    auto stage0 = open_converted_model(pp2, ConvertedRank{1, 2, 0});
    ModelOptions mo;
    mo.layer_begin = 0;
    mo.layer_end = 1;  // the folder's stage 0 holds layers [0, 2)
    mo.last_stage = false;
    CHECK_THROWS_WITH_AS(RankWeights(*stage0, mo), doctest::Contains("holds rank 0 of tp 1 x pp 2"), Error);
    mo.layer_end = 2;
    CHECK(RankWeights(*stage0, mo).tensors().size() == 1 + 2 * 6);  // embedding + 2 layers
}

TEST_CASE("conversions that must not start") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-fp16-tied"));  // 6 heads
    convert_to(*src, tmp / "c", QuantMode::kNone);
    CHECK_THROWS_WITH_AS(convert_to(*src, tmp / "c", QuantMode::kNone), doctest::Contains("already exists"), Error);
    auto conv = open_model(tmp / "c");
    CHECK_THROWS_WITH_AS(convert_to(*conv, tmp / "d", QuantMode::kNone), doctest::Contains("already a converted"),
                         Error);
    CHECK_THROWS_WITH_AS(convert_to(*src, tmp / "e", QuantMode::kNone, 4), doctest::Contains("num_attention_heads"),
                         Error);
    CHECK_THROWS_WITH_AS(convert_to(*src, tmp / "no/such/dir", QuantMode::kNone),
                         doctest::Contains("parent folder of --out does not exist"), Error);
    CHECK(!fs::exists(tmp / "d"));
    CHECK(!fs::exists(tmp / "e"));
}
