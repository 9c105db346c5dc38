// TensorSource over a Hugging Face checkpoint directory: config.json plus model.safetensors, or the
// shards named by model.safetensors.index.json. Files stay mapped while the source lives; the model
// copies (and converts) what it keeps, then drops the source. open_model() picks the format.
// An AWQ / GPTQ checkpoint (quantization_config) shows each packed linear as "<P>.weight", a 4-bit tensor
// (TensorInfo::int4_group; read_int4 gives it, read() dequantizes it): runtime/weights/hf_int4.h.
// A family whose checkpoint fuses tensors (Phi-3's qkv_proj, gate_up_proj) names each part in the table as
// "<fused name>:<part>": the fused tensor is shown as its parts, row ranges of it (split_fused), so every
// rank reads only its own rows of each part.
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/file.h"
#include "base/json_limits.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/converted_source.h"
#include "runtime/weights/hf_int4.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

namespace {

constexpr int64_t kMaxIndexBytes = 16 << 20;

std::string join(const std::string& dir, const std::string& name) {
    return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

class HfSource final : public TensorSource {
public:
    explicit HfSource(const std::string& dir) : dir_(dir) {
        config_ = load_hf_config(join(dir, "config.json"));
        quant_ = parse_hf_quant_config(read_regular_file(join(dir, "config.json"), kMaxIndexBytes, "config file"),
                                       join(dir, "config.json"));
        const std::string index = join(dir, "model.safetensors.index.json");
        const std::string single = join(dir, "model.safetensors");
        if (path_kind(index, "index") != PathKind::kMissing) {
            load_index(index);
        } else {
            LATTICE_CHECK(path_kind(single, "safetensors file") != PathKind::kMissing,
                          "{}: no model.safetensors or model.safetensors.index.json", dir);
            files_.push_back(std::make_unique<SafetensorsFile>(single));
            for (const auto& [name, e] : files_[0]->entries()) add(name, 0, e);
        }
        collect_int4();
        split_fused();
    }

    const ModelConfig& config() const override { return config_; }
    bool has(const std::string& name) const override { return tensors_.count(name) != 0 || int4_.count(name) != 0; }
    const TensorInfo& info(const std::string& name) const override {
        auto it = int4_.find(name);
        return it != int4_.end() ? it->second.info : at(name).info;
    }
    std::vector<std::string> tensor_names() const override {
        std::vector<std::string> out;
        for (const auto& [n, t] : tensors_) out.push_back(n);
        for (const auto& [n, t] : int4_) out.push_back(n);
        return out;
    }
    Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) const override {
        auto it = int4_.find(name);
        LATTICE_CHECK(it != int4_.end(), "{}: tensor \"{}\" is not stored in 4 bits", dir_, name);
        return it->second.linear.read_int4(row0, rows, col0, cols);
    }
    std::string describe() const override { return dir_ + " (safetensors, " + std::to_string(files_.size()) + " file(s))"; }
    void release_pages() const override {
        for (const auto& f : files_) f->release_pages();
    }
    int64_t total_bytes() const override {
        int64_t b = 0;
        for (const auto& [n, t] : tensors_) b += t.bytes;
        for (const auto& [n, t] : int4_) b += t.linear.stored_bytes();
        return b;
    }

    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out_dtype,
              void* dst) const override {
        if (auto it = int4_.find(name); it != int4_.end()) {  // AWQ / GPTQ: dequantized
            std::vector<float> f(size_t(rows * cols));
            it->second.linear.read_f32(row0, rows, col0, cols, f.data());
            convert_elements(f.data(), DType::kF32, dst, out_dtype, rows * cols);
            return;
        }
        const Tensor& t = at(name);
        check_slice(t.info, row0, rows, col0, cols);
        const int64_t C = t.info.cols();
        const int64_t es = dtype_size(t.info.dtype);
        const uint8_t* base = files_[size_t(t.file)]->bytes(*t.entry);
        auto* out = static_cast<uint8_t*>(dst);
        const int64_t out_es = dtype_size(out_dtype);
        for (int64_t r = 0; r < rows; ++r) {
            uint8_t* o = out + r * cols * out_es;
            convert_elements(base + ((t.row0 + row0 + r) * C + col0) * es, t.info.dtype, o, out_dtype, cols);
            check_finite_row(o, out_dtype, cols, t.info, row0 + r, col0);
        }
    }

private:
    struct Tensor {
        TensorInfo info;
        int file = 0;
        const SafetensorsEntry* entry = nullptr;
        int64_t row0 = 0;   // a part of a fused tensor: its first row in the entry
        int64_t bytes = 0;  // bytes of the entry it shows
    };

    const Tensor& at(const std::string& name) const {
        auto it = tensors_.find(name);
        LATTICE_CHECK(it != tensors_.end(), "{}: tensor \"{}\" missing from the checkpoint", dir_, name);
        return it->second;
    }

    void add(const std::string& name, int file, const SafetensorsEntry& e) {
        LATTICE_CHECK(quant_ || !name.ends_with(".qweight"),
                      "{}: tensor \"{}\" is packed 4-bit (AWQ / GPTQ) but config.json has no quantization_config",
                      files_[size_t(file)]->path(), name);
        LATTICE_CHECK(e.dtype == DType::kF32 || e.dtype == DType::kF16 || e.dtype == DType::kBF16 ||
                          name.find("weight") == std::string::npos || (quant_ && name.ends_with(".qweight")),
                      "{}: tensor \"{}\" has dtype {}; weights must be f32, f16 or bf16", files_[size_t(file)]->path(),
                      name, dtype_name(e.dtype));
        Tensor t;
        t.info.name = name;
        t.info.dtype = e.dtype;
        t.info.shape = e.shape;
        t.info.file = files_[size_t(file)]->path();
        t.file = file;
        t.entry = &e;
        t.bytes = e.end - e.begin;
        tensors_[name] = std::move(t);
    }

    // Each fused per-layer tensor of the family (table names "<fused>:<part>") becomes its parts: row ranges
    // in table order, each as many rows as its role's shape (the plan checks the columns); the fused name
    // leaves the list.
    void split_fused() {
        std::map<std::string, std::vector<const TensorSpec*>> groups;  // fused name -> its parts in table order
        for (const TensorSpec& t : architecture_of(config_).tensors) {
            const std::string hf = t.hf;
            if (t.per_layer && hf.find(':') != std::string::npos) groups[hf.substr(0, hf.find(':'))].push_back(&t);
        }
        for (const auto& [fused, parts] : groups)
            for (int64_t l = 0; l < config_.n_layers; ++l) {
                const std::string prefix = "model.layers." + std::to_string(l) + ".";
                auto it = tensors_.find(prefix + fused);
                if (it == tensors_.end()) continue;  // (the tensor checks name the missing parts)
                const Tensor whole = it->second;
                int64_t rows = 0;
                for (const TensorSpec* p : parts) rows += tensor_shape(config_, p->role)[0];
                LATTICE_CHECK(whole.info.shape.size() == 2 && whole.info.shape[0] == rows,
                              "{}: tensor \"{}\" has shape {}; its {} parts need {} rows", whole.info.file,
                              whole.info.name, shape_string(whole.info.shape), parts.size(), rows);
                tensors_.erase(it);
                int64_t row0 = 0;
                for (const TensorSpec* p : parts) {
                    Tensor t = whole;
                    const int64_t n = tensor_shape(config_, p->role)[0];
                    t.info.name = prefix + p->hf;
                    t.info.shape = {n, whole.info.shape[1]};
                    t.row0 = row0;
                    t.bytes = n * whole.info.shape[1] * dtype_size(whole.info.dtype);
                    row0 += n;
                    tensors_[t.info.name] = t;
                }
            }
    }

    void load_index(const std::string& index_path) {
        const std::string text = read_regular_file(index_path, kMaxIndexBytes, "safetensors index");
        JsonLimits lim;
        lim.max_depth = 8;
        check_json_limits(text, index_path, lim);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            LATTICE_FAIL("{}: not valid JSON ({})", index_path, e.what());
        }
        LATTICE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                      "{}: missing \"weight_map\" object", index_path);
        std::map<std::string, int> shard_index;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            LATTICE_CHECK(it.value().is_string(), "{}: weight_map[\"{}\"] must be a file name", index_path, it.key());
            std::string shard = it.value().get<std::string>();
            LATTICE_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
                          "{}: weight_map[\"{}\"] names \"{}\", not a file in the model directory", index_path,
                          it.key(), shard);
            auto s = shard_index.find(shard);
            if (s == shard_index.end()) {
                const std::string p = join(dir_, shard);
                LATTICE_CHECK(path_kind(p, "shard") != PathKind::kMissing,
                              "{}: names shard \"{}\" which does not exist ({})", index_path, shard, p);
                files_.push_back(std::make_unique<SafetensorsFile>(p));
                s = shard_index.emplace(shard, int(files_.size()) - 1).first;
            }
            const SafetensorsEntry* e = files_[size_t(s->second)]->find(it.key());
            LATTICE_CHECK(e != nullptr, "{}: tensor \"{}\" is listed for shard \"{}\" but that file does not hold it",
                          index_path, it.key(), shard);
            add(it.key(), s->second, *e);
        }
    }

    // AWQ / GPTQ: every "<P>.qweight" with its qzeros, scales (and g_idx) becomes the 4-bit linear "<P>.weight"
    // (hf_int4.h); its parts leave the tensor list, and so does an all-zero "<P>.bias" the family has no use for
    // (AutoGPTQ writes one for every linear).
    void collect_int4() {
        std::vector<std::string> prefixes;
        for (const auto& [name, t] : tensors_)
            if (name.ends_with(".qweight")) prefixes.push_back(name.substr(0, name.size() - 8));
        if (!quant_) return;  // (add() refused any .qweight then)
        const bool qkv_bias = architecture_of(config_).qkv_bias;
        for (const std::string& p : prefixes) {
            auto part = [&](const char* suffix) {
                auto it = tensors_.find(p + suffix);
                if (it == tensors_.end()) return HfInt4Linear::Part{};
                const Tensor& t = it->second;
                return HfInt4Linear::Part{t.entry, files_[size_t(t.file)]->bytes(*t.entry), t.info.file};
            };
            const std::string name = p + ".weight";
            LATTICE_CHECK(tensors_.count(name) == 0, "{}: \"{}\" is stored both as float and as 4-bit (.qweight)", dir_,
                          name);
            HfInt4Linear lin(*quant_, name, part(".qweight"), part(".qzeros"), part(".scales"), part(".g_idx"));
            TensorInfo info;
            info.name = name;
            info.dtype = DType::kU8;
            info.shape = {lin.n(), lin.k()};
            info.file = tensors_.at(p + ".qweight").info.file;
            info.int4_group = quant_->group;
            info.int4_kind = Int4Kind::kZeroPoint;
            info.int4_perm = lin.permuted();
            for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) tensors_.erase(p + suffix);
            int4_.emplace(name, Int4Tensor{std::move(info), std::move(lin)});
            const bool wanted_bias =
                qkv_bias && (p.ends_with(".q_proj") || p.ends_with(".k_proj") || p.ends_with(".v_proj"));
            if (auto b = tensors_.find(p + ".bias"); b != tensors_.end() && !wanted_bias && all_zero(b->second))
                tensors_.erase(b);
        }
    }

    bool all_zero(const Tensor& t) const {
        const uint8_t* d = files_[size_t(t.file)]->bytes(*t.entry);
        const int64_t n = t.entry->end - t.entry->begin;
        for (int64_t i = 0; i < n; ++i)  // +0.0 and -0.0 of any float type: all bits zero but the signs
            if (d[i] != 0 && !(d[i] == 0x80 && (i + 1) % dtype_size(t.info.dtype) == 0)) return false;
        return true;
    }

    struct Int4Tensor {
        TensorInfo info;
        HfInt4Linear linear;
    };

    std::string dir_;
    ModelConfig config_;
    std::optional<HfQuantConfig> quant_;
    std::map<std::string, Int4Tensor> int4_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, Tensor> tensors_;
};

}  // namespace

std::unique_ptr<TensorSource> open_model(const std::string& path) {
    LATTICE_CHECK(!path.empty(), "no model path given");
    mode_t mode = 0;
    const PathKind kind = path_kind(path, "model", &mode);
    LATTICE_CHECK(kind != PathKind::kMissing, "{}: model path does not exist", path);
    if (kind == PathKind::kDirectory) {
        const std::string dir = path.back() == '/' ? path : path + "/";
        if (path_kind(dir + "manifest.json", "manifest") != PathKind::kMissing)
            return open_converted_model(path, ConvertedRank{});
        if (path_kind(dir + "config.json", "config") == PathKind::kMissing) {
            std::error_code ec;
            for (const auto& e : std::filesystem::directory_iterator(path, ec))
                LATTICE_CHECK(e.path().filename().string().rfind("rank-", 0) != 0,
                              "{}: rank files but no manifest.json: an interrupted `lattice convert` (convert again)",
                              path);
        }
        return std::make_unique<HfSource>(path);
    }
    if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") return open_gguf_model(path);
    LATTICE_CHECK(kind == PathKind::kRegular,
                  "model {} is {}: give a model directory (config.json + safetensors) "
                  "or a .gguf file",
                  path, file_kind(mode));
    LATTICE_FAIL("{}: not a model directory (config.json + safetensors) or a .gguf file", path);
}

}  // namespace lattice
