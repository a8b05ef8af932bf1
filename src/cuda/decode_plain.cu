// fwd_decode_plain: the engines' common decode step (the plan's plain_step):
// one token per sequence of a dense batch, raw taps (W = kVecWmax, weight
// [D, W] and bias [D] of x's dtype, contiguous, 16-byte aligned), rows by pool
// index or by n, no ring offsets, block tables, has_initial_state flags or
// accepted counts; on vLLM's rows of W-1 entries (channel axis contiguous) or
// on [P, D, S] rows of S = W-1 or W entries held in registers.
//
// Math (docs/semantics.md §1 and §5 with L = 1), per sequence n and channel
// d, row = h0's row of S entries (zeros without one; S = W-1 = H on vLLM rows):
//   y = act(bias + sum_{k<H} w[k] * row[S - H + k] + w[H] * x) + residual,
//   ht row: row'[j] = row[j + 1] (j < S - 1), row'[S - 1] = x.
//
// Ownership and grid: fwd_decode_linear's (decode_linear.cu).  A thread owns
// CH consecutive channels of one sequence (kVecBytes of x, or kWideBytes in
// the wide instance); a block kThreads threads along the channels; grid
// N x ceil(D / (kThreads * CH)).  On [P, D, S] rows the thread's block of the
// row, CH * S adjacent elements, is loaded as raw vectors and moved into
// per-entry packs (RowBlock, decode.cuh), and back.  Every row entry is
// stored from a register after the thread's loads of that row, so the
// in-place update needs no barrier (each element has one owner thread).  No
// workspace, no host synchronisation; row indices are read on the device and
// clamped (semantics §7).
//
// Why this kernel.  It replaced two instances of the same math on the
// library's 1400-byte argument block (fwd_decode_linear's plain form, which
// also stepped longer vLLM rows, and fwd_decode_linear_rows' PLAIN form).
// At batch 1-64 a step is one warp per scheduler and its time is its latency
// path: the launch, the row index's round trip, the row's, and the
// instructions between them.  Here
// - the arguments are PlainArgs (176 bytes, 3 constant-cache lines; the
//   fields the step read were spread over 9-10 of Args' 22 lines, each
//   first read in a launch a miss);
// - the row indices' type is a template parameter (I): the run-time choice
//   between 32- and 64-bit loads put a select between the index's load and
//   the row's address, and twin predicated loads on that path;
// - the row's length is a compile-time shape: entry i is at a fixed multiple
//   of the entry stride, computed before the index arrives, so the index is
//   followed by one compare-and-select and one multiply-add before the row's
//   loads (were 64-bit products per entry, and a loop for vLLM rows longer
//   than W-1, which now take fwd_decode_linear).
// vLLM rows, bf16, narrow: 228 instructions of SASS against 376.  Copies of
// both kernels in one program (H100, bf16, D = 4096, graphs of 100 steps):
// batch 1 2.08 -> 1.49 us (reads ahead: 1.44 -> 0.97); of that, against the
// new form, the run-time index type alone cost 0.06 us (reads ahead 0.15),
// the large block alone 0.06 (0.04).  In the library, vLLM rows,
// D = 4096, batch 1 / 8 / 64 / 256: 2.22 / 2.42 / 3.19 / 6.97 -> 1.57 /
// 1.79 / 2.45 / 6.03 us; reads ahead 1.10 / 1.28 / 1.93 / 4.89
// (bench/RESULTS.md, 2026-12-06).
//
// OV (the plan's overlap, common.cuh): kOverlapLaunch waits for the previous
// kernel first.  kOverlapReads (SC_OVERLAP_READS) issues the indices, taps,
// bias and row before overlap_wait(), so that the parameter reads, the
// instruction fetch and both round trips may overlap that kernel; x and the
// residual, which it may write, are loaded after the wait, and every store
// follows it.
#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/decode.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

PlainArgs plain_args(const Args& a) {
  PlainArgs p{};
  p.x = a.x.p;
  p.y = a.y.p;
  p.weight = a.weight.p;
  p.bias = a.bias.p;
  p.residual = a.residual.p;
  p.h0_idx = a.h0_idx.p;
  p.ht_idx = a.ht_idx.p;
  p.h0 = a.h0.p;
  p.ht = a.ht.p;
  p.x_n = a.x.s0;
  p.y_n = a.y.s0;
  p.r_n = a.residual.s0;
  p.h0_idx_s = a.h0_idx.s0;
  p.ht_idx_s = a.ht_idx.s0;
  p.h0_row = a.h0.s0;
  p.h0_entry = a.h0.s2;
  p.h0_rows = a.h0.n0;
  p.ht_row = a.ht.s0;
  p.ht_entry = a.ht.s2;
  p.ht_rows = a.ht.n0;
  p.pad_index = a.pad_index;
  p.D = int32_t(a.D);  // (d0 < kMaxGridY * kThreads * CH: 32 bits)
  p.act = int16_t(a.act);
  p.zero_pads = int16_t(a.zero_pads);
  return p;
}

namespace {

template <class T, int CH, int S_, int OV, class I>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (linear_min_blocks<T, CH, true>()))
    fwd_decode_plain(const PlainArgs a) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  using B = RowBlock<T, CH, (S_ > 0 ? S_ : DecodeTraits::kVecWmax - 1)>;  // (used when S_ > 0)
  constexpr int WMAX = DecodeTraits::kVecWmax, H = WMAX - 1;
  static_assert(S_ == 0 || S_ >= H, "a [P, D, S] row holds the window");
  constexpr bool AHEAD = OV == kOverlapReads;
  const int n = int(blockIdx.x);  // grid.x = N
  const int d0 = int(blockIdx.y * blockDim.x + threadIdx.x) * CH;
  if (d0 >= a.D) return;
  if constexpr (OV == kOverlapLaunch) overlap_wait();
  // the first round trip: the indices, and what does not depend on them
  const int64_t ri = a.h0_idx ? int64_t(static_cast<const I*>(a.h0_idx)[n * a.h0_idx_s]) : n;
  const int64_t ro = a.ht_idx ? int64_t(static_cast<const I*>(a.ht_idx)[n * a.ht_idx_s]) : n;
  const T* xp = static_cast<const T*>(a.x) + n * a.x_n + d0;
  const T* rp = a.residual ? static_cast<const T*>(a.residual) + n * a.r_n + d0 : nullptr;
  P xv = AHEAD ? P::zero() : ldp<T, CH>(xp);
  P rv = AHEAD || !rp ? P::zero() : ldp<T, CH>(rp);
  RawTaps<T, WMAX, CH> taps;
  taps.load(static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), d0);
  // the second: the row (vLLM rows: H entries of CH channels; [P, D, S] rows:
  // the thread's block, CH * S adjacent elements)
  const int64_t in = a.h0 ? plain_row(ri, a.h0_rows, a.h0_idx != nullptr, a.pad_index) : -1;
  const int64_t out = a.ht ? plain_row(ro, a.ht_rows, a.ht_idx != nullptr, a.pad_index) : -1;
  constexpr int64_t kBlock = S_ > 0 ? S_ : 1;  // elements per channel in a [P, D, S] row
  const T* h0 = static_cast<const T*>(a.h0) + (in >= 0 ? in : 0) * a.h0_row + d0 * kBlock;
  T* ht = static_cast<T*>(a.ht) + (out >= 0 ? out : 0) * a.ht_row + d0 * kBlock;
  P win[H];  // the window: win[i] = row[S - H + i] (zeros: no initial state)
  B blk;
  if constexpr (S_ == 0) {
#pragma unroll
    for (int i = 0; i < H; ++i) win[i] = in >= 0 ? ldp<T, CH>(h0 + i * a.h0_entry) : P::zero();
  } else {
#pragma unroll
    for (int i = 0; i < B::kVecs; ++i)
      blk.v[i] = in >= 0 ? ldp<T, B::kPer>(h0 + i * B::kPer) : Pack<T, B::kPer>::zero();
  }
  if constexpr (AHEAD) {
    overlap_wait();
    xv = ldp<T, CH>(xp);
    if (rp) rv = ldp<T, CH>(rp);
  }
  P row[S_ > 0 ? S_ : 1];  // [P, D, S] rows: row[j] = entry j, then the new row
  if constexpr (S_ == 0) {
    if (out >= 0) {  // entries 1 .. H-1 move down (x, the last, after the output)
#pragma unroll
      for (int i = 1; i < H; ++i) stp<T, CH>(ht + (i - 1) * a.ht_entry, win[i]);
    }
  } else {
    blk.to_packs(row);
#pragma unroll
    for (int i = 0; i < H; ++i) win[i] = row[S_ - H + i];
  }
  const RuntimeAct<MathOf<T>> act{a.act};
  A acc[CH];
  linear_sum<T, CH, H>(taps, win, xv, 0, acc);
  if (a.y) {
    // zero_padded_outputs: a sequence whose index tensors name no row writes y = +0
    const bool zero = a.zero_pads && (!a.h0_idx || in < 0) && (!a.ht_idx || out < 0);
    A o[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      o[c] = act.value(acc[c]);
      if (rp) o[c] += rv.get(c);
      if (zero) o[c] = A(0);
    }
    stp<T, CH>(static_cast<T*>(a.y) + n * a.y_n + d0, P::make(o));
  }
  if (out < 0) return;
  if constexpr (S_ == 0) {
    stp<T, CH>(ht + (H - 1) * a.ht_entry, xv);
  } else {
#pragma unroll
    for (int j = 0; j + 1 < S_; ++j) row[j] = row[j + 1];
    row[S_ - 1] = xv;
    blk.from_packs(row);
#pragma unroll
    for (int i = 0; i < B::kVecs; ++i) stp<T, B::kPer>(ht + i * B::kPer, blk.v[i]);
  }
}

// The instance of CH channels per thread, rows S_ (0: vLLM rows), row index
// type I, for the plan's overlap.
template <class T, int CH, int S_, class I>
cudaError_t launch_plain(const Plan& pl, const PlainArgs& a, Launch* l) {
  constexpr bool kWide = CH * int(sizeof(T)) == DecodeTraits::kWideBytes;
  constexpr bool k32 = sizeof(I) == 4;
  constexpr bool kVllm = S_ == 0, kS3 = S_ == DecodeTraits::kVecWmax - 1;
  // "fwd_decode_plain([narrow, ]<rows>, [<overlap>, ]int32|int64)"
#define SC_PLAIN_ROWS(narrow, ov, idx)                                                      \
  (kVllm ? "fwd_decode_plain(" narrow "vLLM rows, " ov idx ")"                              \
   : kS3 ? "fwd_decode_plain(" narrow "[P, D, S] rows, S = W-1, " ov idx ")"                \
         : "fwd_decode_plain(" narrow "[P, D, S] rows, S = W, " ov idx ")")
#define SC_PLAIN_NAME(ov)                                                                   \
  (kWide ? (k32 ? SC_PLAIN_ROWS("", ov, "int32") : SC_PLAIN_ROWS("", ov, "int64"))          \
         : (k32 ? SC_PLAIN_ROWS("narrow, ", ov, "int32") : SC_PLAIN_ROWS("narrow, ", ov, "int64")))
  static const char* const kNames[] = {SC_PLAIN_NAME(""), SC_PLAIN_NAME("overlapped, "),
                                       SC_PLAIN_NAME("reads ahead, ")};
  return with_overlap(pl.overlap, [&](auto ov) {
    constexpr int OV = decltype(ov)::value;
    return l->main(kNames[OV], fwd_decode_plain<T, CH, S_, OV, I>, pl, a);
  });
#undef SC_PLAIN_ROWS
#undef SC_PLAIN_NAME
}

// The row layout's instance (pl.row_regs: 0 vLLM rows, else [P, D, S] rows of S = W-1 or W).
template <class T, int CH, class I>
cudaError_t launch_plain_rows(const Plan& pl, const PlainArgs& a, Launch* l) {
  constexpr int H = DecodeTraits::kVecWmax - 1;
  switch (pl.row_regs) {
    case 0: return launch_plain<T, CH, 0, I>(pl, a, l);
    case H: return launch_plain<T, CH, H, I>(pl, a, l);
    case H + 1: return launch_plain<T, CH, H + 1, I>(pl, a, l);
    default: return l->no_instance("fwd_decode_plain ([P, D, S] rows of S = W-1 or W)");
  }
}

}  // namespace

cudaError_t launch_decode_plain(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  const PlainArgs pa = plain_args(a);
  return with_step_instance(p, pl, l, "fwd_decode_plain", [&](auto tag, auto ch, auto idx) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(idx)::type;
    return launch_plain_rows<T, decltype(ch)::value, I>(pl, pa, l);
  });
}

}  // namespace shortconv::cuda
