// CPU backend: one copy of the kernels per instruction set.
//
// cpu_simd.hpp and cpu_kernels.hpp are included three times, each inside its
// own namespace and `#pragma GCC target` region, so the library is built for
// baseline x86-64 and still carries AVX2 and AVX-512 kernels; cpu.cpp picks
// one at run time with __builtin_cpu_supports (no global -march).
// Each table maps (activation dtype, W class, activation) to a tile kernel:
// W in 1..4 gets a register-window kernel, any other W the generic one.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <cmath>
#include <cstring>

#include "cpu/cpu_plan.hpp"

namespace shortconv::cpu {

// The kernel table of the ISA namespace it is expanded in.
#define SC_ROW(F, XT, SILU) \
  { &F<OpsF, 0, XT, SILU>, &F<OpsF, 1, XT, SILU>, &F<OpsF, 2, XT, SILU>, &F<OpsF, 3, XT, SILU>, &F<OpsF, 4, XT, SILU> }
#define SC_ROWD(F, SILU) \
  { &F<OpsD, 0, double, SILU>, &F<OpsD, 1, double, SILU>, &F<OpsD, 2, double, SILU>, &F<OpsD, 3, double, SILU>, &F<OpsD, 4, double, SILU> }
#define SC_DIR(F)                                                                \
  {                                                                              \
    {SC_ROW(F, float, false), SC_ROW(F, float, true)},                           \
        {SC_ROW(F, f16_t, false), SC_ROW(F, f16_t, true)},                       \
        {SC_ROW(F, bf16_t, false), SC_ROW(F, bf16_t, true)}, {SC_ROWD(F, false), SC_ROWD(F, true) } \
  }
#define SC_TABLE(NAME) \
  constexpr Kernels table{NAME, {OpsF::L, OpsF::L, OpsF::L, OpsD::L}, SC_DIR(fwd_tile), SC_DIR(bwd_tile)};

// ---- baseline x86-64 (SSE2) ---------------------------------------------------------
namespace isa_scalar {
#define SC_ISA 0
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("scalar")
#undef SC_ISA
}  // namespace isa_scalar

// ---- AVX2 + FMA + F16C ----------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
namespace isa_avx2 {
#define SC_ISA 1
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("avx2")
#undef SC_ISA
}  // namespace isa_avx2
#pragma GCC pop_options

// ---- AVX-512 F/BW/DQ/VL -----------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")
namespace isa_avx512 {
#define SC_ISA 2
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("avx512")
#undef SC_ISA
}  // namespace isa_avx512
#pragma GCC pop_options

const Kernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512: return isa_avx512::table;
    case Isa::avx2: return isa_avx2::table;
    default: return isa_scalar::table;
  }
}

Isa best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::avx2;
  return Isa::scalar;
}

}  // namespace shortconv::cpu
