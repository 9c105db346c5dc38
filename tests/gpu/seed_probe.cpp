// The seed plumbing of the CUDA tests (tests/kernels/cuda/cuda_test_util.h), on the CPU: three cases
// that print the seeds fresh_seed() gives them, run by tests/gpu/test_seed.py (ctest gpu_test_seed) with
// and without LATTICE_TEST_SEED, whole and case by case. Built only with the CUDA toolkit (the header
// includes cuda_runtime_api.h); it calls no CUDA function, so it runs without a GPU.
#include <doctest/doctest.h>

#include "tests/kernels/cuda/cuda_test_util.h"

using namespace lattice::test;

TEST_CASE("seed probe: first") {
    const uint64_t a = fresh_seed(), b = fresh_seed();
    MESSAGE("seed first " << a << " " << b);
    CHECK(a != b);
}

TEST_CASE("seed probe: second, with a comma") {
    MESSAGE("seed second " << fresh_seed());
}

TEST_CASE("seed probe: subcases") {
    SUBCASE("x") { MESSAGE("seed sub x " << fresh_seed()); }
    SUBCASE("y") { MESSAGE("seed sub y " << fresh_seed()); }
}
