// Unaligned loads of little-endian integers from a byte buffer (file blocks, packed weights): memcpy, which
// the compiler turns into one plain load. The file formats lattice reads (GGUF blocks, the packed 4-bit
// layouts) store little-endian and every host it runs on is little-endian, so no byte swap is done.
#pragma once

#include <cstdint>
#include <cstring>

namespace lattice {

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

}  // namespace lattice
