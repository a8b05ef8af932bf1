// CPU backend kernels on 128-bit vectors, the baseline of every architecture
// (see cpu_isa_table.hpp): SSE2 on x86-64, NEON on aarch64, GCC's generic
// vectors elsewhere.
#include "cpu/cpu_isa_table.hpp"

namespace shortconv::cpu {

namespace isa_v128 {
#define SC_ISA 0
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE(kV128Name)
#undef SC_ISA
}  // namespace isa_v128

const Kernels& kernels_v128() { return isa_v128::table; }

}  // namespace shortconv::cpu
