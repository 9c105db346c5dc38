// The out-of-line throw for files nvcc compiles (see base/cuda_check.h): this file is compiled by
// the host compiler, so fmt (base/error.h) is fine here.
#include "base/cuda_check.h"

namespace lattice {

void throw_call_error_nvcc(const char* file, int line, const char* call, const std::string& what) {
    throw_call_error(file, line, call, what);
}

}  // namespace lattice
