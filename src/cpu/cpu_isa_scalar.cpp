// CPU backend kernels for scalar (see cpu_isa_table.hpp).
#include "cpu/cpu_isa_table.hpp"

namespace shortconv::cpu {

namespace isa_scalar {
#define SC_ISA 0
#include "cpu/cpu_simd.hpp"
#include "cpu/cpu_kernels.hpp"
SC_TABLE("scalar")
#undef SC_ISA
}  // namespace isa_scalar

const Kernels& kernels_scalar() { return isa_scalar::table; }

}  // namespace shortconv::cpu
