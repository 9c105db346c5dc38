// doctest entry point shared by every test executable. Tests that need hardware this machine may
// lack (LATTICE_TEST_CUDA_DEVICES > 0: that many CUDA devices) check for it before running any
// case and otherwise exit with kSkipCode, which CTest reports as "Skipped" with the printed reason
// (SKIP_RETURN_CODE in tests/CMakeLists.txt) — never as a pass. A single case that cannot check
// what it is for here says so with LATTICE_SKIP (tests/test_skip.h); a run in which every case that
// ran skipped exits kSkipCode too, and one in which a skip sits beside a completed case fails.
// Queries that run no case (--list-test-cases, --count, --help ...) answer without the device check,
// so benchmarks/gpu/run_cuda_tests.py can list a CUDA binary's cases anywhere.
// LATTICE_TEST_INJECT (benchmarks/gpu/check.sh's proof that one bad test costs nothing else): a
// comma-separated list of fail:<binary> and hang:<binary>; the named binary (argv[0]'s file name)
// then fails at once, or hangs until killed, before any case runs. Never set outside that proof.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/test_skip.h"

#if LATTICE_TEST_CUDA_DEVICES > 0
#include <cuda_runtime_api.h>
#endif

namespace {
constexpr int kSkipCode = 77;

int g_cases_run = 0;                    // test cases started (a case with subcases counts once)
std::vector<std::string> g_skipped;     // "case: reason" per skipped case
std::string g_current_case;

// Counts the cases that run, so that a skip never turns a run with passing cases into "Skipped".
struct CaseCounter : doctest::IReporter {
    explicit CaseCounter(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& d) override {
        ++g_cases_run;
        g_current_case = d.m_name;
    }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
}  // namespace

DOCTEST_REGISTER_LISTENER("lattice_case_counter", 1, CaseCounter);

namespace lattice::test {
void record_skip(const std::string& reason) {
    const std::string line = g_current_case + ": " + reason;
    // A case re-entered for its subcases may skip once per pass: record it once.
    if (g_skipped.empty() || g_skipped.back() != line) g_skipped.push_back(line);
    std::printf("SKIP: %s\n", line.c_str());
    std::fflush(stdout);
}
}  // namespace lattice::test

namespace {
// True when argv asks doctest a question (list, count, help, version) instead of running cases.
bool query_only(int argc, char** argv) {
    static const char* const kQueries[] = {
        "list-test-cases", "ltc", "list-test-suites", "lts", "list-reporters", "lr", "count", "c", "help", "h", "?",
        "version",         "v"};
    for (int i = 1; i < argc; ++i) {
        const char* a = argv[i];
        if (a[0] != '-') continue;
        a += a[1] == '-' ? 2 : 1;
        if (std::strncmp(a, "dt-", 3) == 0) a += 3;
        const std::string flag(a, std::strcspn(a, "="));
        for (const char* q : kQueries)
            if (flag == q) return true;
    }
    return false;
}

// LATTICE_TEST_INJECT: "fail:<binary>" exits 1, "hang:<binary>" blocks until killed.
void inject_fault(const char* argv0) {
    const char* spec = std::getenv("LATTICE_TEST_INJECT");
    if (!spec || !*spec) return;
    const char* slash = std::strrchr(argv0, '/');
    const std::string self = slash ? slash + 1 : argv0;
    std::string item;
    for (const char* p = spec;; ++p) {
        if (*p != ',' && *p != '\0') {
            item += *p;
            continue;
        }
        const size_t colon = item.find(':');
        if (colon != std::string::npos && item.substr(colon + 1) == self) {
            const std::string what = item.substr(0, colon);
            std::printf("LATTICE_TEST_INJECT: injected %s in %s\n", what.c_str(), self.c_str());
            std::fflush(stdout);
            if (what == "fail") std::exit(1);
            if (what == "hang")
                for (;;) pause();
        }
        item.clear();
        if (*p == '\0') break;
    }
}
}  // namespace

int main(int argc, char** argv) {
    const bool query = query_only(argc, argv);
    if (!query) inject_fault(argv[0]);
#if LATTICE_TEST_CUDA_DEVICES > 0
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (!query && (err != cudaSuccess || count < LATTICE_TEST_CUDA_DEVICES)) {
        std::printf("SKIP: needs %d CUDA device(s), found %d (%s)\n", LATTICE_TEST_CUDA_DEVICES,
                    err == cudaSuccess ? count : 0, err == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorString(err));
        std::fflush(stdout);
        return kSkipCode;
    }
#endif
    doctest::Context ctx(argc, argv);
    const int rc = ctx.run();
    if (rc != 0 || g_skipped.empty() || ctx.shouldExit()) return rc;
    if (int(g_skipped.size()) < g_cases_run) {
        std::printf("FAILED: %zu of %d test cases skipped beside cases that ran: a skip would hide their result; "
                    "give the skipping case a ctest entry of its own (tests/test_skip.h)\n",
                    g_skipped.size(), g_cases_run);
        return 1;
    }
    for (const std::string& s : g_skipped) std::printf("SKIP: %s\n", s.c_str());
    return kSkipCode;
}
