// fwd_decode_spec: the engines' speculative decode step (the plan's
// spec_step) on vLLM's rows (channel axis contiguous, S = (W-1) + K entries
// for K draft tokens): L = 1 .. kSpecMaxTokens tokens per sequence of a dense
// batch with per-sequence accepted counts, raw taps (W = kVecWmax, weight
// [D, W] and bias [D] of x's dtype, contiguous, 16-byte aligned), rows by
// pool index or by n, no ring offsets, block tables, has_initial_state flags
// or parent tokens, index tensors of one dtype.  fwd_decode_spec_rows: the
// same on [P, D, S] rows of S = (W-1) + K entries held in registers, K + 1
// tokens per sequence (below).
//
// Math (docs/semantics.md §1 and §5, num_accepted), per sequence n and
// channel d, with a = accepted[n] clamped to [1, S - (W-1) + 1] and H = W-1:
//   u = row[a-1 .. a-1+H) ++ x[0 .. L)      (zeros for the row without one)
//   pre[t] = bias + sum_{k<W} w[k] * u[t + k],  y[t] = act(pre[t]) + residual[t],
//   ht row: entry j = u[1 + j] for j < (W-2) + L; entries past it keep their
//   values (the planner sends rows of S >= (W-2) + L, vLLM's rule).
//
// Ownership and grid: fwd_decode_plain's (decode_plain.cu).  A thread owns
// CH consecutive channels of one sequence (kVecBytes of x, or kWideBytes in
// the wide instance) and walks the sequence's tokens; a block kThreads
// threads along the channels; grid N x ceil(D / (kThreads * CH)).  Every row
// entry is stored from a register after all of the thread's loads of its
// row, so the in-place update needs no barrier (each element has one owner
// thread).  No workspace, no host synchronisation; indices and accepted
// counts are read on the device and clamped (semantics §7).
//
// Why this kernel.  fwd_decode_linear (decode_linear.cu) steps these rows
// too, from the library's 1400-byte argument block, with run-time index
// dtypes (a select between each index's load and the row's address), a
// token loop of run-time length whose x loads wait for the previous token's
// stores, and no reads-ahead instance.  At batch 1-64 a step's time is its
// latency path (launch, the indices' round trip, the row's, the
// instructions between), which the plain step's remedies shorten
// (decode_plain.cu: 2.2 -> 1.55 us at batch 1 on an H100, 1.10 with reads
// ahead): here the arguments are SpecArgs (PlainArgs and one more line), the
// index type a template parameter (I, accepted counts included), the token
// loop unrolled to kSpecMaxTokens with every token's x issued together, and
// overlap reads ahead available (OV).  fwd_decode_spec_rows takes over from
// fwd_decode_linear_rows' speculative instances likewise (those keep the
// steps with flags, block tables or index tensors of two dtypes).
// H100, bf16, 1+3 tokens, D = 4096, batch 1 / 8 / 64 / 256: vLLM rows 3.01 /
// 3.14 / 5.29 / 15.25 -> 1.93 / 2.17 / 4.20 / 14.86 us (reads ahead 1.44 /
// 1.38 / 3.05 / 12.68); [P, D, S] rows 3.49 / 3.64 / 7.28 / 21.37 -> 1.85 /
// 2.18 / 6.01 / 18.35 (bench/RESULTS.md, 2026-12-06).  Then the narrow
// instances' tokens on taps and a window converted once, their loop leaving
// at L, and the residual's presence a flag (with_step_values, spec_tokens;
// narrow vLLM-row instance 670 -> 482 instructions of SASS): vLLM rows 1.90 /
// 2.17 -> 1.86 / 2.11 us at batch 1 / 8 (reads ahead 1.43 / 1.39 -> 1.36 /
// 1.40), [P, D, S] rows 1.82 / 2.18 / 6.04 / 18.38 -> 1.70 / 2.01 / 5.81 /
// 17.06, in one run on one H100.
//
// OV (the plan's overlap, common.cuh): kOverlapLaunch waits for the previous
// kernel first.  kOverlapReads issues the indices, accepted counts, taps,
// bias and the window's entries before overlap_wait(); x and the residual,
// which the previous kernel may write, are loaded after it, and every store
// follows it.
#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/decode.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

namespace {

// What fwd_decode_spec reads: the plain step's block (its x_n, y_n, r_n are
// the sequence strides), the accepted counts in the rest of its third
// constant-cache line, the token strides and lengths in a fourth.
struct SpecArgs {
  PlainArgs p;
  const void* accepted;  // [N] accepted counts (I), stride accepted_s
  int64_t accepted_s;
  int64_t x_t, y_t, r_t;  // token strides of x, y and the residual: token t of sequence n
                          // at x + n * x_n + t * x_t
  int64_t S;              // row entries (>= (W-2) + L)
  int32_t L;              // tokens per sequence (1 .. kSpecMaxTokens)
};
static_assert(offsetof(SpecArgs, accepted_s) + sizeof(int64_t) <= 3 * 64, "accepted counts in line 3");
static_assert(sizeof(SpecArgs) <= 4 * 64, "four constant-cache lines");

SpecArgs spec_args(const Args& a) {
  SpecArgs s{};
  s.p = plain_args(a);
  s.accepted = a.accepted.p;
  s.accepted_s = a.accepted.s0;
  s.x_t = a.x.s1;
  s.y_t = a.y.s1;
  s.r_t = a.residual.s1;
  s.S = a.S;
  s.L = int32_t(a.T);
  return s;
}

// The first round trip of both kernels: the row indices and the accepted
// count (issued before anything that waits on them), then the rows they name.
template <class I>
struct SpecHead {
  int64_t ri, ro, acc;
  __device__ __forceinline__ SpecHead(const SpecArgs& s, int n) {
    const PlainArgs& a = s.p;
    ri = a.h0_idx ? int64_t(static_cast<const I*>(a.h0_idx)[n * a.h0_idx_s]) : n;
    ro = a.ht_idx ? int64_t(static_cast<const I*>(a.ht_idx)[n * a.ht_idx_s]) : n;
    acc = int64_t(static_cast<const I*>(s.accepted)[n * s.accepted_s]);
  }
  // the row of h0 read (-1: none) and of ht written
  __device__ __forceinline__ int64_t in(const PlainArgs& a) const {
    return a.h0 ? plain_row(ri, a.h0_rows, a.h0_idx != nullptr, a.pad_index) : -1;
  }
  __device__ __forceinline__ int64_t out(const PlainArgs& a) const {
    return a.ht ? plain_row(ro, a.ht_rows, a.ht_idx != nullptr, a.pad_index) : -1;
  }
  // the window's first entry, a - 1 with a clamped to [1, last]
  __device__ __forceinline__ int64_t first(int64_t last) const { return accepted_first(acc, last); }
};

// x of tokens t < LT at xp + t * x_t, issued together (zeros from token L on).
template <class T, int CH, int LT>
__device__ __forceinline__ void spec_load_x(const T* xp, int64_t x_t, int L, Pack<T, CH> (&xv)[LT]) {
#pragma unroll
  for (int t = 0; t < LT; ++t) xv[t] = t < L ? ldp<T, CH>(xp + t * x_t) : Pack<T, CH>::zero();
}

// One token: y = act(bias + sum_k w[k] * win[k] + w[H] * x) + residual at yp
// (res: a residual, at rp; no y: a.y null), then the window slides.
// V: the window's and x's type (Pack<T, CH>, or AccPack<T, CH> converted once).
template <class T, int CH, int H, class Taps, class V, class Act>
__device__ __forceinline__ void spec_token(Taps& taps, V (&win)[H], const V& xv, const Act& act, bool y,
                                           bool res, const T* rp, T* yp) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  taps.per_token();
  A acc[CH];
  linear_sum<T, CH, H>(taps, win, xv, 0, acc);
#pragma unroll
  for (int i = 0; i + 1 < H; ++i) win[i] = win[i + 1];
  win[H - 1] = xv;
  if (!y) return;
  const P rv = res ? ldp<T, CH>(rp) : P::zero();
  A o[CH];
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    o[c] = act.value(acc[c]);
    if (res) o[c] += rv.get(c);
  }
  stp<T, CH>(yp, P::make(o));
}

// The taps and window a step's tokens work on, handed to f(taps, window,
// x's conversion).  The narrow instances (kVecBytes per thread: steps of
// fewer than kWideMinThreadsPerSm threads per SM, where registers do not
// bound occupancy, and each token's instructions are the latency path)
// convert them once to accumulators (AccTaps, AccPack: the same values); the
// wide ones keep RawTaps' words and Packs, converted at each use (their
// register cap).  (The [P, D, S] kernel's narrow instances compiled to the
// same code either way: their unbranched token loop let ptxas convert once.)
template <class T, int WMAX, int CH, int H, class F>
__device__ __forceinline__ void with_step_values(RawTaps<T, WMAX, CH>& taps, Pack<T, CH> (&win)[H], F&& f) {
  using P = Pack<T, CH>;
  if constexpr (CH * int(sizeof(T)) == DecodeTraits::kVecBytes) {
    AccTaps<T, WMAX, CH> ft;
    ft.from(taps);
    ft.pin();
    AccPack<T, CH> wf[H];
#pragma unroll
    for (int i = 0; i < H; ++i) wf[i] = AccPack<T, CH>::of(win[i]);
    f(ft, wf, [](const P& v) { return AccPack<T, CH>::of(v); });
  } else {
    f(taps, win, [](const P& v) { return v; });
  }
}

// Tokens t < L of fwd_decode_spec: y of each, and its x stored as the row's
// entry H-1+t at hp + t * h_entry (hp null: no row written).  LEAVE: the loop
// leaves at L, so that each token's block follows the last one's and the
// window needs no moves where the paths join (narrow, bf16: 599 -> 506
// instructions of SASS, sm_90); otherwise every token sits under its own
// t < L (the wide instances: leaving took 92-96 registers there, 72-80 this
// way, and spilled at their cap; ptxas -v).
template <class T, int CH, int H, int LM, bool LEAVE, class Taps, class V, class Act, class ToV>
__device__ __forceinline__ void spec_tokens(Taps& taps, V (&win)[H], const Pack<T, CH> (&xv)[LM], ToV to_v,
                                            int L, const Act& act, bool y, bool res, const T* rp, int64_t r_t,
                                            T* yp, int64_t y_t, T* hp, int64_t h_entry) {
#pragma unroll
  for (int t = 0; t < LM; ++t) {
    if constexpr (LEAVE) {
      if (t >= L) break;
    } else if (t >= L) {
      continue;
    }
    spec_token<T, CH, H>(taps, win, to_v(xv[t]), act, y, res, rp + t * r_t, yp + t * y_t);
    if (hp) stp<T, CH>(hp + t * h_entry, xv[t]);
  }
}

// Blocks per SM (the register cap): the narrow instances' leaves room for
// the converted taps and window (with_step_values), the wide ones' for every
// token's x, live at once.
template <class T, int CH>
constexpr int spec_min_blocks() {
  return CH * int(sizeof(T)) == DecodeTraits::kWideBytes ? DecodeTraits::kMinBlocksSpecWide
                                                         : DecodeTraits::kMinBlocksSpecNarrow;
}

template <class T, int CH, int OV, class I>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (spec_min_blocks<T, CH>()))
    fwd_decode_spec(const SpecArgs s) {
  using P = Pack<T, CH>;
  constexpr int WMAX = DecodeTraits::kVecWmax, H = WMAX - 1, LM = DecodeTraits::kSpecMaxTokens;
  constexpr bool AHEAD = OV == kOverlapReads;
  constexpr bool kNarrow = CH * int(sizeof(T)) == DecodeTraits::kVecBytes;
  const PlainArgs& a = s.p;
  const int n = int(blockIdx.x);  // grid.x = N
  const int d0 = int(blockIdx.y * blockDim.x + threadIdx.x) * CH;
  if (d0 >= a.D) return;
  if constexpr (OV == kOverlapLaunch) overlap_wait();
  // the first round trip: indices, the accepted count, and what does not depend on them
  const SpecHead<I> head(s, n);
  const int L = s.L;
  const T* xp = static_cast<const T*>(a.x) + n * a.x_n + d0;
  P xv[LM];  // token t's x (zeros past L), every token's issued together
  if constexpr (!AHEAD) spec_load_x<T, CH, LM>(xp, s.x_t, L, xv);
  RawTaps<T, WMAX, CH> taps;
  taps.load(static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), d0);
  // the second: the window, H entries from a - 1
  const int64_t in = head.in(a), out = head.out(a), first = head.first(s.S - H + 1);
  const T* h0 = static_cast<const T*>(a.h0) + (in >= 0 ? in : 0) * a.h0_row + first * a.h0_entry + d0;
  T* ht = static_cast<T*>(a.ht) + (out >= 0 ? out : 0) * a.ht_row + d0;
  P win[H];  // u[t .. t + H): the window of token t
#pragma unroll
  for (int i = 0; i < H; ++i) win[i] = in >= 0 ? ldp<T, CH>(h0 + i * a.h0_entry) : P::zero();
  if constexpr (AHEAD) {
    overlap_wait();
    spec_load_x<T, CH, LM>(xp, s.x_t, L, xv);
  }
  if (out >= 0) {  // the new row's first entries, u[1 .. H); each token's x after its output
#pragma unroll
    for (int i = 1; i < H; ++i) stp<T, CH>(ht + (i - 1) * a.ht_entry, win[i]);
  }
  const RuntimeAct<MathOf<T>> act{a.act};
  const bool res = a.residual != nullptr;
  const T* rp = res ? static_cast<const T*>(a.residual) + n * a.r_n + d0 : xp;  // (xp: any valid address)
  T* yp = static_cast<T*>(a.y) + n * a.y_n + d0;
  T* hp = out >= 0 ? ht + (H - 1) * a.ht_entry : nullptr;
  with_step_values<T, WMAX, CH, H>(taps, win, [&](auto& tp, auto& w, auto to_v) {
    spec_tokens<T, CH, H, LM, kNarrow>(tp, w, xv, to_v, L, act, a.y != nullptr, res, rp, s.r_t, yp, s.y_t, hp,
                                       a.ht_entry);
  });
}

// Blocks per SM of fwd_decode_spec_rows: the register cap of
// fwd_decode_linear_rows' speculative instances (the row's entries, the window
// and the tokens' x live at once; the narrow 16-bit K = 4 instances spilled
// 16-20 bytes at the linear steps' 40 registers).
template <int K>
constexpr int spec_rows_min_blocks() {
  return DecodeTraits::spec_rows_min_blocks(K);
}

// The same step on [P, D, S] rows of S = (W-1) + K entries held in registers,
// K + 1 tokens per sequence (the planner's: every row rewritten whole).  The
// thread's block of the row, CH * S adjacent elements, is loaded as raw
// vectors (RowBlock, decode.cuh), the window picked among the K + 1 positions
// by predicated moves (no dynamic register index), the new row u[1 .. S + 1)
// built in place, and stored as vectors; fwd_decode_linear_rows' speculative
// form (decode_linear.cu) on this kernel's argument block, index type and
// overlap modes.
template <class T, int CH, int K, int OV, class I>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (spec_rows_min_blocks<K>()))
    fwd_decode_spec_rows(const SpecArgs s) {
  using P = Pack<T, CH>;
  constexpr int WMAX = DecodeTraits::kVecWmax, H = WMAX - 1, S_ = H + K, LT = K + 1;
  using B = RowBlock<T, CH, S_>;
  static_assert(K >= 1 && LT <= DecodeTraits::kSpecMaxTokens, "1 .. kSpecRowsMaxDrafts drafts");
  constexpr bool AHEAD = OV == kOverlapReads;
  const PlainArgs& a = s.p;
  const int n = int(blockIdx.x);  // grid.x = N
  const int d0 = int(blockIdx.y * blockDim.x + threadIdx.x) * CH;
  if (d0 >= a.D) return;
  if constexpr (OV == kOverlapLaunch) overlap_wait();
  // the first round trip: indices, the accepted count, and what does not depend on them
  const SpecHead<I> head(s, n);
  const T* xp = static_cast<const T*>(a.x) + n * a.x_n + d0;
  P xv[LT];  // token t's x, every token's issued together
  if constexpr (!AHEAD) spec_load_x<T, CH, LT>(xp, s.x_t, LT, xv);
  RawTaps<T, WMAX, CH> taps;
  taps.load(static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), d0);
  // the second: the thread's block of the row
  const int64_t in = head.in(a), out = head.out(a);
  const int first = int(head.first(LT));  // the window's oldest entry
  const T* h0 = static_cast<const T*>(a.h0) + (in >= 0 ? in : 0) * a.h0_row + d0 * S_;
  B blk;
#pragma unroll
  for (int i = 0; i < B::kVecs; ++i)
    blk.v[i] = in >= 0 ? ldp<T, B::kPer>(h0 + i * B::kPer) : Pack<T, B::kPer>::zero();
  if constexpr (AHEAD) {
    overlap_wait();
    spec_load_x<T, CH, LT>(xp, s.x_t, LT, xv);
  }
  P row[S_];  // row[j] = entry j, then the new row
  blk.to_packs(row);
  P win[H];  // u[t .. t + H): the window of token t
  spec_row_window(row, first, win);
  const RuntimeAct<MathOf<T>> act{a.act};
  const bool res = a.residual != nullptr;
  const T* rp = res ? static_cast<const T*>(a.residual) + n * a.r_n + d0 : xp;  // (xp: any valid address)
  T* yp = static_cast<T*>(a.y) + n * a.y_n + d0;
  with_step_values<T, WMAX, CH, H>(taps, win, [&](auto& tp, auto& w, auto to_v) {
#pragma unroll
    for (int t = 0; t < LT; ++t)
      spec_token<T, CH, H>(tp, w, to_v(xv[t]), act, a.y != nullptr, res, rp + t * s.r_t, yp + t * s.y_t);
  });
#pragma unroll
  for (int t = 0; t < LT; ++t) row[H - 1 + t] = xv[t];  // new entry H-1+t = u[H + t]
  if (out < 0) return;
  T* ht = static_cast<T*>(a.ht) + out * a.ht_row + d0 * S_;
  blk.from_packs(row);
#pragma unroll
  for (int i = 0; i < B::kVecs; ++i) stp<T, B::kPer>(ht + i * B::kPer, blk.v[i]);
}

// The instance of CH channels per thread and index type I for the plan's overlap:
// vLLM rows (K = 0), or [P, D, S] rows of (W-1) + K entries.
template <class T, int CH, int K, class I>
cudaError_t launch_spec(const Plan& pl, const SpecArgs& a, Launch* l) {
  constexpr bool kWide = CH * int(sizeof(T)) == DecodeTraits::kWideBytes;
  constexpr bool k32 = sizeof(I) == 4;
  // "fwd_decode_spec([narrow, ]<rows>, [<overlap>, ]int32|int64)"
#define SC_SPEC_ROWS(narrow, ov, idx)                                                         \
  (K == 0   ? "fwd_decode_spec(" narrow "vLLM rows, " ov idx ")"                             \
   : K == 1 ? "fwd_decode_spec(" narrow "[P, D, S] rows, K = 1, " ov idx ")"                 \
   : K == 2 ? "fwd_decode_spec(" narrow "[P, D, S] rows, K = 2, " ov idx ")"                 \
   : K == 3 ? "fwd_decode_spec(" narrow "[P, D, S] rows, K = 3, " ov idx ")"                 \
            : "fwd_decode_spec(" narrow "[P, D, S] rows, K = 4, " ov idx ")")
#define SC_SPEC_NAME(ov)                                                                      \
  (kWide ? (k32 ? SC_SPEC_ROWS("", ov, "int32") : SC_SPEC_ROWS("", ov, "int64"))             \
         : (k32 ? SC_SPEC_ROWS("narrow, ", ov, "int32") : SC_SPEC_ROWS("narrow, ", ov, "int64")))
  static_assert(DecodeTraits::kSpecRowsMaxDrafts == 4, "the names above list K = 1 .. 4");
  static const char* const kNames[] = {SC_SPEC_NAME(""), SC_SPEC_NAME("overlapped, "),
                                       SC_SPEC_NAME("reads ahead, ")};
  return with_overlap(pl.overlap, [&](auto ov) {
    constexpr int OV = decltype(ov)::value;
    if constexpr (K == 0)
      return l->main(kNames[OV], fwd_decode_spec<T, CH, OV, I>, pl, a);
    else
      return l->main(kNames[OV], fwd_decode_spec_rows<T, CH, K, OV, I>, pl, a);
  });
#undef SC_SPEC_ROWS
#undef SC_SPEC_NAME
}

// The row layout's instance (pl.row_regs: 0 vLLM rows, else [P, D, S] rows of (W-1) + K).
template <class T, int CH, class I>
cudaError_t launch_spec_rows(const Plan& pl, const SpecArgs& a, Launch* l) {
  constexpr int H = DecodeTraits::kVecWmax - 1;
  switch (pl.row_regs) {
    case 0: return launch_spec<T, CH, 0, I>(pl, a, l);
    case H + 1: return launch_spec<T, CH, 1, I>(pl, a, l);
    case H + 2: return launch_spec<T, CH, 2, I>(pl, a, l);
    case H + 3: return launch_spec<T, CH, 3, I>(pl, a, l);
    case H + 4: return launch_spec<T, CH, 4, I>(pl, a, l);
    default: return l->no_instance("fwd_decode_spec ([P, D, S] rows of (W-1) + K entries, K = 1 .. 4)");
  }
}

}  // namespace

cudaError_t launch_decode_spec(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  const SpecArgs sa = spec_args(a);
  return with_step_instance(p, pl, l, "fwd_decode_spec", [&](auto tag, auto ch, auto idx) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(idx)::type;
    return launch_spec_rows<T, decltype(ch)::value, I>(pl, sa, l);
  });
}

}  // namespace shortconv::cuda
