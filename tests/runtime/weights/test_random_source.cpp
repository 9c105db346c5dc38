// RandomSource: a large slice (read on several threads) equals the same elements read one row and
// one column block at a time (single-threaded reads), in every output dtype, and the weights are not
// degenerate (matrices spread over [-scale, scale], norms near 1).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/arch/config.h"
#include "runtime/weights/random_source.h"

using namespace lattice;

TEST_CASE("random source: threaded large reads equal row-by-row reads") {
    const ModelConfig cfg = preset_config("tinyllama-1.1b");
    auto src = make_random_source(cfg, 77, DType::kBF16);
    const std::string name = "model.layers.3.mlp.gate_proj.weight";  // 5632 x 2048: split over threads
    const int64_t rows = src->info(name).rows(), cols = src->info(name).cols();
    REQUIRE(rows * cols > (int64_t(4) << 20));
    for (DType out : {DType::kF32, DType::kBF16}) {
        CAPTURE(dtype_name(out));
        const size_t es = dtype_size(out);
        std::vector<uint8_t> whole(size_t(rows * cols) * es, 0xAB);
        src->read(name, 0, rows, 0, cols, out, whole.data());
        std::vector<uint8_t> row(size_t(cols) * es);
        int64_t mismatched_rows = 0;
        for (int64_t r = 0; r < rows; r += 97) {  // rows from every thread's share, and the last one
            const int64_t rr = std::min(r, rows - 1);
            src->read(name, rr, 1, 0, cols, out, row.data());
            mismatched_rows += std::memcmp(row.data(), whole.data() + size_t(rr * cols) * es, row.size()) != 0;
        }
        CHECK(mismatched_rows == 0);
        // A column block of a row band: the same elements again.
        const int64_t r0 = rows / 2 - 3, c0 = 1000, nr = 7, nc = 33;
        std::vector<uint8_t> block(size_t(nr * nc) * es);
        src->read(name, r0, nr, c0, nc, out, block.data());
        for (int64_t r = 0; r < nr; ++r)
            CHECK(std::memcmp(block.data() + size_t(r * nc) * es, whole.data() + size_t((r0 + r) * cols + c0) * es,
                              size_t(nc) * es) == 0);
    }
    // Values: uniform-ish in [-1, 1] / sqrt(cols), so max |w| near that bound and mean near 0.
    std::vector<float> w(size_t(rows * cols));
    src->read(name, 0, rows, 0, cols, DType::kF32, w.data());
    double sum = 0, amax = 0;
    for (float v : w) sum += v, amax = std::max(amax, double(std::fabs(v)));
    const double bound = 1.0 / std::sqrt(double(cols));
    CHECK(amax <= bound * 1.01);
    CHECK(amax >= bound * 0.99);
    CHECK(std::fabs(sum / double(w.size())) < bound * 0.01);
}
