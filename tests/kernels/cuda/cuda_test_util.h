// Helpers for the CUDA tests: RAII device buffers with poisoning, host rounding to the activation
// dtype, random data, and named tolerances. Without a CUDA device the tests never start: their
// main exits 77 and CTest reports them skipped (tests/doctest_main.cpp).
//
// Seeds (reproducible failures): every random input of a CUDA test comes from fresh_seed(), which is
// derived from one base seed per process, the name of the running test case and a counter that
// restarts with each case (and each subcase pass). The base is LATTICE_TEST_SEED when set (decimal or
// 0x hex), else drawn from std::random_device; the binary prints "LATTICE_TEST_SEED=<base>" before its
// first case and "[case] <name>" as each case starts (so a hang or a crash names its case). Rerunning
// the binary, or one case of it (--test-case=...), with the printed base draws the same data:
// benchmarks/gpu/run_cuda_tests.py sets the base of every run and reruns a failure with it.
#pragma once

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace lattice::test {

inline int cuda_devices() {
    static const int n = [] {
        int c = 0;
        if (cudaGetDeviceCount(&c) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return c;
    }();
    return n;
}

// REQUIRE that a CUDA runtime call succeeded, naming its error (the first CUDA error of a failed run is
// what benchmarks/gpu/run_cuda_tests.py reports: "cudaErrorIllegalAddress: an illegal memory access ...").
#define CUDA_OK(call)                                                                                   \
    do {                                                                                                \
        const cudaError_t cuda_ok_err_ = (call);                                                        \
        REQUIRE_MESSAGE(cuda_ok_err_ == cudaSuccess, #call << ": " << cudaGetErrorName(cuda_ok_err_) << ": " \
                                                            << cudaGetErrorString(cuda_ok_err_));       \
    } while (0)

// ---- tolerances of a kernel against its CPU / float64 reference (docs/gpu-check.md, "Tolerances") ----
// The derivation. The test rounds every input to the activation dtype on the host and gives the same
// values to both sides, so input rounding cancels. What remains, per output element y:
//   (a) the output's rounding to the activation dtype: |e| <= u |y|, u = 2^-11 = 4.9e-4 (f16, round to
//       nearest) or 2^-8 = 3.9e-3 (bf16); at most one more such rounding where a fused kernel stores an
//       intermediate (the residual of add_rmsnorm, silu_mul's product) and the CPU keeps it in fp32:
//       together <= 2u |y| (the next op is Lipschitz ~1 in relative terms: a norm, a product);
//   (b) fp32 summation order (dots, softmax sums, norms): products of act-dtype values and int8 weights
//       are exact in fp32; each addition adds <= 2^-24 of its partial sum, and with random signs the
//       total is ~2^-24 sqrt(k) of the row's scale: k = 8200 gives 5e-6, two orders under (a);
//   (c) libm: expf / sinf / rsqrtf differ between host and device by <= 2 ulp of fp32 (1.2e-7).
// So relative L2 and per-row max error are <= 2u + 1e-5 in the worst case (no probability involved:
// every element's bound holds, so the tensor's and the row's hold). The tolerances are 8u (f16) and
// ~8u / 5u (bf16): 4x / 2.5x over that bound, so a failure is a wrong element, not rounding luck. The
// exception is an fp32 value within 1e-7 relative of an act-dtype rounding boundary, where (b) or (c)
// flips the rounding: that element is off by one u, still inside 2u.
constexpr double kTolF16 = 4e-3;
constexpr double kTolBF16 = 3e-2;
inline double tol_for(DType act) {
    return act == DType::kF16 ? kTolF16 : kTolBF16;
}

inline uint16_t to_act_bits(float f, DType act) {
    return act == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
}
inline float from_act_bits(uint16_t h, DType act) {
    return act == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}
// Rounds x through the activation dtype (what the device will see).
inline float round_act(float f, DType act) {
    return from_act_bits(to_act_bits(f, act), act);
}

inline std::vector<uint16_t> to_act(const std::vector<float>& v, DType act) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = to_act_bits(v[i], act);
    return o;
}
inline std::vector<float> from_act(const std::vector<uint16_t>& v, DType act) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = from_act_bits(v[i], act);
    return o;
}

// ---- seeds (see the header comment) ----
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The process's base seed: LATTICE_TEST_SEED, else random. Exits 2 on an unparsable value (a typo must
// not silently draw fresh data while the user believes they are reproducing a run).
inline uint64_t base_seed() {
    static const uint64_t base = [] {
        const char* env = std::getenv("LATTICE_TEST_SEED");
        if (env && *env) {
            char* end = nullptr;
            const unsigned long long v = std::strtoull(env, &end, 0);
            if (end && *end == '\0') return uint64_t(v);
            std::fprintf(stderr, "LATTICE_TEST_SEED=%s is not a number\n", env);
            std::exit(2);
        }
        std::random_device rd;
        return (uint64_t(rd()) << 32) | rd();
    }();
    return base;
}

struct SeedState {
    std::string case_name;
    uint64_t counter = 0;
};
inline SeedState& seed_state() {
    static SeedState s;
    return s;
}

// Prints the base seed once and each case's name as it starts; restarts the per-case counter.
// Registered from every file that includes this header: doctest keeps one listener per name.
struct SeedListener : doctest::IReporter {
    explicit SeedListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {
        std::printf("LATTICE_TEST_SEED=%llu\n", static_cast<unsigned long long>(base_seed()));
        std::fflush(stdout);
    }
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& d) override {
        seed_state() = {d.m_name, 0};
        std::printf("[case] %s\n", d.m_name);
        std::fflush(stdout);
    }
    void test_case_reenter(const doctest::TestCaseData& d) override { seed_state() = {d.m_name, 0}; }
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
DOCTEST_REGISTER_LISTENER("lattice_test_seed", 2, SeedListener);

// The next seed of the running case: splitmix64 of (base, FNV-1a of the case name, counter). The same
// base gives the same sequence in a case whatever other cases run before it.
inline uint64_t fresh_seed() {
    SeedState& s = seed_state();
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s.case_name) h = (h ^ c) * 1099511628211ull;
    return splitmix64(splitmix64(base_seed() ^ h) + s.counter++);
}

inline std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = double(got[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
        if (!std::isfinite(got[i])) return INFINITY;  // poisoned / unwritten element
    }
    return std::sqrt(num / (den > 0 ? den : 1.0));
}

// Per-row max error: max over rows of max_j |got - ref| / max_j |ref| (a row of zeros divides by 1).
// Relative L2 over a whole tensor hides one bad row among many (a wrong head, token or output
// channel); this does not. Unwritten (NaN) elements give infinity.
inline double max_row_err(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
        double diff = 0, scale = 0;
        for (int64_t j = 0; j < cols; ++j) {
            const size_t i = size_t(r * cols + j);
            if (!std::isfinite(got[i])) return INFINITY;
            diff = std::max(diff, std::fabs(double(got[i]) - double(ref[i])));
            scale = std::max(scale, std::fabs(double(ref[i])));
        }
        worst = std::max(worst, diff / (scale > 0 ? scale : 1.0));
    }
    return worst;
}

// Per-row tolerances (max |got - ref| over the row / max |ref| of the row): the bound above, 2u + 1e-5 of
// the row's largest value (2^-10 f16, 2^-7 bf16), against 4e-3 (8u) and 2e-2 (5u).
constexpr double kRowTolF16 = 4e-3;
constexpr double kRowTolBF16 = 2e-2;
inline double row_tol_for(DType act) {
    return act == DType::kF16 ? kRowTolF16 : kRowTolBF16;
}

// Both measures against the activation dtype's tolerances (got and ref are [rows, cols]).
inline void check_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols,
                        DType act) {
    REQUIRE(got.size() == size_t(rows * cols));
    REQUIRE(ref.size() == got.size());
    const double l2 = rel_err(got, ref), row = max_row_err(got, ref, rows, cols);
    INFO("rows " << rows << " cols " << cols << ": relative L2 " << l2 << ", per-row max " << row);
    CHECK(l2 < tol_for(act));
    CHECK(row < row_tol_for(act));
}

inline bool any_nonzero(const std::vector<float>& v) {
    for (float x : v)
        if (x != 0.0f) return true;
    return false;
}

// Device buffer of `bytes`, poisoned with 0xFF (NaN for f16/bf16/f32, -1 for ints) on creation.
class DevBuf {
public:
    explicit DevBuf(size_t bytes) : bytes_(bytes) {
        CUDA_OK(cudaMalloc(&p_, bytes ? bytes : 1));
        CUDA_OK(cudaMemset(p_, 0xFF, bytes ? bytes : 1));
    }
    template <typename T>
    explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size() * sizeof(T)) {
        upload(host);
    }
    ~DevBuf() { cudaFree(p_); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;

    template <typename T>
    void upload(const std::vector<T>& host) {
        REQUIRE(host.size() * sizeof(T) <= bytes_);
        CUDA_OK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    template <typename T>
    std::vector<T> download(size_t n) const {
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<T> h(n);
        REQUIRE(n * sizeof(T) <= bytes_);
        CUDA_OK(cudaMemcpy(h.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
    void poison() { CUDA_OK(cudaMemset(p_, 0xFF, bytes_ ? bytes_ : 1)); }
    template <typename T = void>
    T* get() const {
        return static_cast<T*>(p_);
    }

private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace lattice::test
