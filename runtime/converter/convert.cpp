// convert_checkpoint (see convert.h).
#include "runtime/converter/convert.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "parallel/world_config.h"
#include "runtime/arch/architecture.h"
#include "runtime/converter/lora_merge.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/gguf_writer.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/sha256.h"

namespace lattice {

namespace {

namespace fs = std::filesystem;

// Tokenizer files copied from a Hugging Face folder when present.
const char* const kHfTokenizerFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                         "special_tokens_map.json"};

// One file's result as gathered to rank 0: fixed size, so one all_gather carries every rank's.
struct FileRecord {
    int64_t file = -1;  // rank file index, -1: empty slot
    int64_t bytes = 0;
    char sha256[64] = {};
};
struct RankRecord {
    int64_t failed = 0;
    char message[440] = {};  // the failing rank's error, for every rank's message
};

void fsync_path(const fs::path& p, bool directory) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
    LATTICE_CHECK(fd >= 0, "{}: cannot open to sync ({})", p.string(), std::strerror(errno));
    const int rc = ::fsync(fd);
    ::close(fd);
    LATTICE_CHECK(rc == 0, "{}: fsync failed ({})", p.string(), std::strerror(errno));
}

// What rank file `file` of the tp x pp layout holds: the builder's mapping (rank_model_options), for
// the rank that will load it, with the conversion's quantization and smoothing.
ModelOptions file_options(const ConvertOptions& convert, const ModelConfig& cfg, int file) {
    ModelOptions base;
    base.quant = convert.quant;
    base.quant_head = convert.quant_head;
    base.smooth_path = convert.smooth_path;
    const WorldConfig loader = WorldConfig::make(convert.tp * convert.pp, convert.tp, convert.pp, file);
    return rank_model_options(base, loader, cfg.n_layers, convert.pp_layers);
}

// How a 4-bit run's linear is stored: the checkpoint's own group and kind when it is read in 4 bits, else what
// quantize_int4 makes of the float weights (affine groups of 32, the backends' make_linear).
struct Int4Layout {
    int64_t group = kInt4Block;
    Int4Kind kind = Int4Kind::kAffine;
    bool perm = false;
};
Int4Layout int4_layout(const RankTensor& t) {
    return t.int4 ? Int4Layout{t.int4_group, t.int4_kind, t.int4_perm} : Int4Layout{};
}

// The tensors of one rank's file, in write order: each RankWeights tensor (int8 linears as the
// weight and its scales; 4-bit ones as their parts, manifest.h), then the rope frequency factors of a GGUF
// source. `meta` gets the header metadata the 4-bit tensors need.
std::vector<SafetensorsSpec> file_specs(const RankWeights& rw, const TensorSource& src,
                                        std::map<std::string, std::string>* meta = nullptr) {
    std::vector<SafetensorsSpec> specs;
    for (const RankTensor& t : rw.tensors()) {
        const std::vector<int64_t> shape =
            t.vector ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.rows, t.cols};
        if (is_int4(t.mode)) {
            const Int4Layout l = int4_layout(t);
            const int64_t kp = (t.cols + l.group - 1) / l.group * l.group, groups = kp / l.group;
            specs.push_back({t.name, DType::kU8, {t.rows, kp / 2}});
            specs.push_back({t.name + kInt4ScaleSuffix, DType::kF16, {t.rows, groups}});
            if (l.kind == Int4Kind::kAffine) specs.push_back({t.name + kInt4MinSuffix, DType::kF16, {t.rows, groups}});
            if (l.kind == Int4Kind::kZeroPoint)
                specs.push_back({t.name + kInt4ZeroSuffix, DType::kU8, {t.rows, groups}});
            if (l.perm) specs.push_back({t.name + kInt4PermSuffix, DType::kI32, {t.cols}});
            if (meta) (*meta)[kInt4MetaPrefix + t.name] = int4_meta_value(t.cols, l.group, l.kind);
        } else if (t.mode != QuantMode::kNone) {
            specs.push_back({t.name, DType::kI8, shape});
            specs.push_back({t.name + kScaleSuffix, DType::kF32, {t.rows}});
        } else {
            specs.push_back({t.name, t.dtype, shape});
        }
    }
    const std::vector<float> f = src.rope_freq_factors();
    if (!f.empty()) specs.push_back({kGgufRopeFreqs, DType::kF32, {int64_t(f.size())}});
    return specs;
}

// A 4-bit linear's parts in file_specs' order; returns the bytes written.
int64_t write_int4(SafetensorsWriter& w, const RankTensor& t, const Int4Weights& q) {
    const Int4Layout l = int4_layout(t);
    LATTICE_CHECK(q.n == t.rows && q.k == t.cols && q.group == l.group && q.kind == l.kind &&
                      q.perm.empty() == !l.perm && (q.perm.empty() || int64_t(q.perm.size()) == t.cols),
                  "convert: 4-bit \"{}\" came as [{}, {}] {} groups of {}, planned [{}, {}] {} groups of {}", t.name,
                  q.n, q.k, int4_kind_name(q.kind), q.group, t.rows, t.cols, int4_kind_name(l.kind), l.group);
    int64_t b = 0;
    auto put = [&](const std::string& name, const void* data, size_t bytes) {
        w.write(name, data, int64_t(bytes));
        b += int64_t(bytes);
    };
    put(t.name, q.qs.data(), q.qs.size());
    put(t.name + kInt4ScaleSuffix, q.d.data(), q.d.size() * sizeof(uint16_t));
    if (l.kind == Int4Kind::kAffine) put(t.name + kInt4MinSuffix, q.m.data(), q.m.size() * sizeof(uint16_t));
    if (l.kind == Int4Kind::kZeroPoint) put(t.name + kInt4ZeroSuffix, q.z.data(), q.z.size());
    if (l.perm) put(t.name + kInt4PermSuffix, q.perm.data(), q.perm.size() * sizeof(int32_t));
    return b;
}

int64_t data_bytes(const std::vector<SafetensorsSpec>& specs) {
    int64_t b = 0;
    for (const auto& s : specs) b += s.bytes();
    return b;
}

// Tokenizer files into `dir`; returns their names.
std::vector<std::string> write_tokenizer(const std::string& source, const fs::path& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    if (source.empty()) return names;
    if (fs::is_directory(source, ec)) {
        for (const char* n : kHfTokenizerFiles) {
            if (!fs::is_regular_file(fs::path(source) / n, ec)) continue;
            fs::copy_file(fs::path(source) / n, dir / n, ec);
            LATTICE_CHECK(!ec, "{}: cannot copy to {} ({})", (fs::path(source) / n).string(), dir.string(),
                          ec.message());
            names.push_back(n);
        }
    } else if (fs::is_regular_file(source, ec)) {
        auto g = GgufFile::open(source);
        if (g->has("tokenizer.ggml.model")) {
            write_gguf_metadata((dir / "tokenizer.gguf").string(), *g, gguf_tokenizer_keys(*g));
            names.push_back("tokenizer.gguf");
        }
    }
    if (names.empty()) LOG_WARN("{}: no tokenizer files found; the converted folder has none", source);
    return names;
}

// Partial folders ".NAME.partial-PID" of conversions whose process is gone (killed with SIGKILL, a lost
// node): removed, and said, before a new conversion to NAME starts. A live pid's folder is left alone.
void remove_stale_partials(const fs::path& parent, const std::string& name) {
    const std::string prefix = "." + name + ".partial-";
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
        const std::string f = e.path().filename().string();
        if (!f.starts_with(prefix)) continue;
        const std::string digits = f.substr(prefix.size());
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
        const pid_t pid = pid_t(std::stol(digits));
        if (pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH)) continue;  // alive (or not ours to judge)
        std::error_code rm;
        const auto removed = fs::remove_all(e.path(), rm);
        LOG_WARN("convert: removed {} ({} files) left by an interrupted conversion (pid {} is gone){}",
                 e.path().string(), removed == static_cast<std::uintmax_t>(-1) ? 0 : removed, pid,
                 rm ? "; failed: " + rm.message() : "");
    }
}

ConvertResult convert_source(const TensorSource& src, const ConvertOptions& opt, Communicator& world);

}  // namespace

ConvertResult convert_checkpoint(const TensorSource& src, const ConvertOptions& opt, Communicator& world) {
    LATTICE_CHECK(src.prepared() == nullptr, "{} is already a converted checkpoint", src.describe());
    if (opt.lora_path.empty()) return convert_source(src, opt, world);
    fs::path p = fs::path(opt.lora_path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    const std::string name = !opt.lora_name.empty() ? opt.lora_name : p.filename().empty() ? opt.lora_path
                                                                                           : p.filename().string();
    const LoraMergedSource merged(src, name, opt.lora_path, opt.lora_scale);
    LOG_INFO("convert: merging adapter '{}' (rank {}, {} tensors) at scale {:g}", merged.adapter().name,
             merged.adapter().rank, merged.merged_tensors(), merged.scale());
    return convert_source(merged, opt, world);
}

namespace {

ConvertResult convert_source(const TensorSource& src, const ConvertOptions& opt, Communicator& world) {
    const auto t0 = SteadyClock::now();
    const ModelConfig& cfg = src.config();
    LATTICE_CHECK(src.prepared() == nullptr, "{} is already a converted checkpoint", src.describe());
    LATTICE_CHECK(!opt.out.empty(), "convert: no output folder given");
    LATTICE_CHECK(!opt.quant_head || opt.quant != QuantMode::kNone, "convert: --quant-head needs an int8 --quant");
    check_tensor_set(src);  // what a load of the original would refuse is not converted either
    check_model_layout(cfg.dims(), opt.tp, opt.pp);
    const auto stages = stage_layer_ranges(cfg.n_layers, opt.pp, opt.pp_layers);
    const int W = world.size(), me = world.rank(), files = opt.tp * opt.pp;

    fs::path out = fs::absolute(fs::path(opt.out)).lexically_normal();
    if (out.filename().empty()) out = out.parent_path();
    const fs::path parent = out.parent_path();

    // Rank 0 creates the hidden partial folder; every rank learns its name (rank 0's pid).
    int32_t pid = 0;
    std::string start_error;
    if (me == 0) {
        try {
            std::error_code ec;
            LATTICE_CHECK(fs::is_directory(parent, ec), "{}: the parent folder of --out does not exist",
                          parent.string());
            LATTICE_CHECK(!fs::exists(out, ec), "{} already exists: remove it or choose another --out", out.string());
            remove_stale_partials(parent, out.filename().string());
            const fs::path tmp = parent / ("." + out.filename().string() + ".partial-" + std::to_string(::getpid()));
            LATTICE_CHECK(fs::create_directory(tmp, ec) && !ec, "{}: cannot create ({})", tmp.string(),
                          ec ? ec.message() : "exists");
            pid = int32_t(::getpid());
        } catch (const Error& e) {
            start_error = e.message();
        }
    }
    world.broadcast(View::contiguous(&pid, DType::kI32, {1}), 0);
    if (pid == 0) {
        LATTICE_CHECK(me != 0, "{}", start_error);
        LATTICE_FAIL("convert: rank 0 could not create the output folder (see its error)");
    }
    const fs::path tmp = parent / ("." + out.filename().string() + ".partial-" + std::to_string(pid));

    // This rank's files.
    const int slots = (files + W - 1) / W;
    std::vector<FileRecord> mine(static_cast<size_t>(slots));
    RankRecord status;
    ConvertResult result;
    try {
        std::vector<int> my_files;
        for (int f = me; f < files; f += W) my_files.push_back(f);
        ConvertProgress prog;
        prog.files_total = int(my_files.size());
        for (int f : my_files) {
            RankWeights rw(src, file_options(opt, cfg, f));
            prog.bytes_total += data_bytes(file_specs(rw, src));
        }
        for (size_t i = 0; i < my_files.size(); ++i) {
            const int f = my_files[i];
            RankWeights rw(src, file_options(opt, cfg, f));
            std::map<std::string, std::string> meta = {
                {"format", kConvertedFormat},   {"format_version", std::to_string(kConvertedFormatVersion)},
                {"tp", std::to_string(opt.tp)}, {"pp", std::to_string(opt.pp)},
                {"rank", std::to_string(f)},    {"quant", std::string(quant_mode_name(opt.quant))}};
            const std::vector<SafetensorsSpec> specs = file_specs(rw, src, &meta);
            const std::string name = rank_file_name(f, files);
            prog.file = name;
            SafetensorsWriter w((tmp / name).string(), specs, meta);
            for (const RankTensor& t : rw.tensors()) {
                HostTensor h = rw.read(t);
                if (is_int4(t.mode)) {  // the checkpoint's 4-bit blocks as read, or float quantized as a load would
                    if (!h.int4()) h = quantize_int4(h, t.name);
                    prog.bytes_done += write_int4(w, t, h.q4);
                } else if (t.mode != QuantMode::kNone) {
                    h = quantize_per_channel(h, t.name);
                    w.write(t.name, h.data.data(), int64_t(h.data.size()));
                    w.write(t.name + kScaleSuffix, h.scales.data(), int64_t(h.scales.size() * sizeof(float)));
                    prog.bytes_done += int64_t(h.data.size() + h.scales.size() * sizeof(float));
                } else {
                    w.write(t.name, h.data.data(), int64_t(h.data.size()));
                    prog.bytes_done += int64_t(h.data.size());
                }
                h = {};
                src.release_pages();
                if (opt.on_progress) opt.on_progress(prog);
                LATTICE_CHECK(!opt.interrupted || !opt.interrupted(), "interrupted by a signal");
            }
            const std::vector<float> freqs = src.rope_freq_factors();
            if (!freqs.empty()) w.write(kGgufRopeFreqs, freqs.data(), int64_t(freqs.size() * sizeof(float)));
            const SafetensorsWriter::Result r = w.finish();
            mine[i].file = f;
            mine[i].bytes = r.bytes;
            std::memcpy(mine[i].sha256, r.sha256.data(), 64);
            result.bytes_written += r.bytes;
            ++prog.files_done;
            if (opt.on_progress) opt.on_progress(prog);
        }
    } catch (const Error& e) {
        status.failed = 1;
        std::snprintf(status.message, sizeof(status.message), "rank %d: %s", me, e.message().c_str());
    }

    // Gather every rank's status and file records (fixed-size bytes per rank).
    const int64_t per = int64_t(sizeof(RankRecord) + slots * sizeof(FileRecord));
    std::vector<uint8_t> send(static_cast<size_t>(per)), all(static_cast<size_t>(per * W));
    std::memcpy(send.data(), &status, sizeof(status));
    std::memcpy(send.data() + sizeof(status), mine.data(), mine.size() * sizeof(FileRecord));
    world.all_gather(View::contiguous(all.data(), DType::kU8, {per * W}),
                     View::contiguous(send.data(), DType::kU8, {per}));

    Manifest manifest;
    manifest.writer = opt.writer;
    manifest.source = src.describe();
    manifest.config = cfg;
    manifest.tp = opt.tp;
    manifest.pp = opt.pp;
    for (const auto& [b, e] : stages) manifest.stage_layers.push_back(e - b);
    manifest.quant = std::string(quant_mode_name(opt.quant));
    manifest.quant_head = opt.quant_head;
    manifest.kv_cache_dtype = kv_dtype_name(parse_kv_dtype(opt.kv_cache_dtype));  // (checked: a name it knows)
    std::string failure;
    for (int r = 0; r < W; ++r) {
        RankRecord rr;
        std::memcpy(&rr, all.data() + r * per, sizeof(rr));
        if (rr.failed && failure.empty()) failure = std::string(rr.message, strnlen(rr.message, sizeof(rr.message)));
        for (int s = 0; s < slots; ++s) {
            FileRecord fr;
            std::memcpy(&fr, all.data() + r * per + int64_t(sizeof(RankRecord)) + s * int64_t(sizeof(FileRecord)),
                        sizeof(fr));
            if (fr.file < 0) continue;
            ManifestFile mf;
            mf.path = rank_file_name(int(fr.file), files);
            mf.kind = "rank";
            mf.rank = int(fr.file);
            mf.bytes = fr.bytes;
            mf.sha256.assign(fr.sha256, 64);
            manifest.files.push_back(mf);
        }
    }
    std::sort(manifest.files.begin(), manifest.files.end(),
              [](const ManifestFile& a, const ManifestFile& b) { return a.rank < b.rank; });

    // Rank 0 finishes: tokenizer, manifest (last), sync, rename; then tells everyone.
    int32_t done = failure.empty() ? 1 : 0;
    if (me == 0) {
        if (done) {
            try {
                if (!opt.smooth_path.empty()) {
                    manifest.smooth = fs::path(opt.smooth_path).filename().string();
                    manifest.smooth_sha256 = sha256_file(opt.smooth_path);
                }
                for (const std::string& n : write_tokenizer(opt.source_path, tmp)) {
                    ManifestFile mf;
                    mf.path = n;
                    mf.kind = "tokenizer";
                    mf.bytes = int64_t(fs::file_size(tmp / n));
                    mf.sha256 = sha256_file((tmp / n).string());
                    fsync_path(tmp / n, false);
                    manifest.files.push_back(mf);
                }
                parse_manifest(manifest_json(manifest), "manifest.json being written");  // what a loader will accept
                {
                    std::ofstream f(tmp / "manifest.json", std::ios::binary | std::ios::trunc);
                    f << manifest_json(manifest);
                    f.flush();
                    LATTICE_CHECK(f.good(), "{}: write failed", (tmp / "manifest.json").string());
                }
                fsync_path(tmp / "manifest.json", false);
                fsync_path(tmp, true);
                LATTICE_CHECK(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0,
                              "{}: cannot rename {} to it ({})", out.string(), tmp.string(), std::strerror(errno));
                fsync_path(parent, true);
            } catch (const Error& e) {
                done = 0;
                failure = "rank 0: " + e.message();
            }
        }
        if (!done) {
            std::error_code ec;
            fs::remove_all(tmp, ec);
        }
    }
    world.broadcast(View::contiguous(&done, DType::kI32, {1}), 0);
    if (!done)
        LATTICE_FAIL("convert to {} failed: {}", out.string(),
                     failure.empty() ? std::string("rank 0 could not finish (see its error)") : failure);
    result.folder = out.string();
    result.manifest = std::move(manifest);
    result.seconds = seconds_since(t0);
    return result;
}

}  // namespace

}  // namespace lattice
