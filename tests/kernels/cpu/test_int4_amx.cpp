// The W4A8 group form's AMX-INT8 tile kernel (kernels/cpu/int4_gemm_amx_avx512.cpp): outputs bit-equal to the VNNI
// kernel and to the scalar reference, for the three kinds (offset8, zero-point, affine), groups of 32, 64 and 128
// (one tile step, one, two per group), row tails (rows past the last 16, and fewer than 16 rows), n off the panels,
// k off the group, odd panel counts and thread shares that start on odd panels, with garbage in the activation
// bytes past k_padded. [amxmodel] runs the kernel on the software tile model (amx_tiles.h) on any CPU with AVX-512
// VNNI; [amx] runs the instructions and the front's choice (tiles from m = 16 at the amx level, the VNNI kernel
// below and for the K-quant layout) and SKIPs where AMX cannot run (the CPU, the OS's tile state or the permission).
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/quantize.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/int4_gemm_kernels.h"
#include "tests/kernels/common/int4_test_util.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/test_skip.h"

using namespace lattice;
using namespace lattice::test;

namespace {

using Kernel = void (*)(const int4_detail::Int4Acts&, int64_t, const PackedInt4&, int64_t, int64_t, float*, int64_t);

// Activations as gemm_w4a8 prepares them (int4_gemm.cpp): each row's groups quantized on their own, zeros from k
// to k_padded, the group sums; rows ldq = k_padded rounded up to 64 apart, garbage past k_padded (never read).
struct Acts {
    std::vector<int8_t> q;
    std::vector<int32_t> xsum, xsum16;
    std::vector<float> scales;
    int4_detail::Int4Acts view;
};
Acts prepare(const std::vector<float>& x, int64_t m, const PackedInt4& w) {
    Acts a;
    const int64_t ldq = (w.k_padded + 63) / 64 * 64;
    a.q.assign(size_t(m * ldq), int8_t(0x5A));
    a.xsum.assign(size_t(m * w.groups), 0);
    a.xsum16.assign(size_t(m * w.groups), 0);
    a.scales.assign(size_t(m * w.groups), 1.0f);
    for (int64_t r = 0; r < m; ++r) {
        int8_t* q = a.q.data() + r * ldq;
        for (int64_t g = 0; g < w.groups; ++g) {
            const int64_t c0 = g * w.group, len = std::min(w.k, c0 + w.group) - c0;
            if (len > 0) a.scales[size_t(r * w.groups + g)] = quantize_row_int8(x.data() + r * w.k + c0, len, q + c0);
        }
        std::memset(q + w.k, 0, size_t(w.k_padded - w.k));
        for (int64_t i = 0; i < w.k_padded; ++i) {
            a.xsum[size_t(r * w.groups + i / w.group)] += q[i];
            if (i % w.group < 16) a.xsum16[size_t(r * w.groups + i / w.group)] += q[i];
        }
    }
    a.view = int4_detail::Int4Acts{
        a.q.data(), ldq, a.xsum.data(), w.groups, a.scales.data(), w.kq ? a.xsum16.data() : nullptr};
    return a;
}

// The kernel over the panels in the given shares (each [p0, p1) as one thread would run it).
std::vector<float> run(Kernel kernel, const Acts& a, int64_t m, const PackedInt4& w, const std::vector<int64_t>& cuts) {
    std::vector<float> y(size_t(m * w.n), -1.0f);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) kernel(a.view, m, w, cuts[i], cuts[i + 1], y.data(), w.n);
    return y;
}

struct Shape {
    int64_t m, n, k, group;
};

// Shapes: one 16-row tile; row tails of 1 and 2 rows after one and two tiles, and rows below one tile; k off the
// group (96 of 64, 130 of 32, 200 of 128); odd panel counts (33, 37, 48, 80 channels); TinyLlama's k = 2048 and the
// down projection's k = 5632; m past two 2 x 2 blocks.
const Shape kShapes[] = {{16, 16, 64, 32},   {17, 48, 96, 64},    {33, 37, 130, 32},
                         {5, 32, 128, 128},  {100, 80, 512, 128}, {47, 96, 2048, 32},
                         {64, 32, 5632, 32}, {18, 33, 200, 128},  {1, 16, 64, 64}};
constexpr Int4Kind kKinds[] = {Int4Kind::kOffset8, Int4Kind::kZeroPoint, Int4Kind::kAffine};

// The tile kernel over w and rows of x against the VNNI kernel and the scalar reference (bit for bit), whole and
// split among "threads" with shares that start on odd panels.
void check_against_vnni(Kernel tiles, Kernel vnni_kernel, Kernel scalar_kernel, const PackedInt4& w,
                        const std::vector<float>& x, int64_t m) {
    const Acts a = prepare(x, m, w);
    const std::vector<int64_t> whole = {0, w.n_panels};
    const std::vector<float> vnni = run(vnni_kernel, a, m, w, whole);
    const std::vector<float> scalar = run(scalar_kernel, a, m, w, whole);
    REQUIRE(std::memcmp(vnni.data(), scalar.data(), vnni.size() * sizeof(float)) == 0);
    std::vector<int64_t> split = {0};
    for (int64_t p = 1; p < w.n_panels; p += 2) split.push_back(p);
    split.push_back(w.n_panels);
    for (const auto& cuts : {whole, split}) {
        CAPTURE(cuts.size());
        const std::vector<float> got = run(tiles, a, m, w, cuts);
        CHECK(std::memcmp(got.data(), vnni.data(), got.size() * sizeof(float)) == 0);
    }
}

void check_shapes(Kernel tiles) {
    std::mt19937 rng(54);
    for (const Shape& s : kShapes)
        for (Int4Kind kind : kKinds) {
            CAPTURE(s.m);
            CAPTURE(s.n);
            CAPTURE(s.k);
            CAPTURE(s.group);
            CAPTURE(int(kind));
            const PackedInt4 w =
                pack_int4_weights(random_int4(s.n, s.k, s.group, kind, rng).matrix(), IsaLevel::kAvx512Vnni);
            check_against_vnni(tiles, &int4_detail::w4a8_panels_avx512, &int4_detail::w4a8_panels_scalar, w,
                               random_f32(size_t(s.m * s.k), rng), s.m);
        }
}

// GGUF K-quant parts [rows of a type] of k columns, packed in the K-quant layout for avx512.
PackedInt4 kquant_weights(int64_t k, const std::vector<std::pair<DType, int64_t>>& parts, std::mt19937& rng) {
    int64_t n = 0;
    for (const auto& [t, rows] : parts) n += rows;
    Int4Weights w(n, k, 32, Int4Kind::kAffine);  // the group form's nibbles: unread by the K-quant layout
    for (const auto& [t, rows] : parts) w.kq.push_back(Int4KQuantPart{t, rows, k_tensor_bytes(t, rows, k, rng)});
    PackedInt4 p = pack_int4_weights(w.matrix(), IsaLevel::kAvx512Vnni, true);
    REQUIRE(p.kq);
    return p;
}

// The K-quant layout: Q4_K panels (a group a tile step) and Q6_K panels (two steps of 16) in runs of one type, a
// run of one panel, a part of fewer than 16 rows last; row tails; k of 1 to 4 super-blocks.
void check_kquant(Kernel tiles) {
    std::mt19937 rng(55);
    const std::vector<std::pair<DType, int64_t>> mixes[] = {
        {{DType::kQ4_K, 32}, {DType::kQ6_K, 16}, {DType::kQ4_K, 8}},
        {{DType::kQ6_K, 48}, {DType::kQ4_K, 16}, {DType::kQ6_K, 5}}};
    const Shape shapes[] = {{16, 0, 256, 32}, {33, 0, 512, 32}, {5, 0, 256, 32}, {47, 0, 1024, 32}};
    for (const auto& mix : mixes)
        for (const Shape& s : shapes) {
            CAPTURE(s.m);
            CAPTURE(s.k);
            CAPTURE(mix.size());
            const PackedInt4 w = kquant_weights(s.k, mix, rng);
            check_against_vnni(tiles, &int4_detail::w4a8_kq_panels_avx512, &int4_detail::w4a8_kq_panels_scalar, w,
                               random_f32(size_t(s.m * s.k), rng), s.m);
        }
}

bool avx512_here() {
    for (IsaLevel l : supported_isas())
        if (l == IsaLevel::kAvx512Vnni) return true;
    return false;
}

}  // namespace

TEST_CASE("int4 AMX tiles [amxmodel]: on the tile model, W4A8 outputs equal the VNNI kernel's bit for bit") {
    if (!avx512_here()) LATTICE_SKIP("the avx512 level is not run here (no AVX-512 VNNI, or LATTICE_ISA caps it)");
    check_shapes(&int4_detail::w4a8_panels_amx_model);
}

TEST_CASE("int4 AMX tiles [amxmodel]: on the tile model, W4A8 on the K-quant layout equals the VNNI kernel's bits") {
    if (!avx512_here()) LATTICE_SKIP("the avx512 level is not run here (no AVX-512 VNNI, or LATTICE_ISA caps it)");
    check_kquant(&int4_detail::w4a8_kq_panels_amx_model);
}

TEST_CASE("int4 AMX tiles [amxmodel]: the tile model takes 32-byte A rows against 8-row B, and tdpbsud's signs") {
    if (!avx512_here()) LATTICE_SKIP("the avx512 level is not run here (no AVX-512 VNNI, or LATTICE_ISA caps it)");
    using amx::TileModel;
    alignas(64) uint8_t a[16 * 64], b[16 * 64];
    alignas(64) int32_t c[16 * 16];
    std::memset(a, 0xFF, sizeof a);  // -1 signed, 255 unsigned
    std::memset(b, 0x02, sizeof b);
    b[0] = 0xFE;  // B[0][0]: 254 unsigned, -2 signed
    TileModel::configure(amx::gemm_config(16, 32));
    TileModel::load_a<0>(a, 64);
    TileModel::load_b<0>(b);
    TileModel::dot_su<0, 0>();  // s8 A x u8 B: C[m][0] = -254 - 2 * 31 over 32 bytes
    TileModel::store_c<0, 0>(c, 64);
    CHECK(c[0] == -254 - 2 * 31);
    CHECK(c[1] == -2 * 32);
    TileModel::zero_c<0, 0>();
    TileModel::dot<0, 0>();  // u8 A x s8 B: 255 * -2 + 255 * 2 * 31
    TileModel::store_c<0, 0>(c, 64);
    CHECK(c[0] == 255 * -2 + 255 * 2 * 31);
    amx::TileConfig cfg = amx::gemm_config(16, 32);
    cfg.rows[6] = 16;  // B of 16 rows against A's 32 bytes: #UD
    TileModel::configure(cfg);
    TileModel::load_a<0>(a, 64);
    TileModel::load_b<0>(b);
    CHECK_THROWS_AS((TileModel::dot_su<0, 0>()), Error);
    TileModel::release();
}

TEST_CASE("int4 AMX tiles [amx]: the instructions equal the VNNI kernel; the amx level runs them from m = 16") {
    if (!isa_supported(IsaLevel::kAmx)) LATTICE_SKIP("AMX cannot run here: " << amx_note());
    const std::vector<IsaLevel> levels = supported_isas();
    if (levels.back() != IsaLevel::kAmx) LATTICE_SKIP("the amx level is not run here (LATTICE_ISA caps it)");
    check_shapes(&int4_detail::w4a8_panels_amx);
    check_kquant(&int4_detail::w4a8_kq_panels_amx);
    // Through the front: weights packed for amx run the tiles at m >= 16 and the VNNI kernel below; the floats equal
    // those of weights packed for avx512 (an act-order permutation included).
    std::mt19937 rng(8);
    const int64_t n = 70, k = 300;
    for (Int4Kind kind : kKinds) {
        const Int4Weights q = random_int4(n, k, 32, kind, rng, kind == Int4Kind::kZeroPoint);
        const PackedInt4 tiles = pack_int4_weights(q.matrix(), IsaLevel::kAmx);
        const PackedInt4 vnni = pack_int4_weights(q.matrix(), IsaLevel::kAvx512Vnni);
        ThreadPool pool(2, false);
        for (int64_t m : {5, 16, 41}) {
            CAPTURE(m);
            CAPTURE(int(kind));
            const std::vector<float> x = random_f32(size_t(m * k), rng);
            std::vector<float> y_tiles(size_t(m * n)), y_vnni(size_t(m * n));
            clear_paths();
            gemm_w4a8(x.data(), m, k, tiles, y_tiles.data(), pool);
            REQUIRE(last_path(KernelFamily::kGemmInt4).has_value());
            CHECK(*last_path(KernelFamily::kGemmInt4) == (m >= kInt4AmxMinM ? IsaLevel::kAmx : IsaLevel::kAvx512Vnni));
            gemm_w4a8(x.data(), m, k, vnni, y_vnni.data(), pool);
            CHECK(std::memcmp(y_tiles.data(), y_vnni.data(), y_tiles.size() * sizeof(float)) == 0);
        }
    }
}
