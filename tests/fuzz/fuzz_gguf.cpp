// libFuzzer target for the GGUF reader: parse arbitrary bytes from memory, then exercise what a
// loader does with a file that parsed (every getter on every key, the model config, a converted
// first row of every tensor). Any lattice::Error is an accepted outcome; crashes, sanitizer
// reports, leaks, hangs and huge allocations are bugs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/weights/dequant.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace lattice;
    std::unique_ptr<GgufFile> f;
    try {
        f = GgufFile::parse(data, size, "fuzz.gguf");
    } catch (const Error&) {
        return 0;
    }
    for (const std::string& k : f->keys()) {
        try {
            (void)f->string_value(k);
        } catch (const Error&) {
        }
        try {
            (void)f->int_value(k);
        } catch (const Error&) {
        }
        try {
            (void)f->float_value(k);
        } catch (const Error&) {
        }
        try {
            (void)f->bool_value(k);
        } catch (const Error&) {
        }
        try {
            (void)f->string_array(k);
        } catch (const Error&) {
        }
        try {
            (void)f->float_array(k);
        } catch (const Error&) {
        }
        try {
            (void)f->int_array(k);
        } catch (const Error&) {
        }
        try {
            (void)f->array_size(k);
        } catch (const Error&) {
        }
    }
    try {
        (void)gguf_model_config(*f);
    } catch (const Error&) {
    }
    std::vector<float> row;
    const Architecture* arch = architecture_for_gguf("llama");
    for (const GgufTensor& t : f->tensors()) {
        try {
            if (arch) (void)gguf_to_hf_name(*arch, t.name);
        } catch (const Error&) {
        }
        int64_t cols = std::min<int64_t>(t.ne[0], 1 << 16);
        cols -= cols % dtype_block_elems(t.dtype);
        row.assign(size_t(cols), 0.0f);
        try {
            convert_row_slice(f->tensor_data(t), t.dtype, 0, cols, row.data(), DType::kF32);
        } catch (const Error&) {
        }
    }
    return 0;
}
