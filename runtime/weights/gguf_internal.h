// Internals shared by the GGUF parser (gguf.cpp) and its typed accessors (gguf_lookup.cpp); not part
// of the weights room's interface. Included only by those two files.
#pragma once

#include "runtime/weights/gguf.h"

namespace lattice::gguf_internal {

// Any of the integer value types u8..i64 (not bool): what GgufValue::is_integer and int_array accept.
inline bool is_int_type(GgufType t) {
    switch (t) {
        case GgufType::kU8:
        case GgufType::kI8:
        case GgufType::kU16:
        case GgufType::kI16:
        case GgufType::kU32:
        case GgufType::kI32:
        case GgufType::kU64:
        case GgufType::kI64:
            return true;
        default:
            return false;
    }
}

}  // namespace lattice::gguf_internal
