// lattice convert, single process: every golden checkpoint (HF and GGUF) converted for one rank with
// quant none / w8a16 / w8a8, with and without SmoothQuant factors, gives bit-identical logits and the
// same greedy tokens as loading the original with the same settings, while reading fewer bytes in
// int8 modes; tokenizer files travel (HF copies, a GGUF's vocab as tokenizer.gguf); an interrupted
// conversion (an error, or SIGKILL) leaves no folder that looks complete; the converter's peak
// resident memory stays near the largest tensor, far below the model's size (a `lattice convert`
// process on a 200 MB checkpoint, by the VmHWM it reports). The peak-memory case ("[peak-rss]") has a
// ctest entry of its own (test_convert_peak_rss): under AddressSanitizer RSS is meaningless, so there
// it reports SKIP instead of converting without a bound to check.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/weights/converted_source.h"
#include "runtime/weights/random_source.h"
#include "runtime/weights/safetensors.h"
#include "tests/runtime/converter/convert_test_util.h"
#include "tests/test_skip.h"

using namespace lattice;
using namespace lattice::testing;

extern char** environ;

namespace {

ConvertResult convert_one(const TensorSource& src, const std::string& out, QuantMode q, const std::string& smooth = {},
                          const std::string& source_path = {}, int tp = 1, int pp = 1) {
    ConvertOptions opt;
    opt.out = out;
    opt.tp = tp;
    opt.pp = pp;
    opt.quant = q;
    opt.smooth_path = smooth;
    opt.source_path = source_path;
    LocalComm world;
    return convert_checkpoint(src, opt, world);
}

bool has_partial(const fs::path& parent) {
    for (const auto& e : fs::directory_iterator(parent))
        if (e.path().filename().string().find(".partial-") != std::string::npos) return true;
    return false;
}

}  // namespace

TEST_CASE(
    "converted golden checkpoints: bit-identical logits and equal tokens to the original, per quant and smoothing") {
    TempDir tmp;
    int n = 0;
    for (const std::string& path : golden_checkpoints()) {
        auto src = open_model(path);
        const auto cases = load_golden(golden_name_of(path));
        const std::string smooth_file = tmp / (std::to_string(n) + ".smooth.safetensors");
        write_random_smooth(src->config(), smooth_file, uint32_t(n));
        for (QuantMode q : {QuantMode::kNone, QuantMode::kW8A16, QuantMode::kW8A8}) {
            for (bool smooth : {false, true}) {
                CAPTURE(path);
                CAPTURE(quant_mode_name(q));
                CAPTURE(smooth);
                const std::string sm = smooth ? smooth_file : std::string();
                const std::string out = tmp / std::to_string(n++);
                const ConvertResult cr = convert_one(*src, out, q, sm, path);
                CHECK(cr.folder == fs::absolute(out).lexically_normal().string());
                CHECK(cr.manifest.files.size() >= 1);
                RunResult want = run_built(build(cpu_options(1, 1, false, q, sm), *src), cases[0].prompt, 12);
                BuildOptions build_opt = cpu_options(1, 1, false, q);
                ModelSpec spec;
                spec.path = out;
                spec.verify = true;
                RunResult got = run_built(build(build_opt, spec), cases[0].prompt, 12);
                CHECK(same_bits(got.logits, want.logits));
                CHECK(got.tokens == want.tokens);
                CHECK(got.weight_bytes == want.weight_bytes);
                // Float: the same bytes, but for norm weights, which the converted file keeps in f32.
                if (q == QuantMode::kNone && !smooth) CHECK(got.bytes_read[0] <= want.bytes_read[0] * 102 / 100);
                if (q != QuantMode::kNone) CHECK(got.bytes_read[0] < want.bytes_read[0]);  // int8 on disk
                if (q == QuantMode::kNone && !smooth)
                    CHECK(want.tokens == std::vector<int32_t>(cases[0].greedy.begin(), cases[0].greedy.begin() + 12));
            }
        }
    }
}

TEST_CASE("converted block families (Qwen3, Gemma 2/3, Phi-3, Qwen3-MoE): bit-identical to the original") {
    // Their config keys (soft-caps, window pattern, local rope base, expert counts) written back by the
    // family's write_config, their extra norms as rank tensors, Phi-3's fused parts as q|k|v rows.
    TempDir tmp;
    int n = 0;
    for (const char* name : {"families/qwen3", "families/gemma2", "families/gemma3", "families/phi3",
                             "families/qwen3-moe"}) {
        auto src = open_model(golden_dir(name));
        const auto cases = load_golden(name);
        for (QuantMode q : {QuantMode::kNone, QuantMode::kW8A8}) {
            CAPTURE(name);
            CAPTURE(quant_mode_name(q));
            const std::string out = tmp / std::to_string(n++);
            convert_one(*src, out, q, "", golden_dir(name));
            RunResult want = run_built(build(cpu_options(1, 1, false, q, ""), *src), cases[0].prompt, 6);
            ModelSpec spec;
            spec.path = out;
            RunResult got = run_built(build(cpu_options(1, 1, false, q), spec), cases[0].prompt, 6);
            CHECK(same_bits(got.logits, want.logits));
            CHECK(got.tokens == want.tokens);
        }
    }
}

TEST_CASE("open_model of a single-rank converted folder; lattice info's view of it") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    convert_one(*src, tmp / "c", QuantMode::kW8A8);
    auto conv = open_model(tmp / "c");
    REQUIRE(conv->prepared() != nullptr);
    CHECK(conv->prepared()->quant == "w8a8");
    CHECK(conv->config().n_layers == src->config().n_layers);
    CHECK(conv->config().rope_inv_freq() == src->config().rope_inv_freq());
    CHECK(conv->describe().find("converted") != std::string::npos);
    CHECK(conv->info("model.layers.0.self_attn.qkv_proj.weight").dtype == DType::kI8);
    CHECK(conv->info("model.layers.0.self_attn.qkv_proj.weight_scale").dtype == DType::kF32);
    // The manifest's default KV cache (convert --kv-cache-dtype): a run takes it unless told otherwise.
    ConvertOptions o;
    o.out = tmp / "kv";
    o.quant = QuantMode::kW8A8;
    o.kv_cache_dtype = "int8";
    LocalComm world;
    convert_checkpoint(*src, o, world);
    BuildOptions b = test::cpu_options();
    b.quant_auto = true;
    CHECK(build(b, *open_model(tmp / "kv")).model->kv_dtype() == DType::kI8);
    b.model.kv_dtype = KvDtype::kF16;
    CHECK(build(b, *open_model(tmp / "kv")).model->kv_dtype() == DType::kF16);
}

TEST_CASE("tokenizer files: copied from a HF folder, a GGUF's vocab as tokenizer.gguf; listed with their hashes") {
    TempDir tmp;
    // A HF folder with tokenizer files: the golden weights plus a tokenizer.json.
    const fs::path hf = tmp.path / "hf";
    fs::create_directory(hf);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::create_symlink(golden_dir("tiny-llama2") + "/" + f, hf / f);
    {  // the fuzz seed of a byte-level BPE tokenizer.json, past its leading selector byte
        std::ifstream in(std::string(LATTICE_SOURCE_DIR) + "/tests/fuzz/seeds_tokenizer/bytelevel.json",
                         std::ios::binary);
        const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        REQUIRE(seed.size() > 1);
        std::ofstream(hf / "tokenizer.json", std::ios::binary) << seed.substr(1);
    }
    std::ofstream(hf / "tokenizer_config.json") << R"({"add_bos_token": true})";
    auto src = open_model(hf.string());
    const ConvertResult r = convert_one(*src, tmp / "c_hf", QuantMode::kNone, {}, hf.string());
    std::vector<std::string> toks;
    for (const auto& f : r.manifest.files)
        if (f.kind == "tokenizer") {
            toks.push_back(f.path);
            CHECK(f.sha256 == sha256_file(tmp / ("c_hf/" + f.path)));
        }
    CHECK(toks == std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"});
    const std::string text = "Hello Hello lo He";  // only what the seed's 10-token vocab can encode
    CHECK(load_tokenizer(tmp / "c_hf")->encode(text, true) == load_tokenizer(hf.string())->encode(text, true));

    const std::string gguf = std::string(LATTICE_SHARED_DIR) + "/golden/gguf/tiny-gqa-llama3.f16.gguf";
    auto gsrc = open_model(gguf);
    const ConvertResult g = convert_one(*gsrc, tmp / "c_gguf", QuantMode::kW8A16, {}, gguf);
    CHECK(g.manifest.files.back().path == "tokenizer.gguf");
    CHECK(load_tokenizer(tmp / "c_gguf")->encode(text, true) == load_tokenizer(gguf)->encode(text, true));
    CHECK(verify_converted(tmp / "c_gguf").files.size() == 2);
}

TEST_CASE("an interrupted conversion leaves no folder that looks complete") {
    TempDir tmp;
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const std::string out = tmp / "c";
    SUBCASE("an error mid-way: no folder, no partial folder") {
        ConvertOptions opt;
        opt.out = out;
        opt.quant = QuantMode::kW8A8;
        int seen = 0;
        opt.on_progress = [&](const ConvertProgress&) {
            if (++seen == 4) LATTICE_FAIL("disk full (simulated)");
        };
        LocalComm world;
        std::string msg;
        try {
            convert_checkpoint(*src, opt, world);
        } catch (const Error& e) {
            msg = e.what();
        }
        CHECK(msg.find("disk full (simulated)") != std::string::npos);
        CHECK(!fs::exists(out));
        CHECK(!has_partial(tmp.path));
    }
    SUBCASE("SIGKILL mid-way: only a hidden partial folder without a manifest, which no loader takes") {
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ConvertOptions opt;
            opt.out = out;
            opt.quant = QuantMode::kW8A8;
            int seen = 0;
            opt.on_progress = [&](const ConvertProgress&) {
                if (++seen == 4) ::raise(SIGKILL);
            };
            LocalComm world;
            try {
                convert_checkpoint(*src, opt, world);
            } catch (...) {
            }
            ::_exit(3);  // not reached: killed
        }
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        REQUIRE(WIFSIGNALED(status));
        CHECK(WTERMSIG(status) == SIGKILL);
        CHECK(!fs::exists(out));
        REQUIRE(has_partial(tmp.path));
        const fs::path partial = tmp.path / (".c.partial-" + std::to_string(child));
        CHECK(fs::exists(partial / rank_file_name(0, 1)));  // written in part
        CHECK(!fs::exists(partial / "manifest.json"));
        std::string msg;
        try {
            open_spec(spec_of(partial.string()));
        } catch (const Error& e) {
            msg = e.what();
        }
        CHECK(msg.find("interrupted") != std::string::npos);
        // Converting again works; the stale partial folder stays the user's to delete.
        convert_one(*src, out, QuantMode::kW8A8);
        CHECK(verify_converted(out).ok());
    }
}

namespace {

// Runs `lattice convert ARGS` and returns the peak resident set it reports (its own VmHWM, which
// is its own: unlike the rusage of a spawned child, it does not inherit the test process's peak).
[[maybe_unused]] int64_t convert_peak_rss(const std::vector<std::string>& args, const std::string& out_file) {
    const std::string bin = std::string(LATTICE_BINARY_DIR) + "/launch/lattice";
    REQUIRE_MESSAGE(fs::exists(bin), bin << " is missing: build the lattice target");
    std::vector<std::string> all = {bin, "convert"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    REQUIRE(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    std::ifstream f(out_file);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string key = "peak resident memory ";
    const auto at = text.find(key);
    REQUIRE_MESSAGE(at != std::string::npos, "no peak memory in: " << text);
    return std::stoll(text.substr(at + key.size())) << 20;
}

}  // namespace

TEST_CASE("[peak-rss] converting a 200 MB checkpoint costs a few times its largest tensor, not the model") {
#if LATTICE_TEST_SANITIZE
    LATTICE_SKIP("AddressSanitizer build: its shadow memory and quarantine make the converter's RSS meaningless; "
                 "peak-memory bound not checked");
#else
    TempDir tmp;
    ModelConfig c;
    c.source = "memory test";
    c.hidden = 1024;
    c.intermediate = 4096;
    c.n_layers = 6;
    c.n_heads = 16;
    c.n_kv_heads = 4;
    c.head_dim = 64;
    c.vocab = 8192;
    c.max_position = 256;
    {  // The checkpoint: a HF folder of bf16 random weights.
        auto rnd = make_random_source(c, 3, DType::kBF16);
        std::vector<std::string> names = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"};
        for (int64_t l = 0; l < c.n_layers; ++l)
            for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
                names.push_back("model.layers." + std::to_string(l) + "." + s);
        std::vector<std::vector<uint8_t>> data;
        std::vector<TensorToWrite> ts;
        for (const auto& nm : names) {
            const TensorInfo& ti = rnd->info(nm);
            data.emplace_back(size_t(ti.rows() * ti.cols() * 2));
            rnd->read(nm, 0, ti.rows(), 0, ti.cols(), DType::kBF16, data.back().data());
            ts.push_back({nm, DType::kBF16, ti.shape, data.back().data()});
        }
        fs::create_directory(tmp.path / "hf");
        write_safetensors(tmp / "hf/model.safetensors", ts);
        std::ofstream(tmp.path / "hf/config.json") << hf_config_json(c);
    }
    const int64_t model_bytes = int64_t(fs::file_size(tmp.path / "hf/model.safetensors"));
    const int64_t largest = 2 * c.intermediate * c.hidden * 2;  // fused gate|up in bf16 (== the embedding)
    const int64_t base = convert_peak_rss(
        {"--model", golden_dir("tiny-llama2"), "--out", tmp / "small", "--quant", "w8a8", "--progress", "none"},
        tmp / "small.out");
    const int64_t peak = convert_peak_rss(
        {"--model", tmp / "hf", "--out", tmp / "big", "--quant", "w8a8", "--progress", "none"}, tmp / "big.out");
    CHECK(verify_converted(tmp / "big").ok());
    MESSAGE("model " << model_bytes / (1 << 20) << " MiB, largest tensor " << largest / (1 << 20)
                     << " MiB; lattice convert peak RSS " << peak / (1 << 20) << " MiB, tiny-model baseline "
                     << base / (1 << 20) << " MiB");
    CHECK(model_bytes > 190 << 20);
    CHECK(peak - base < 5 * largest);
    CHECK(peak - base < model_bytes / 2);
#endif
}
