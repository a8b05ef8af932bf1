// CPU backend kernels for avx512 (see cpu_isa_table.hpp).
#include "cpu/cpu_isa_table.hpp"

#if SC_X86  // (the file is empty on other architectures)

namespace shortconv::cpu {

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

const Kernels& kernels_avx512() { return isa_avx512::table; }

}  // namespace shortconv::cpu

#endif  // SC_X86
