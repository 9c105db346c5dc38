// Checks of a checkpoint's contents (declared in tensor_source.h): the tensor set against the
// config, and the finiteness of every converted weight row. The finiteness check runs inside each
// source's read(), on the row it has just converted (still in cache), so it adds one pass over bytes
// already in L1/L2 rather than a second walk over the weights: a load-time cost of a few percent.
#include "runtime/weights/tensor_source.h"

#include "base/convert.h"
#include "base/error.h"
#include "runtime/arch/architecture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace lattice {

namespace {

// Compares embed and lm_head row by row in f32; returns the first differing row or -1.
int64_t first_differing_row(const TensorSource& src, const std::string& embed, const std::string& head, int64_t rows,
                            int64_t cols) {
    constexpr int64_t kChunkRows = 256;
    std::vector<float> a(size_t(kChunkRows * cols)), b(size_t(kChunkRows * cols));
    for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
        const int64_t n = std::min(kChunkRows, rows - r0);
        src.read(embed, r0, n, 0, cols, DType::kF32, a.data());
        src.read(head, r0, n, 0, cols, DType::kF32, b.data());
        for (int64_t r = 0; r < n; ++r)
            if (std::memcmp(a.data() + r * cols, b.data() + r * cols, size_t(cols) * sizeof(float)) != 0) return r0 + r;
    }
    return -1;
}

}  // namespace

void check_tensor_set(const TensorSource& src) {
    const ModelConfig& c = src.config();
    std::vector<std::pair<std::string, std::vector<int64_t>>> need;
    for (ExpectedTensor& t : expected_tensors(c)) need.emplace_back(std::move(t.name), std::move(t.shape));
    const std::string embed = tensor_name(c, TensorRole::kEmbed), head_name = tensor_name(c, TensorRole::kLmHead);
    std::set<std::string> needed;
    for (const auto& [name, shape] : need) {
        LATTICE_CHECK(src.has(name), "{}: tensor \"{}\" is missing (the config {} needs it)", src.describe(), name,
                      c.source);
        const TensorInfo& ti = src.info(name);
        LATTICE_CHECK(ti.shape == shape, "{}: tensor \"{}\" has shape {}, expected {} from the config {}", ti.file,
                      name, shape_string(ti.shape), shape_string(shape), c.source);
        needed.insert(name);
    }
    std::vector<std::string> extra, beyond;
    bool tied_head = false;
    for (const std::string& name : src.tensor_names()) {
        if (needed.count(name) || hf_tensor_ignorable(name)) continue;
        if (name == head_name && c.tie_embeddings) {
            tied_head = true;
            continue;
        }
        (hf_layer_of(name) >= c.n_layers ? beyond : extra).push_back(name);
    }
    if (!beyond.empty()) {
        int64_t top = 0;
        for (const auto& n : beyond) top = std::max(top, hf_layer_of(n));
        LATTICE_FAIL(
            "{}: num_hidden_layers is {} but the checkpoint {} holds layers up to {} ({} tensors, e.g. "
            "\"{}\"): refusing to run a model cut short; fix num_hidden_layers",
            c.source, c.n_layers, src.describe(), top, beyond.size(), beyond.front());
    }
    if (!extra.empty())
        LATTICE_FAIL(
            "{}: {} tensor(s) the {} forward does not use, e.g. \"{}\" (an unsupported feature, or a "
            "checkpoint that does not match its config {}): refusing to run without them",
            src.describe(), extra.size(), c.family, extra.front(), c.source);
    if (tied_head) {
        const TensorInfo& ti = src.info(head_name);
        LATTICE_CHECK(ti.shape == tensor_shape(c, TensorRole::kLmHead),
                      "{}: tie_word_embeddings is true and the checkpoint also holds {} of shape {}: "
                      "set tie_word_embeddings to false to use it, or remove it",
                      c.source, head_name, shape_string(ti.shape));
        const int64_t row = first_differing_row(src, embed, head_name, c.vocab, c.hidden);
        LATTICE_CHECK(row < 0,
                      "{}: tie_word_embeddings is true but {} also holds {}, which differs from {} (first at row "
                      "{}): set tie_word_embeddings to false to use it, or remove it",
                      c.source, ti.file, head_name, embed, row);
    }
}

int64_t listed_elements(const TensorSource& src) {
    int64_t total = 0;
    for (const std::string& name : src.tensor_names()) {
        if (!src.has(name)) continue;  // listed under a file name only (refused by check_tensor_set)
        int64_t n = 1;
        for (int64_t d : src.info(name).shape) n *= d;
        total += n;
    }
    return total;
}

int64_t first_non_finite(const void* data, DType t, int64_t n) {
    // Exponent all ones <=> NaN or infinity. Branch-free OR-reduction first (vectorizes), then the
    // index only when something was found.
    auto scan = [n](const auto* p, auto mask) -> int64_t {
        decltype(mask) any = 0;
        for (int64_t i = 0; i < n; ++i) any |= decltype(mask)((p[i] & mask) == mask);
        if (!any) return -1;
        for (int64_t i = 0; i < n; ++i)
            if ((p[i] & mask) == mask) return i;
        return -1;
    };
    switch (t) {
        case DType::kF32:
            return scan(static_cast<const uint32_t*>(data), uint32_t(0x7f800000u));
        case DType::kF16:
            return scan(static_cast<const uint16_t*>(data), uint16_t(0x7c00u));
        case DType::kBF16:
            return scan(static_cast<const uint16_t*>(data), uint16_t(0x7f80u));
        default:
            return -1;
    }
}

Int4Weights TensorSource::read_int4(const std::string& name, int64_t, int64_t, int64_t, int64_t) const {
    LATTICE_FAIL("{}: tensor \"{}\" is not stored in 4 bits", describe(), name);
}

void check_slice(const TensorInfo& info, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    const int64_t R = info.rows(), C = info.cols();
    LATTICE_CHECK(row0 >= 0 && rows >= 0 && row0 <= R - rows && col0 >= 0 && cols >= 0 && col0 <= C - cols,
                  "{}: tensor \"{}\" {}: slice rows [{}, +{}) cols [{}, +{}) out of range", info.file, info.name,
                  shape_string(info.shape), row0, rows, col0, cols);
}

void check_finite_row(const void* data, DType t, int64_t n, const TensorInfo& info, int64_t row, int64_t col0) {
    const int64_t i = first_non_finite(data, t, n);
    if (i < 0) [[likely]]
        return;
    float v = 0;
    if (t == DType::kF32)
        std::memcpy(&v, static_cast<const float*>(data) + i, sizeof(float));
    else
        convert_elements(static_cast<const uint16_t*>(data) + i, t, &v, DType::kF32, 1);
    const std::string at =
        info.shape.size() >= 2 ? fmt::format("[{}, {}]", row, col0 + i) : fmt::format("[{}]", col0 + i);
    LATTICE_FAIL("{}: tensor \"{}\" {} holds {} at {}: refusing to run on non-finite weights", info.file, info.name,
                 shape_string(info.shape),
                 std::isnan(v) ? "NaN"
                 : v > 0       ? "+inf"
                               : "-inf",
                 at);
}

}  // namespace lattice
