// zero_padded_y: a forward's padded sequences' outputs set to 0
// (sc_conv_args.zero_padded_outputs, docs/semantics.md section 5), after the
// forward's own kernel in the same stream, for the plans whose kernel does not
// do it itself (the plain step's does: Plan::zero_pads_fused, one launch).
//
// Math: y[n, t, :] = +0 for every token t of sequence n when n is padded,
// i.e. each state index tensor given names no row for it (-1, the pad index,
// or, clamped like every kernel's rows, an index out of the pool).  The host
// backends' counterpart is zero_padded_outputs (src/core/problem.cpp).
//
// Ownership and grid: one thread per (sequence n, channel d), grid-stride over
// the N * D pairs (SmallTraits); the thread walks sequence n's tokens.  It
// reads the sequence's index entries and offsets only: the y it writes is
// what the forward wrote (stream order), nothing else is read.
#include <algorithm>

#include "core/dtype.hpp"
#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {
namespace {

// Row index of n in idx names no row (-1, the pad index, out of range).
__device__ __forceinline__ bool no_row(const Args& a, const DTensor& st_, const DTensor& idx,
                                       int64_t n) {
  return state_row(a, st_, idx, n) < 0;
}

template <class E>  // E: an unsigned integer of y's element size (+0 is all zero bits)
__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    zero_padded_y(const Args a) {
  const int64_t count = a.N * a.D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / a.D, d = i - n * a.D;
    const bool padded = (a.h0_idx.p || a.ht_idx.p) && (!a.h0_idx.p || no_row(a, a.h0, a.h0_idx, n)) &&
                        (!a.ht_idx.p || no_row(a, a.ht, a.ht_idx, n));
    if (!padded) continue;
    // y: [B, T, D] (s0, s1, s2); a packed batch's sequence n is tokens [cu[n], cu[n+1])
    const int64_t b = a.packed ? 0 : n;
    const int64_t t0 = a.packed ? cu_at(a, n) : 0;
    const int64_t t1 = a.packed ? cu_at(a, n + 1) : a.T;
    E* y = static_cast<E*>(a.y.p) + b * a.y.s0 + d * a.y.s2;
    for (int64_t t = t0; t < t1; ++t) y[t * a.y.s1] = E(0);
  }
}

}  // namespace

cudaError_t launch_zero_padded_y(const Problem& p, const Args& a, Launch* l) {
  const int64_t items = std::min<int64_t>(p.N * p.D, SmallTraits::kMaxGridThreads);
  if (items == 0) return cudaSuccess;
  switch (dtype_size(p.act_dtype)) {
    case 2: return l->small("zero_padded_y", zero_padded_y<uint16_t>, items, a);
    case 4: return l->small("zero_padded_y", zero_padded_y<uint32_t>, items, a);
    case 8: return l->small("zero_padded_y", zero_padded_y<uint64_t>, items, a);
    default: return l->no_instance("zero_padded_y (an element size of 2, 4 or 8 bytes)");
  }
}

}  // namespace shortconv::cuda
