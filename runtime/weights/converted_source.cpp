// TensorSource over one rank's file of a converted checkpoint, and `lattice verify`'s checks
// (see converted_source.h).
#include "runtime/weights/converted_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "kernels/common/int4_quantize.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/sha256.h"

namespace lattice {

namespace {

namespace fs = std::filesystem;

// The size check every load makes; "" when the file is as the manifest says.
std::string size_problem(const fs::path& p, const ManifestFile& f) {
    std::error_code ec;
    if (!fs::exists(p, ec)) return "missing";
    if (!fs::is_regular_file(p, ec)) return "not a regular file";
    const auto size = int64_t(fs::file_size(p, ec));
    if (ec) return "cannot stat (" + ec.message() + ")";
    if (size != f.bytes) return fmt::format("{} bytes, the manifest says {}: truncated or replaced", size, f.bytes);
    return {};
}

class ConvertedSource final : public TensorSource {
public:
    ConvertedSource(const std::string& folder, const ConvertedRank& want, bool verify) : folder_(folder) {
        const Manifest m = read_manifest(folder);
        LATTICE_CHECK(m.tp == want.tp && m.pp == want.pp,
                      "{}: converted for tp {} x pp {} ({} rank(s), quant {}), but this run is tp {} x pp {}: run it "
                      "with --tp {} --pp {}, or convert the model again for this layout",
                      folder, m.tp, m.pp, m.world(), m.quant, want.tp, want.pp, m.tp, m.pp);
        LATTICE_CHECK(want.rank >= 0 && want.rank < m.world(), "{}: rank {} outside the layout's {} ranks", folder,
                      want.rank, m.world());
        config_ = m.config;
        config_.source = folder;
        layout_ = m.layout(folder, want.rank);
        const ManifestFile& mf = m.rank_file(want.rank);
        const fs::path path = fs::path(folder) / mf.path;
        const std::string problem = size_problem(path, mf);
        LATTICE_CHECK(problem.empty(), "{}: {} (rank {}'s weights; `lattice verify {}` checks every file)",
                      path.string(), problem, want.rank, folder);
        if (verify) {  // this rank's weights, and every file the model's text comes through (the tokenizer)
            if (!m.sealed && want.rank == 0)
                LOG_WARN("{}/manifest.json has no manifest_sha256 (converted by an older lattice, or the field was "
                         "deleted): its own content is not checked; convert again for a sealed manifest",
                         folder);
            for (const ManifestFile& f : m.files) {
                if (&f != &mf && f.kind != "tokenizer") continue;
                const fs::path p = fs::path(folder) / f.path;
                const std::string size = size_problem(p, f);
                LATTICE_CHECK(size.empty(), "{}: {}", p.string(), size);
                const std::string got = sha256_file(p.string());
                LATTICE_CHECK(got == f.sha256, "{}: SHA-256 {} differs from the manifest's {}: the file is corrupt",
                              p.string(), got, f.sha256);
            }
        }
        file_ = std::make_unique<SafetensorsFile>(path.string());
        const auto& md = file_->metadata();
        auto meta = [&](const char* key) {
            auto it = md.find(key);
            return it == md.end() ? std::string() : it->second;
        };
        LATTICE_CHECK(meta("format") == kConvertedFormat &&
                          meta("format_version") == std::to_string(m.format_version) &&
                          meta("tp") == std::to_string(m.tp) && meta("pp") == std::to_string(m.pp) &&
                          meta("rank") == std::to_string(want.rank),
                      "{}: header says format \"{}\" v{}, tp {} x pp {}, rank {}; the manifest expects {} v{}, tp {} x "
                      "pp {}, rank {} (a file from another conversion or rank?)",
                      path.string(), meta("format"), meta("format_version"), meta("tp"), meta("pp"), meta("rank"),
                      kConvertedFormat, m.format_version, m.tp, m.pp, want.rank);
        std::set<std::string> int4_parts;  // entries that are parts of a 4-bit tensor (read through it)
        for (const auto& [key, value] : md) {
            if (!key.starts_with(kInt4MetaPrefix)) continue;
            const std::string name = key.substr(std::strlen(kInt4MetaPrefix));
            tensors_[name] = int4_tensor(path.string(), name, value, int4_parts);
        }
        for (const auto& [name, e] : file_->entries()) {
            if (int4_parts.count(name)) continue;
            TensorInfo info;
            info.name = name;
            info.dtype = e.dtype;
            info.shape = e.shape;
            info.file = path.string();
            LATTICE_CHECK(
                e.dtype == DType::kF32 || e.dtype == DType::kF16 || e.dtype == DType::kBF16 || e.dtype == DType::kI8,
                "{}: tensor \"{}\" has dtype {} (f32, f16, bf16 or i8 expected; u8 and i32 only as parts of a 4-bit "
                "tensor named in the header's \"{}<name>\" metadata)",
                info.file, name, dtype_name(e.dtype), kInt4MetaPrefix);
            LATTICE_CHECK(e.shape.size() == 1 || e.shape.size() == 2, "{}: tensor \"{}\" has shape {} (1-D or 2-D)",
                          info.file, name, shape_string(e.shape));
            LATTICE_CHECK(!tensors_.count(name), "{}: tensor \"{}\" is both stored and named as a 4-bit tensor",
                          info.file, name);
            tensors_[name] = Tensor{std::move(info), &e};
        }
        if (has(kGgufRopeFreqs)) {
            const TensorInfo& ti = info(kGgufRopeFreqs);
            LATTICE_CHECK(ti.dtype == DType::kF32 && ti.shape == std::vector<int64_t>{config_.head_dim / 2},
                          "{}: rope_freqs.weight must be f32 [{}]", ti.file, config_.head_dim / 2);
            freq_factors_.resize(size_t(config_.head_dim / 2));
            read(kGgufRopeFreqs, 0, 1, 0, config_.head_dim / 2, DType::kF32, freq_factors_.data());
        }
    }

    const ModelConfig& config() const override { return config_; }
    bool has(const std::string& name) const override { return tensors_.count(name) != 0; }
    const TensorInfo& info(const std::string& name) const override { return at(name).info; }
    std::vector<float> rope_freq_factors() const override { return freq_factors_; }
    const PreparedLayout* prepared() const override { return &layout_; }
    void release_pages() const override { file_->release_pages(); }
    std::string describe() const override {
        return fmt::format("{} (converted, {}, rank {})", folder_, layout_.describe(), layout_.rank);
    }
    int64_t total_bytes() const override {
        int64_t b = 0;
        for (const auto& [n, e] : file_->entries()) b += e.end - e.begin;
        return b;
    }

    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out_dtype,
              void* dst) const override {
        const Tensor& t = at(name);
        check_slice(t.info, row0, rows, col0, cols);
        LATTICE_CHECK(t.info.int4_group == 0, "{}: tensor \"{}\" is stored in 4 bits: read it with read_int4",
                      t.info.file, name);
        const int64_t C = t.info.cols();
        const bool i8 = t.info.dtype == DType::kI8;
        LATTICE_CHECK(i8 ? out_dtype == DType::kI8
                         : (out_dtype == DType::kF32 || out_dtype == DType::kF16 || out_dtype == DType::kBF16),
                      "{}: tensor \"{}\" is {}; cannot be read as {}", t.info.file, name, dtype_name(t.info.dtype),
                      dtype_name(out_dtype));
        const int64_t es = dtype_size(t.info.dtype), out_es = dtype_size(out_dtype);
        const uint8_t* base = file_->bytes(*t.entry);
        auto* out = static_cast<uint8_t*>(dst);
        for (int64_t r = 0; r < rows; ++r)
            convert_elements(base + ((row0 + r) * C + col0) * es, t.info.dtype, out + r * cols * out_es, out_dtype,
                             cols);
    }

    // The whole tensor (a converted file holds exactly the rank's slice): its parts copied as stored, then the
    // checks every 4-bit load makes (finite scales and minimums, zero points in 0..16, a permutation), naming it.
    Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) const override {
        const Tensor& t = at(name);
        LATTICE_CHECK(t.info.int4_group > 0, "{}: tensor \"{}\" is {}, not 4-bit", t.info.file, name,
                      dtype_name(t.info.dtype));
        const int64_t n = t.info.rows(), k = t.info.cols();
        LATTICE_CHECK(row0 == 0 && rows == n && col0 == 0 && cols == k,
                      "{}: 4-bit tensor \"{}\" [{}, {}] is read whole, not rows [{}, +{}) cols [{}, +{})", t.info.file,
                      name, n, k, row0, rows, col0, cols);
        Int4Weights w(n, k, t.info.int4_group, t.info.int4_kind);
        auto copy = [&](const SafetensorsEntry* e, void* dst, size_t bytes) {
            LATTICE_CHECK(e && e->end - e->begin == int64_t(bytes),
                          "{}: 4-bit tensor \"{}\": a part has {} bytes, {} expected", t.info.file, name,
                          e ? e->end - e->begin : 0, bytes);
            if (bytes) std::memcpy(dst, file_->bytes(*e), bytes);
        };
        copy(t.entry, w.qs.data(), w.qs.size());
        copy(t.d, w.d.data(), w.d.size() * 2);
        if (t.m) copy(t.m, w.m.data(), w.m.size() * 2);
        if (t.z) copy(t.z, w.z.data(), w.z.size());
        if (t.perm) {
            w.perm.resize(size_t(k));
            copy(t.perm, w.perm.data(), w.perm.size() * 4);
        }
        const std::string what = fmt::format("{}: 4-bit tensor \"{}\"", t.info.file, name);
        check_int4_matrix(w.matrix(), what.c_str());
        return w;
    }

private:
    struct Tensor {
        TensorInfo info;
        const SafetensorsEntry* entry = nullptr;  // a 4-bit tensor: its nibbles; then its other parts
        const SafetensorsEntry *d = nullptr, *m = nullptr, *z = nullptr, *perm = nullptr;
    };

    // A 4-bit tensor from its header metadata value and its parts' entries, every shape checked against it.
    Tensor int4_tensor(const std::string& file, const std::string& name, const std::string& value,
                       std::set<std::string>& parts) const {
        int64_t k = 0, group = 0;
        Int4Kind kind = Int4Kind::kAffine;
        LATTICE_CHECK(parse_int4_meta_value(value, &k, &group, &kind) && k > 0 && k <= kInt4MaxK &&
                          (group == 32 || group == 64 || group == 128),
                      "{}: 4-bit tensor \"{}\": header metadata \"{}\" is not \"k=K group=32|64|128 "
                      "kind=offset8|zero-point|affine\" (K in 1..{})",
                      file, name, value, kInt4MaxK);
        const auto& entries = file_->entries();
        auto part = [&](const std::string& suffix, DType dtype, std::vector<int64_t> shape, bool want) {
            const std::string pn = name + suffix;
            auto it = entries.find(pn);
            if (!want) {
                LATTICE_CHECK(it == entries.end(),
                              "{}: 4-bit tensor \"{}\" of kind {} has a part \"{}\" it cannot have", file, name,
                              int4_kind_name(kind), pn);
                return static_cast<const SafetensorsEntry*>(nullptr);
            }
            LATTICE_CHECK(it != entries.end(), "{}: 4-bit tensor \"{}\" ({}): its part \"{}\" is missing", file, name,
                          value, pn);
            LATTICE_CHECK(it->second.dtype == dtype && it->second.shape == shape,
                          "{}: 4-bit tensor \"{}\" ({}): part \"{}\" is {} {}, expected {} {} (truncated or from "
                          "another tensor?)",
                          file, name, value, pn, dtype_name(it->second.dtype), shape_string(it->second.shape),
                          dtype_name(dtype), shape_string(shape));
            parts.insert(pn);
            return &it->second;
        };
        const int64_t kp = (k + group - 1) / group * group, groups = kp / group;
        auto it = entries.find(name);
        LATTICE_CHECK(
            it != entries.end() && it->second.dtype == DType::kU8 && it->second.shape.size() == 2 &&
                it->second.shape[1] == kp / 2 && it->second.shape[0] > 0,
            "{}: 4-bit tensor \"{}\" ({}): its nibbles must be u8 [n, {}], found {}", file, name, value, kp / 2,
            it == entries.end() ? std::string("nothing")
                                : std::string(dtype_name(it->second.dtype)) + " " + shape_string(it->second.shape));
        const int64_t n = it->second.shape[0];
        Tensor t;
        t.entry = &it->second;
        parts.insert(name);
        t.d = part(kInt4ScaleSuffix, DType::kF16, {n, groups}, true);
        t.m = part(kInt4MinSuffix, DType::kF16, {n, groups}, kind == Int4Kind::kAffine);
        t.z = part(kInt4ZeroSuffix, DType::kU8, {n, groups}, kind == Int4Kind::kZeroPoint);
        const bool perm = entries.count(name + kInt4PermSuffix) != 0;
        t.perm = part(kInt4PermSuffix, DType::kI32, {k}, perm);
        t.info.name = name;
        t.info.dtype = DType::kU8;
        t.info.shape = {n, k};
        t.info.file = file;
        t.info.int4_group = group;
        t.info.int4_kind = kind;
        t.info.int4_perm = perm;
        return t;
    }
    const Tensor& at(const std::string& name) const {
        auto it = tensors_.find(name);
        LATTICE_CHECK(it != tensors_.end(), "{}: tensor \"{}\" missing from rank {}'s file", folder_, name,
                      layout_.rank);
        return it->second;
    }

    std::string folder_;
    ModelConfig config_;
    PreparedLayout layout_;
    std::unique_ptr<SafetensorsFile> file_;
    std::map<std::string, Tensor> tensors_;
    std::vector<float> freq_factors_;
};

}  // namespace

bool is_converted_folder(const std::string& path) {
    std::error_code ec;
    return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "manifest.json", ec);
}

std::unique_ptr<TensorSource> open_converted_model(const std::string& folder, const ConvertedRank& want, bool verify) {
    return std::make_unique<ConvertedSource>(folder, want, verify);
}

bool ConvertedVerdict::ok() const {
    return sealed && manifest.ok && std::all_of(files.begin(), files.end(), [](const FileVerdict& f) { return f.ok; });
}

ConvertedVerdict verify_converted(const std::string& folder, int threads,
                                  const std::function<void(int64_t)>& on_bytes) {
    ConvertedVerdict verdict;
    std::string seal;
    const Manifest m = read_manifest(folder, &seal);
    verdict.manifest.path = "manifest.json";
    verdict.sealed = m.sealed;
    verdict.manifest.ok = m.sealed && seal.empty();
    verdict.manifest.problem = !m.sealed ? "no manifest_sha256 (converted by an older lattice, or the field was "
                                           "deleted): its content cannot be checked; convert again to seal it"
                                         : seal;
    std::vector<FileVerdict>& out = verdict.files;
    out.resize(m.files.size());
    if (threads <= 0) threads = int(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
    threads = std::max(1, std::min<int>(threads, int(m.files.size())));
    // Largest files first, so one big file is not started last.
    std::vector<size_t> order(m.files.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return m.files[a].bytes > m.files[b].bytes; });
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t k; (k = next.fetch_add(1)) < order.size();) {
            const ManifestFile& f = m.files[order[k]];
            FileVerdict& v = out[order[k]];
            v.path = f.path;
            const fs::path p = fs::path(folder) / f.path;
            v.problem = size_problem(p, f);
            if (v.problem.empty()) {
                try {
                    const std::string got = sha256_file(p.string(), on_bytes);
                    if (got != f.sha256)
                        v.problem = fmt::format("SHA-256 {} differs from the manifest's {}: corrupt", got, f.sha256);
                } catch (const Error& e) {
                    v.problem = e.message();
                }
            }
            v.ok = v.problem.empty();
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    return verdict;
}

}  // namespace lattice
