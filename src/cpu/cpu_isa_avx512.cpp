// CPU backend kernels for avx512 (see cpu_isa_table.hpp).
#include "cpu/cpu_isa_table.hpp"

#if SC_X86  // (the file is empty on other architectures)

namespace shortconv::cpu {

#pragma GCC push_options
// (avx512bf16 in the target: only Bf16Cvt's intrinsic uses it, and only
// the avx512bf16 table, picked when the processor has it, calls that code.)
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c,bmi,bmi2")
namespace isa_avx512 {
#define SC_ISA 2
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("avx512")
constexpr Kernels table_bf16 = make_table<Bf16Cvt<OpsFNarrow<3>>, Bf16Cvt<OpsF>>("avx512bf16", Activations{});
#undef SC_ISA
}  // namespace isa_avx512
#pragma GCC pop_options

const Kernels& kernels_avx512() { return isa_avx512::table; }
const Kernels& kernels_avx512bf16() { return isa_avx512::table_bf16; }

}  // namespace shortconv::cpu

#endif  // SC_X86
