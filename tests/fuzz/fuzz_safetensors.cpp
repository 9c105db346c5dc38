// libFuzzer target: the safetensors header parser on arbitrary bytes. Any lattice::Error is an
// accepted rejection; a crash, leak, UB or hang is a bug.
#include "base/error.h"
#include "runtime/weights/safetensors.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto entries = lattice::parse_safetensors_header(data, size, "fuzz.safetensors");
        // Accepted headers must describe ranges inside the buffer: touch every byte they name.
        volatile uint8_t sink = 0;
        for (const auto& e : entries)
            for (int64_t i = e.begin; i < e.end; ++i) sink = sink ^ data[i];
        (void)sink;
    } catch (const lattice::Error&) {
    }
    return 0;
}
