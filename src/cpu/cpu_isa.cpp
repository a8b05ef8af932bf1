// CPU backend: picks the kernels of the widest instruction set the machine
// supports (the tables come from cpu_isa_{v128,avx2,avx512}.cpp; a build
// configured with SHORTCONV_CPU_AVX512=OFF has no AVX-512 table and stops at AVX2).
#include "cpu/cpu_isa_table.hpp"

namespace shortconv::cpu {

const Kernels& kernels(Isa isa) {
#if SC_X86
  switch (isa) {
#if SC_WITH_AVX512
    case Isa::avx512bf16: return kernels_avx512bf16();
    case Isa::avx512: return kernels_avx512();
#endif
    case Isa::avx2: return kernels_avx2();
    default: break;
  }
#else
  (void)isa;
#endif
  return kernels_v128();
}

Isa best_isa() {
#if SC_X86
  __builtin_cpu_init();
  if (SC_WITH_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return __builtin_cpu_supports("avx512bf16") ? Isa::avx512bf16 : Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::avx2;
#endif
  return Isa::v128;  // NEON is part of every aarch64 processor
}

const char* v128_name() { return kV128Name; }

}  // namespace shortconv::cpu
