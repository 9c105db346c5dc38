// GGUF parser: metadata getters on a synthetic file, and rejection of malformed input. Each bad
// input must raise lattice::Error whose message names the culprit (key, tensor, type, count),
// and lying counts/lengths must fail before any allocation sized by them.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "runtime/weights/gguf.h"
#include "tests/runtime/weights/gguf_builder.h"
#include "tests/test_error.h"

using lattice::Error;
using lattice::GgufFile;
using lattice::test::GgufBuilder;
using lattice::testing::error_of;

namespace {

std::string parse_error(const std::vector<uint8_t>& bytes) {
    return error_of([&] { GgufFile::parse(bytes.data(), bytes.size(), "mem.gguf"); });
}

#define CHECK_MSG_HAS(msg, part) CHECK_MESSAGE((msg).find(part) != std::string::npos, "message: " << (msg))

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// A small valid file: assorted metadata and two f32 tensors.
GgufBuilder small_builder() {
    GgufBuilder g;
    g.kv_str("general.architecture", "llama");
    g.kv_u32("general.alignment", 32);
    g.kv_u32("llama.block_count", 7);
    g.kv_i8("neg.i8", -5);
    g.kv_u16("some.u16", 65535);
    g.kv_u64("big.u64", (uint64_t(1) << 63) + 1);
    g.kv_f32("eps", 1e-5f);
    g.kv_f64("theta", 5e5);
    g.kv_bool("flag", true);
    g.kv_str_array("tokens", {"a", "bc", ""});
    g.kv_array<float>("scores", 6, {0.5f, -1.25f});
    g.kv_array<int32_t>("types", 5, {1, -2, 3});
    g.kv_array<uint8_t>("bytes", 0, {7, 255});
    // Nested: array of 2 arrays of u16 {1,2} and {3}.
    std::vector<uint8_t> nested;
    GgufBuilder::put<uint32_t>(nested, 9);
    GgufBuilder::put<uint64_t>(nested, 2);
    GgufBuilder::put<uint32_t>(nested, 2);
    GgufBuilder::put<uint64_t>(nested, 2);
    GgufBuilder::put<uint16_t>(nested, 1);
    GgufBuilder::put<uint16_t>(nested, 2);
    GgufBuilder::put<uint32_t>(nested, 2);
    GgufBuilder::put<uint64_t>(nested, 1);
    GgufBuilder::put<uint16_t>(nested, 3);
    g.kv_raw("nested", 9, nested);
    g.tensor("a.weight", 0, {3, 2}, f32_bytes({1, 2, 3, 4, 5, 6}));
    g.tensor("b.weight", 0, {5}, f32_bytes({7, 8, 9, 10, 11}));
    return g;
}

}  // namespace

TEST_CASE("gguf: metadata getters on a synthetic file") {
    GgufBuilder g = small_builder();
    auto bytes = g.build();
    auto f = GgufFile::parse(bytes.data(), bytes.size(), "mem.gguf");
    CHECK(f->version() == 3);
    CHECK(f->path() == "mem.gguf");
    CHECK(f->keys().size() == 14);
    CHECK(f->keys().front() == "general.architecture");
    CHECK(f->has("llama.block_count"));
    CHECK_FALSE(f->has("llama.nope"));
    CHECK(f->string_value("general.architecture") == "llama");
    CHECK(f->int_value("llama.block_count") == 7);
    CHECK(f->int_value("neg.i8") == -5);
    CHECK(f->int_value("some.u16") == 65535);
    CHECK(f->float_value("eps") == 1e-5);  // shortest decimal of the f32, exactly
    CHECK(f->float_value("theta") == 5e5);
    CHECK(f->float_value("llama.block_count") == 7.0);  // integers read as numbers
    CHECK(f->bool_value("flag") == true);
    CHECK_FALSE(f->int_value("absent").has_value());
    CHECK_FALSE(f->string_value("absent").has_value());
    CHECK(f->string_array("absent").empty());
    CHECK(f->string_array("tokens") == std::vector<std::string>{"a", "bc", ""});
    CHECK(f->float_array("scores") == std::vector<float>{0.5f, -1.25f});
    CHECK(f->int_array("types") == std::vector<int32_t>{1, -2, 3});
    CHECK(f->int_array("bytes") == std::vector<int32_t>{7, 255});
    CHECK(f->array_size("tokens") == 3);
    const lattice::GgufValue* n = f->find("nested");
    REQUIRE(n != nullptr);
    REQUIRE(n->count == 2);
    CHECK(n->element(0).count == 2);
    CHECK(n->element(0).element(1).u == 2);
    CHECK(n->element(1).element(0).u == 3);

    // Wrong types throw, naming the key and its type.
    std::string m = error_of([&] { f->string_array("scores"); });
    CHECK_MSG_HAS(m, "\"scores\"");
    CHECK_MSG_HAS(m, "f32");
    m = error_of([&] { f->int_value("general.architecture"); });
    CHECK_MSG_HAS(m, "general.architecture");
    CHECK_MSG_HAS(m, "string");
    m = error_of([&] { f->int_value("big.u64"); });
    CHECK_MSG_HAS(m, "overflows int64");
    m = error_of([&] { f->float_array("tokens"); });
    CHECK_MSG_HAS(m, "tokens");
    m = error_of([&] { f->int_array("scores"); });
    CHECK_MSG_HAS(m, "scores");
    m = error_of([&] { f->bool_value("eps"); });
    CHECK_MSG_HAS(m, "eps");

    REQUIRE(f->tensors().size() == 2);
    const auto& a = f->tensor("a.weight");
    CHECK(a.ne == std::vector<int64_t>{3, 2});
    CHECK(a.nbytes == 24);
    CHECK(a.offset == 0);
    const auto& b = f->tensor("b.weight");
    CHECK(b.offset == 32);
    float v[5];
    std::memcpy(v, f->tensor_data(b), 20);
    CHECK(v[0] == 7.0f);
    CHECK(v[4] == 11.0f);
    CHECK(f->data_offset() % 32 == 0);
    CHECK(f->find_tensor("c.weight") == nullptr);
    CHECK_MSG_HAS(error_of([&] { f->tensor("c.weight"); }), "c.weight");
}

TEST_CASE("gguf: version 2 parses, other versions and bad magic fail") {
    GgufBuilder g = small_builder();
    auto v2 = g.build(2);
    CHECK(GgufFile::parse(v2.data(), v2.size(), "v2")->version() == 2);
    for (uint32_t v : {0u, 1u, 4u, 99u}) {
        auto b = g.build(v);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "unsupported GGUF version " + std::to_string(v));
    }
    auto be = g.build(0x03000000u);
    CHECK_MSG_HAS(parse_error(be), "big-endian");
    auto b = g.build();
    b[0] = 'X';
    CHECK_MSG_HAS(parse_error(b), "bad magic");
    CHECK_MSG_HAS(parse_error({}), "truncated");
    CHECK_MSG_HAS(parse_error({'G', 'G', 'U', 'F'}), "truncated");
}

TEST_CASE("gguf: every truncation of a valid file fails cleanly") {
    GgufBuilder g = small_builder();
    auto full = g.build();
    REQUIRE_NOTHROW(GgufFile::parse(full.data(), full.size(), "full"));
    // Stop short of the last tensor's end: every prefix misses a byte the file needs.
    size_t need = g.data_start + 32 + 20;
    REQUIRE(full.size() == need);
    int errors = 0;
    for (size_t n = 0; n < need; ++n) {
        std::string m = parse_error(std::vector<uint8_t>(full.begin(), full.begin() + long(n)));
        bool ok = m.find("truncated") != std::string::npos || m.find("beyond the end") != std::string::npos ||
                  m.find("past the end") != std::string::npos || m.find("cannot fit") != std::string::npos;
        CHECK_MESSAGE(ok, "prefix " << n << ": " << m);
        errors += ok;
    }
    CHECK(errors == int(need));
}

TEST_CASE("gguf: lying counts and lengths fail before allocating") {
    GgufBuilder g = small_builder();
    auto base = g.build();
    SUBCASE("tensor count") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, 8, uint64_t(1) << 60);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "tensor count 1152921504606846976");
    }
    SUBCASE("kv count") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, 16, ~uint64_t(0));
        CHECK_MSG_HAS(parse_error(b), "kv count 18446744073709551615");
        // A count that fits the bytes but is one too many runs into the tensor infos and fails there.
        b = base;
        GgufBuilder::patch<uint64_t>(b, 16, g.n_kv + 1);
        CHECK(parse_error(b) != "(no error)");
    }
    SUBCASE("key string length") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.kv_start + g.kv_pos[2], uint64_t(1) << 40);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "kv key length 1099511627776");
    }
    SUBCASE("string value length") {
        auto b = base;
        // general.architecture value: after key (8 + 20 bytes) and type (4).
        GgufBuilder::patch<uint64_t>(b, g.kv_start + 8 + 20 + 4, uint64_t(1) << 50);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "general.architecture");
        CHECK_MSG_HAS(m, "truncated");
    }
    SUBCASE("array length") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.kv_start + g.array_count_pos[1], uint64_t(1) << 61);  // "scores"
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "\"scores\"");
        CHECK_MSG_HAS(m, "array length 2305843009213693952");
        b = base;
        GgufBuilder::patch<uint64_t>(b, g.kv_start + g.array_count_pos[0], uint64_t(1) << 62);  // "tokens"
        CHECK_MSG_HAS(parse_error(b), "\"tokens\"");
    }
    SUBCASE("tensor name length") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_name_pos[1], uint64_t(1) << 33);
        CHECK_MSG_HAS(parse_error(b), "tensor name length 8589934592");
    }
    SUBCASE("tensor dims") {
        auto b = base;
        GgufBuilder::patch<uint32_t>(b, g.tensor_name_pos[0] + 8 + 8, 9);  // n_dims of a.weight
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "a.weight");
        CHECK_MSG_HAS(m, "9 dimensions");
        b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_name_pos[0] + 8 + 8 + 4, 0);  // ne[0] = 0
        CHECK_MSG_HAS(parse_error(b), "a.weight");
        b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_name_pos[0] + 8 + 8 + 4, uint64_t(1) << 40);
        GgufBuilder::patch<uint64_t>(b, g.tensor_name_pos[0] + 8 + 8 + 12, uint64_t(1) << 40);  // product overflows
        CHECK_MSG_HAS(parse_error(b), "a.weight");
    }
}

TEST_CASE("gguf: bad tensor offsets, types and duplicates name the tensor") {
    GgufBuilder g = small_builder();
    auto base = g.build();
    SUBCASE("offset beyond the file") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_offset_pos[1], 4096);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "b.weight");
        CHECK_MSG_HAS(m, "beyond the end");
        b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_offset_pos[1], ~uint64_t(0) - 31);  // wraps if added naively
        CHECK_MSG_HAS(parse_error(b), "b.weight");
    }
    SUBCASE("misaligned offset") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_offset_pos[1], 24);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "b.weight");
        CHECK_MSG_HAS(m, "alignment 32");
    }
    SUBCASE("overlapping tensors") {
        auto b = base;
        GgufBuilder::patch<uint64_t>(b, g.tensor_offset_pos[1], 0);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "overlap");
        CHECK_MSG_HAS(m, "a.weight");
        CHECK_MSG_HAS(m, "b.weight");
    }
    SUBCASE("unsupported tensor types") {
        auto b = base;
        GgufBuilder::patch<uint32_t>(b, g.tensor_type_pos[1], 10);
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "b.weight");
        CHECK_MSG_HAS(m, "ggml type 10 (q2_K)");
        CHECK_MSG_HAS(m, "q5_1, q4_K, q5_K, q6_K)");  // the supported list
        b = base;
        GgufBuilder::patch<uint32_t>(b, g.tensor_type_pos[0], 1234);
        m = parse_error(b);
        CHECK_MSG_HAS(m, "a.weight");
        CHECK_MSG_HAS(m, "ggml type 1234 (unknown)");
    }
    SUBCASE("block type with a ragged innermost dim") {
        GgufBuilder q;
        q.tensor("q.weight", 8, {48, 1}, std::vector<uint8_t>(68, 0));
        auto b = q.build();
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "q.weight");
        CHECK_MSG_HAS(m, "block size 32");
    }
    SUBCASE("duplicate tensor names") {
        GgufBuilder d;
        d.tensor("x.weight", 0, {1}, f32_bytes({1}));
        d.tensor("x.weight", 0, {1}, f32_bytes({2}));
        auto b = d.build();
        CHECK_MSG_HAS(parse_error(b), "duplicate tensor name \"x.weight\"");
    }
    SUBCASE("duplicate keys") {
        GgufBuilder d;
        d.kv_u32("k.a", 1);
        d.kv_u32("k.a", 2);
        auto b = d.build();
        CHECK_MSG_HAS(parse_error(b), "duplicate metadata key \"k.a\"");
    }
}

TEST_CASE("gguf: unknown value types, bad alignment and deep nesting are rejected") {
    SUBCASE("unknown kv type") {
        GgufBuilder g;
        g.kv_raw("odd.key", 13, {0, 0, 0, 0});
        auto b = g.build();
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "\"odd.key\"");
        CHECK_MSG_HAS(m, "unknown value type 13");
    }
    SUBCASE("unknown array element type") {
        GgufBuilder g;
        std::vector<uint8_t> v;
        GgufBuilder::put<uint32_t>(v, 77);
        GgufBuilder::put<uint64_t>(v, 1);
        g.kv_raw("arr.key", 9, v);
        auto b = g.build();
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "\"arr.key\"");
        CHECK_MSG_HAS(m, "unknown array element type 77");
    }
    SUBCASE("bool out of range") {
        GgufBuilder g;
        g.kv_raw("b.key", 7, {2});
        auto b = g.build();
        CHECK_MSG_HAS(parse_error(b), "\"b.key\"");
    }
    SUBCASE("alignment") {
        for (uint32_t a : {0u, 3u, 48u}) {
            GgufBuilder g;
            g.kv_u32("general.alignment", a);
            auto b = g.build();
            CHECK_MSG_HAS(parse_error(b), "general.alignment " + std::to_string(a));
        }
        GgufBuilder g;
        g.kv_str("general.alignment", "32");
        auto b = g.build();
        CHECK_MSG_HAS(parse_error(b), "general.alignment has type string");
    }
    SUBCASE("custom alignment is honoured") {
        GgufBuilder g;
        g.kv_u32("general.alignment", 64);
        g.tensor("a", 0, {3}, f32_bytes({1, 2, 3}));
        g.tensor("b", 0, {2}, f32_bytes({4, 5}));
        auto b = g.build(3, 64);
        auto f = GgufFile::parse(b.data(), b.size(), "a64");
        CHECK(f->alignment() == 64);
        CHECK(f->data_offset() % 64 == 0);
        CHECK(f->tensor("b").offset == 64);
    }
    SUBCASE("too many nested arrays") {
        // 2^20 + 1 empty u8 arrays inside one array: 12 bytes each in the file, rejected by the cap.
        std::vector<uint8_t> v;
        const uint64_t n = (uint64_t(1) << 20) + 1;
        GgufBuilder::put<uint32_t>(v, 9);
        GgufBuilder::put<uint64_t>(v, n);
        for (uint64_t k = 0; k < n; ++k) {
            GgufBuilder::put<uint32_t>(v, 0);
            GgufBuilder::put<uint64_t>(v, 0);
        }
        GgufBuilder g;
        g.kv_raw("many", 9, v);
        auto b = g.build();
        std::string m = parse_error(b);
        CHECK_MSG_HAS(m, "\"many\"");
        CHECK_MSG_HAS(m, "nested arrays");
    }
    SUBCASE("nesting depth") {
        std::vector<uint8_t> v;
        for (int d = 0; d < 10; ++d) {
            GgufBuilder::put<uint32_t>(v, 9);
            GgufBuilder::put<uint64_t>(v, 1);
        }
        GgufBuilder::put<uint32_t>(v, 0);
        GgufBuilder::put<uint64_t>(v, 0);
        GgufBuilder g;
        g.kv_raw("deep", 9, v);
        auto b = g.build();
        CHECK_MSG_HAS(parse_error(b), "nested deeper");
    }
}

TEST_CASE("gguf: open() reports missing and non-GGUF files by path") {
    CHECK_MSG_HAS(error_of([] { GgufFile::open("/nonexistent/x.gguf"); }), "/nonexistent/x.gguf");
    std::string p = std::string(LATTICE_BINARY_DIR) + "/test_gguf_not_gguf.bin";
    {
        std::ofstream o(p, std::ios::binary);
        o << "this is not a gguf file at all, but long enough";
    }
    std::string m = error_of([&] { GgufFile::open(p); });
    CHECK_MSG_HAS(m, p);
    CHECK_MSG_HAS(m, "bad magic");
    std::remove(p.c_str());
}
