// CPU backend: one copy of the kernels per instruction set (shared part).
//
// cpu_simd.hpp and cpu_kernels.hpp are included three times, each inside its
// own namespace and `#pragma GCC target` region, so the library is built for
// baseline x86-64 and still carries AVX2 and AVX-512 kernels; cpu_isa.cpp
// picks one at run time with __builtin_cpu_supports (no global -march).
// Each table maps (activation dtype, activation, W class) to a tile kernel:
// W in 1..4 gets a register-window kernel, any other W the generic one.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <cmath>
#include <cstring>

#include "cpu/cpu_plan.hpp"

namespace shortconv::cpu {

// One translation unit per ISA (cpu_isa_sse2.cpp, cpu_isa_avx2.cpp,
// cpu_isa_avx512.cpp), so they compile in parallel: each expands the
// kernels hundreds of times, and under the sanitizers one combined unit took
// over ten minutes.  Each defines its table with SC_TABLE(name) (the end of
// cpu_kernels.hpp) inside its own namespace.
const Kernels& kernels_sse2();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();

}  // namespace shortconv::cpu
