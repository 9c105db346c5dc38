// LATTICE_MULTIVERSION: compile a hot loop for AVX-512, AVX2 and baseline x86-64 and let the loader
// pick (GCC target_clones); plain code elsewhere (clang, other architectures). For code outside kernels/ (the
// sampler); kernels/cpu picks its variants by the one ISA decision instead (kernels/cpu/isa_variants.h).
#pragma once

#if defined(__x86_64__) && !defined(__clang__)
#define LATTICE_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LATTICE_MULTIVERSION
#endif
