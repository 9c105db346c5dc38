// The int8 GEMM's AMX-INT8 tile kernel (kernels/cpu/int8_gemm_amx_avx512.cpp): int32 sums and W8A8 floats bit-equal
// to the VNNI kernel and to a naive int64 reference, over row tails (rows past the last 16), k tails (k_padded % 64
// and k % 4), odd panel counts, thread shares that start on an odd panel, garbage in the row bytes past k_padded and
// the int32 wrap corners up to kInt8MaxK. [amxmodel] runs the kernel on the software tile model (amx_tiles.h) on
// any CPU with AVX-512 VNNI (its epilogue's flags), so the indexing is checked where no AMX exists; [amx] runs the
// instructions themselves and the front's choice (tiles from m = 16 at the amx level, the VNNI kernel below), and
// SKIPs where AMX cannot run (the CPU, the OS's tile state or the kernel's permission).
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/int8_gemm_kernels.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/test_skip.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_int8_amx {

using namespace lattice;
using namespace lattice::test;

namespace {

using Kernel = void (*)(const void*, int64_t, int64_t, const PackedInt8&, int64_t, int64_t,
                        const int8_detail::Int8Epilogue&);

constexpr int32_t kPoison = 0x7eadbeef;

// Rows a [m, k] in the avx512 operand form (a + 128 as u8, 128 to k_padded) at a stride rounded up to 64, with
// garbage past k_padded: the tiles read those bytes, and zero weights must meet them.
std::vector<uint8_t> prepare(const std::vector<int8_t>& a, int64_t m, int64_t k, int64_t k_padded, int64_t lda) {
    std::vector<uint8_t> out(size_t(m * lda), 0xA5);
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t i = 0; i < k; ++i) out[size_t(r * lda + i)] = uint8_t(a[size_t(r * k + i)]) ^ 0x80u;
        for (int64_t i = k; i < k_padded; ++i) out[size_t(r * lda + i)] = 0x80;
    }
    return out;
}

struct Outputs {
    std::vector<int32_t> c;
    std::vector<float> y;
};

// The kernel over the panels in the given shares (each [p0, p1) as one thread would run it): int32 sums, then floats.
Outputs run(Kernel kernel, const std::vector<uint8_t>& a, int64_t m, int64_t lda, const PackedInt8& w,
            const std::vector<int64_t>& cuts, const std::vector<float>& row_scales,
            const std::vector<float>& col_scales) {
    Outputs o{std::vector<int32_t>(size_t(m * w.n), kPoison), std::vector<float>(size_t(m * w.n), -1.0f)};
    int8_detail::Int8Epilogue ec;
    ec.c = o.c.data();
    ec.ldc = w.n;
    int8_detail::Int8Epilogue ey;
    ey.y = o.y.data();
    ey.ldy = w.n;
    ey.row_scales = row_scales.data();
    ey.col_scales = col_scales.data();
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        kernel(a.data(), m, lda, w, cuts[i], cuts[i + 1], ec);
        kernel(a.data(), m, lda, w, cuts[i], cuts[i + 1], ey);
    }
    return o;
}

struct Shape {
    int64_t m, n, k;
};

// The tile kernel against the VNNI kernel (bit for bit) and the naive reference, whole and split among "threads".
void check_against_vnni(Kernel tiles, const Shape& s, const std::vector<int8_t>& a, const std::vector<int8_t>& q) {
    CAPTURE(s.m);
    CAPTURE(s.n);
    CAPTURE(s.k);
    const PackedInt8 w = pack_int8_weights(q.data(), s.n, s.k, IsaLevel::kAvx512Vnni);
    const int64_t lda = (w.k_padded + 63) / 64 * 64;
    const std::vector<uint8_t> prepared = prepare(a, s.m, s.k, w.k_padded, lda);
    std::mt19937 rng(uint32_t(s.m * 131 + s.n * 7 + s.k));
    std::uniform_real_distribution<float> sc(0.001f, 0.05f);
    std::vector<float> rs(size_t(s.m)), cs(size_t(s.n));
    for (auto& x : rs) x = sc(rng);
    for (auto& x : cs) x = sc(rng);
    const std::vector<int64_t> whole = {0, w.n_panels};
    const Outputs want = run(&int8_detail::s8_panels_avx512, prepared, s.m, lda, w, whole, rs, cs);
    const std::vector<int64_t> ref = naive_s8(a.data(), q.data(), s.m, s.n, s.k);
    int64_t bad_ref = 0;
    for (size_t i = 0; i < ref.size(); ++i) bad_ref += int64_t(want.c[i]) != ref[i];
    REQUIRE(bad_ref == 0);  // the VNNI kernel itself (test_int8_gemm checks it at length)
    std::vector<int64_t> split = {0};
    for (int64_t p = 1; p < w.n_panels; p += 2) split.push_back(p);  // shares starting on odd panels
    split.push_back(w.n_panels);
    for (const auto& cuts : {whole, split}) {
        CAPTURE(cuts.size());
        const Outputs got = run(tiles, prepared, s.m, lda, w, cuts, rs, cs);
        CHECK(std::memcmp(got.c.data(), want.c.data(), got.c.size() * sizeof(int32_t)) == 0);
        CHECK(std::memcmp(got.y.data(), want.y.data(), got.y.size() * sizeof(float)) == 0);
    }
}

// Shapes: one 16-row tile; row tails of 1 and 2 rows and after 1 and 2 tiles; k below one tile (4); k tails of 4, 8
// and 60 bytes (130 with k % 4 = 2, 72, 124); odd panel counts (37, 48, 80 channels); TinyLlama's k = 2048 and the down
// projection's k = 5632 = 88 tiles; m past two 2 x 2 blocks.
const Shape kShapes[] = {{16, 16, 64},   {17, 48, 72},   {33, 37, 130}, {32, 64, 4},  {100, 80, 2052},
                         {47, 96, 2048}, {64, 32, 5632}, {1, 16, 64},   {18, 33, 124}};

void check_shapes(Kernel tiles) {
    std::mt19937 rng(53);
    for (const Shape& s : kShapes) {
        const std::vector<int8_t> a = random_i8(size_t(s.m * s.k), rng);
        const std::vector<int8_t> q = random_i8(size_t(s.n * s.k), rng);
        check_against_vnni(tiles, s, a, q);
    }
    // The int32 corners at kInt8MaxK: rows of -128 and of 127 against weights of -128 and 127, where the u8 x s8
    // sums wrap before the correction brings them back (|sum| up to 128 * 128 * k < 2^31).
    const Shape big{18, 32, kInt8MaxK};
    std::vector<int8_t> a(size_t(big.m * big.k)), q(size_t(big.n * big.k));
    for (int64_t r = 0; r < big.m; ++r)
        for (int64_t i = 0; i < big.k; ++i)
            a[size_t(r * big.k + i)] = int8_t(r % 3 == 0 ? -128 : r % 3 == 1 ? 127 : (i % 7) - 3);
    for (int64_t j = 0; j < big.n; ++j)
        for (int64_t i = 0; i < big.k; ++i) q[size_t(j * big.k + i)] = int8_t(j % 2 ? -128 : 127);
    check_against_vnni(tiles, big, a, q);
}

bool avx512_here() {
    for (IsaLevel l : supported_isas())
        if (l == IsaLevel::kAvx512Vnni) return true;
    return false;
}

}  // namespace

TEST_CASE("int8 AMX tiles [amxmodel]: on the tile model, sums and floats equal the VNNI kernel's bit for bit") {
    if (!avx512_here()) LATTICE_SKIP("the avx512 level is not run here (no AVX-512 VNNI, or LATTICE_ISA caps it)");
    check_shapes(&int8_detail::s8_panels_amx_model);
}

TEST_CASE("int8 AMX tiles [amxmodel]: the tile model refuses the shapes the hardware refuses") {
    if (!avx512_here()) LATTICE_SKIP("the avx512 level is not run here (no AVX-512 VNNI, or LATTICE_ISA caps it)");
    using amx::TileModel;
    alignas(64) uint8_t buf[16 * 64] = {};
    TileModel::release();
    CHECK_THROWS_AS(TileModel::load_b<0>(buf), Error);  // no configuration
    amx::TileConfig c = amx::gemm_config(16);
    c.colsb[4] = 32;  // A of 32 bytes against B's 16 rows: tdpbusd's #UD
    TileModel::configure(c);
    TileModel::load_a<0>(buf, 64);
    TileModel::load_b<0>(buf);
    CHECK_THROWS_AS((TileModel::dot<0, 0>()), Error);
    TileModel::configure(amx::gemm_config(5));  // a row tail: A and C of 5 rows, B of 16
    TileModel::load_a<0>(buf, 64);
    TileModel::load_b<0>(buf);
    CHECK_NOTHROW((TileModel::dot<0, 0>()));
    c = amx::gemm_config(5);
    c.rows[6] = 4;  // B of 4 rows against A's 64 bytes
    TileModel::configure(c);
    CHECK_THROWS_AS((TileModel::dot<0, 0>()), Error);
    c.rows[6] = 17;
    CHECK_THROWS_AS(TileModel::configure(c), Error);
    TileModel::release();
}

TEST_CASE("int8 AMX tiles [amx]: the instructions equal the VNNI kernel; the amx level runs them from m = 16") {
    if (!isa_supported(IsaLevel::kAmx)) LATTICE_SKIP("AMX cannot run here: " << amx_note());
    const std::vector<IsaLevel> levels = supported_isas();
    if (levels.back() != IsaLevel::kAmx) LATTICE_SKIP("the amx level is not run here (LATTICE_ISA caps it)");
    check_shapes(&int8_detail::s8_panels_amx);
    // Through the front: weights packed for amx under the `own` provider (no oneDNN copy) run the tiles at m >= 16
    // and the VNNI kernel below; the floats equal those of weights packed for avx512.
    ProviderGuard g(Int8Provider::kOwn);
    std::mt19937 rng(7);
    const int64_t n = 70, k = 300;
    const std::vector<int8_t> q = random_i8(size_t(n * k), rng);
    const std::vector<float> sw = random_f32(size_t(n), rng, 0.01f);
    const PackedInt8 tiles = pack_int8_weights(q.data(), n, k, IsaLevel::kAmx);
    const PackedInt8 vnni = pack_int8_weights(q.data(), n, k, IsaLevel::kAvx512Vnni);
    REQUIRE(!tiles.onednn);
    ThreadPool pool(2, false);
    for (int64_t m : {5, 16, 41}) {
        CAPTURE(m);
        const std::vector<float> x = random_f32(size_t(m * k), rng);
        std::vector<float> y_tiles(size_t(m * n)), y_vnni(size_t(m * n));
        clear_paths();
        gemm_w8a8(x.data(), m, k, tiles, sw.data(), y_tiles.data(), pool);
        REQUIRE(last_path(KernelFamily::kGemmInt8).has_value());
        CHECK(*last_path(KernelFamily::kGemmInt8) == (m >= kInt8AmxMinM ? IsaLevel::kAmx : IsaLevel::kAvx512Vnni));
        gemm_w8a8(x.data(), m, k, vnni, sw.data(), y_vnni.data(), pool);
        CHECK(std::memcmp(y_tiles.data(), y_vnni.data(), y_tiles.size() * sizeof(float)) == 0);
    }
}

}  // namespace test_int8_amx
