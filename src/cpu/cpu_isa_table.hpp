// CPU backend: one copy of the kernels per instruction set (shared part).
//
// cpu_simd.hpp and cpu_kernels.hpp are included once per instruction set,
// each inside its own namespace: 128-bit vectors on every architecture
// (cpu_isa_v128.cpp: SSE2 on x86-64, NEON on aarch64, GCC's generic vectors
// elsewhere) and, on x86-64 only, AVX2 and AVX-512 inside `#pragma GCC
// target` regions, so the library is built for the architecture's baseline
// and still carries the wider kernels; cpu_isa.cpp picks one at run time
// with __builtin_cpu_supports (no global -march).  Nothing outside the x86
// branches here and in cpu_simd.hpp assumes x86.
// Each table maps (activation dtype, activation, W class) to a tile kernel:
// W in 1..4 gets a register-window kernel, any other W the generic one.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#define SC_X86 1
#include <immintrin.h>
#else
#define SC_X86 0
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#endif

#include <algorithm>
#include <type_traits>
#include <utility>
#include <cmath>
#include <cstring>

#include "cpu/cpu_plan.hpp"

namespace shortconv::cpu {

// One translation unit per ISA (cpu_isa_v128.cpp, cpu_isa_avx2.cpp,
// cpu_isa_avx512.cpp), so they compile in parallel: each expands the
// kernels hundreds of times, and under the sanitizers one combined unit took
// over ten minutes.  Each defines its table with SC_TABLE(name) (the end of
// cpu_kernels.hpp) inside its own namespace.
const Kernels& kernels_v128();
#if SC_X86
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512bf16();  // (the same unit: cpu_isa_avx512.cpp)
#endif

// The name of the 128-bit table (SHORTCONV_CPU_ISA accepts it).
#if SC_X86
inline constexpr const char* kV128Name = "sse2";
#elif defined(__aarch64__)
inline constexpr const char* kV128Name = "neon";
#else
inline constexpr const char* kV128Name = "generic";
#endif

}  // namespace shortconv::cpu
