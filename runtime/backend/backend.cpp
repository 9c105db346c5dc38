// Names for Backend enums (for CLI parsing and error messages).
#include "runtime/backend/backend.h"

namespace lattice {

std::string_view quant_mode_name(QuantMode q) {
    switch (q) {
        case QuantMode::kNone: return "none";
        case QuantMode::kW8A16: return "w8a16";
        case QuantMode::kW8A8: return "w8a8";
    }
    return "?";
}

QuantMode parse_quant_mode(std::string_view s) {
    if (s == "none") return QuantMode::kNone;
    if (s == "w8a16") return QuantMode::kW8A16;
    if (s == "w8a8") return QuantMode::kW8A8;
    LATTICE_FAIL("unknown quantization \"{}\" (expected none, w8a16 or w8a8)", s);
}

std::string_view op_name(Op op) {
    switch (op) {
        case Op::kEmbed: return "embed";
        case Op::kRmsNorm: return "rmsnorm";
        case Op::kAddRmsNorm: return "add_rmsnorm";
        case Op::kRope: return "rope";
        case Op::kAttention: return "attention";
        case Op::kSiluMul: return "silu_mul";
        case Op::kAdd: return "add";
        case Op::kGemm: return "gemm";
        case Op::kGemmInt8: return "gemm_int8";
    }
    return "?";
}

}  // namespace lattice
