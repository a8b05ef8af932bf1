// CPU backend: picks the kernels of the widest instruction set the machine
// supports (the three tables come from cpu_isa_{sse2,avx2,avx512}.cpp).
#include "cpu/cpu_isa_table.hpp"

namespace shortconv::cpu {

const Kernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512: return kernels_avx512();
    case Isa::avx2: return kernels_avx2();
    default: return kernels_sse2();
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
  return Isa::sse2;
}

}  // namespace shortconv::cpu
