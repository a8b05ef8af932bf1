// CPU backend kernels for avx2 (see cpu_isa_table.hpp).
#include "cpu/cpu_isa_table.hpp"

#if SC_X86  // (the file is empty on other architectures)

namespace shortconv::cpu {

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

const Kernels& kernels_avx2() { return isa_avx2::table; }

}  // namespace shortconv::cpu

#endif  // SC_X86
