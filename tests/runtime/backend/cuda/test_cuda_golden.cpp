// The golden tiny checkpoints end to end on the GPU: the one Model forward on CudaBackend (TP = 1,
// one device) against the independent float64 reference logits of every prompt position.
// Tolerances (relative L2 over all logits): fp16 activations 1e-2 (the bar), bf16 3e-2
// (8-bit mantissa activations). Prompts are scored in chunks of 3 tokens too, so prefill tiles,
// the decode path (1-token chunks would be decode) and KV reuse across calls are all exercised.
#include "tests/kernels/cuda/cuda_test_util.h"
#include "runtime/backend/cuda/cuda_backend.h"
#include "runtime/builder/build.h"
#include "tests/runtime/model/golden.h"
#include "runtime/model/model.h"
#include "runtime/weights/tensor_source.h"

using namespace lattice;
using namespace lattice::testing;

TEST_CASE("golden checkpoints on CudaBackend: logits vs the float64 reference" * doctest::test_suite("cuda")) {
    for (const auto& name : golden_models()) {
        const auto cases = load_golden(name);
        REQUIRE(!cases.empty());
        for (DType act : {DType::kF16, DType::kBF16}) {
            for (int64_t chunk : {int64_t(256), int64_t(3), int64_t(1)}) {
                CAPTURE(name);
                CAPTURE(dtype_name(act));
                CAPTURE(chunk);
                auto src = open_model(golden_dir(name));
                CudaBackend be(0, act);
                ModelOptions mo;
                mo.max_batch_tokens = chunk;
                Model model(*src, be, mo, nullptr);
                auto gen = make_local_engine(model);
                for (const GoldenCase& c : cases) {
                    std::vector<float> logits = gen->score(c.prompt);
                    REQUIRE(logits.size() == c.logits.size());
                    const double err = rel_error(logits.data(), c.logits.data(), logits.size());
                    MESSAGE(name << " " << dtype_name(act) << " chunk " << chunk << ": rel err " << err);
                    CHECK(err < (act == DType::kF16 ? 1e-2 : 3e-2));
                }
            }
        }
    }
}
