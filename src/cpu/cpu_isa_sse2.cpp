// CPU backend kernels for SSE2, the x86-64 baseline (see cpu_isa_table.hpp).
#include "cpu/cpu_isa_table.hpp"

namespace shortconv::cpu {

namespace isa_sse2 {
#define SC_ISA 0
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("sse2")
#undef SC_ISA
}  // namespace isa_sse2

const Kernels& kernels_sse2() { return isa_sse2::table; }

}  // namespace shortconv::cpu
