// CUDA decode kernel: one launch per decode step (Path::decode).  This file:
// tree drafts (any rows), linear steps on [P, D, S] rows that are not held in
// registers (staged in shared memory: other S, padded taps, packed or shorter
// speculative steps) and on scalar rows, the scalar instance.  Linear steps on
// vLLM rows and on short [P, D, S] rows with raw taps are decode_linear.cu's
// (the same math, state rows held in registers).
//
// Math (docs/semantics.md §1 and §5), per sequence n of L_n tokens (a few) and
// channel d.  The extended sequence has s entries before x_n: s = S for
// u_n = h0_n ++ x_n, or s = W-1 with num_accepted (the W-1 row entries from
// a_n - 1, then x_n).  Then
//   pre[t] = bias + sum_{k<W} weight[k] * u[q_t(k)],   y[t] = act(pre[t]) + residual[t]
// with q_t(k) = s - (W-1) + t + k, or with parent_tokens the chain of parents
// of t, oldest first; and the row: ht[j] = u[s + L_n - E + j] for j < E (E = S,
// entry j at its ring slot; speculative: E = (W-2) + L_n from the row's start).
//
// Ownership: a thread owns CH consecutive channels of one sequence, one
// 4-byte word of x per token (DecodeTraits::kVecBytes: a small step is
// latency bound, and a thread's instruction path grows with its channels),
// or 16 bytes in the wide instance (kWideBytes: a step of many threads is
// bound by instruction issue, and the per-sequence work is then paid once per
// 16 bytes: H200, batch 256, D = 8192, vLLM rows: 25.4 -> 16.9 µs); block
// (blockIdx.x = sequence, blockIdx.y = group of kThreads * CH channels).  It
// reads its W-1 window entries into registers, computes the tokens in order
// (the window slides; a tree re-reads its ancestors' x, L1 hits), then
// rewrites the row itself, entries ascending: entry j is written after the
// entry it copies (index >= j) was read and after the window was read, so the
// in-place pool update needs no second kernel and no barrier (every element
// has one owner thread).
//
// State rows (StateIo, chosen by the planner from strides, dtype, alignment):
// scalar (any strides and dtypes, ring rows; copies through double, exact),
// channel_vec (vLLM's pools, stride(D) = 1: one CH-channel word per entry)
// and row_vec ([P, D, S] contiguous rows: the thread's CH x S block is S
// units of CH channels' bytes, staged in its own slice of shared memory, no
// barrier).  The mode is a template parameter (the instance holds only its
// code: 78 -> 40 registers for the 16-bit linear steps, batch 1 3.4 -> 3.0
// µs), as is whether the step may be a tree.  Loads are
// issued together before their first use (the window, the first token and
// the taps: one round trip after the row index, not one per load).
//
// Grid: N x ceil(D / (kThreads * CH)) blocks of DecodeTraits::kThreads threads;
// no workspace, no host synchronisation.  Row indices, flags, accepted counts
// and parents are read on the device and clamped (semantics §7), so a
// captured graph replays with new values, and nothing depends on the pool size.
#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/decode.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

namespace {

// A kernel instance's state-row access: one StateIo mode fixed at compile time
// (the instance's code holds only that mode's loads and stores), or kIoAny,
// the plan's mode read at run time (the tree instance).
constexpr int kIoAny = -1;

// The thread's access to state rows: CH channels d0 .. d0+CH of one sequence.
template <class T, int CH, int IO>
struct Rows {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  const Args& a;
  StateIo io_;  // the plan's mode (read for IO == kIoAny only)
  int64_t d0;
  int64_t ring;  // the sequence's ring offset (scalar rows only; 0 otherwise)
  T* stage;      // row_vec: this thread's [CH][S] block in shared memory

  __device__ __forceinline__ StateIo io() const { return IO == kIoAny ? io_ : StateIo(IO); }
  __device__ int64_t slot(int64_t j) const {
    const int64_t v = ring + j;
    return v >= a.S ? v - a.S : v;
  }
  __device__ const T* vec_at(const DTensor& t, int64_t r, int64_t j) const {  // channel_vec
    return static_cast<const T*>(t.p) + r * t.s0 + d0 + j * t.s2;
  }
  // row_vec: the thread's CH x S block of a row is S units of CH * sizeof(T)
  // bytes (4, or 16 for the wide instance), copied raw.
  using Unit = std::conditional_t<CH * sizeof(T) == 16, uint4, uint32_t>;
  // Row r of h0 into the stage (zeros for r < 0): each round's units are all
  // loaded before the first is stored (a load-store loop waited for each).
  __device__ void stage_in(int64_t r) {
    constexpr int K = DecodeTraits::kStageChunk;
    Unit* dst = reinterpret_cast<Unit*>(stage);
    const Unit* src =
        reinterpret_cast<const Unit*>(static_cast<const T*>(a.h0.p) + (r >= 0 ? r : 0) * a.h0.s0 + d0 * a.S);
    for (int k0 = 0; k0 < a.S; k0 += K) {
      Unit v[K];
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = r >= 0 && k0 + k < a.S ? src[k0 + k] : Unit{};
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (k0 + k < a.S) dst[k0 + k] = v[k];
    }
  }
  // Entry j of initial-state row r (zeros for r < 0), as accumulators.
  __device__ void entry(int64_t r, int64_t j, A (&v)[CH]) const {
    if (io() == StateIo::row_vec) {
#pragma unroll
      for (int c = 0; c < CH; ++c) v[c] = to_f(stage[c * a.S + j]);
      return;
    }
    if (r < 0) {
#pragma unroll
      for (int c = 0; c < CH; ++c) v[c] = A(0);
    } else if (io() == StateIo::channel_vec) {
      const P pk = ldp<T, CH>(vec_at(a.h0, r, j));
#pragma unroll
      for (int c = 0; c < CH; ++c) v[c] = pk.get(c);
    } else {
#pragma unroll
      for (int c = 0; c < CH; ++c)
        v[c] = ld<A>(a.h0.p, a.h0.dt, r * a.h0.s0 + (d0 + c) * a.h0.s1 + slot(j) * a.h0.s2);
    }
  }
};

// Parent of token t >= 1 of sequence n: parent_tokens[n, t] when it lies in
// [0, t) and t < M, else t - 1 (device-resident contents are clamped, §7).
__device__ __forceinline__ int64_t parent_of(const Args& a, int64_t n, int64_t t) {
  if (t >= a.parent_cols) return t - 1;
  const int64_t o = n * a.parents.s0 + t * a.parents.s1;
  const int64_t p = a.parents.dt == SC_I32 ? int64_t(static_cast<const int32_t*>(a.parents.p)[o])
                                           : static_cast<const int64_t*>(a.parents.p)[o];
  return p >= 0 && p < t ? p : t - 1;
}

// One sequence of the step for the CH channels of this thread.
template <class T, int WMAX, int CH>
struct DecodeSeq {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  using M = MathOf<T>;
  static constexpr int H = WMAX - 1;  // window registers: sl[i] = u[s - H + i]

  const Args& a;
  const A (&wp)[WMAX][CH];
  const A (&bs)[CH];
  int kpad;  // taps below kpad = WMAX - W are padding, never multiplied
  RuntimeAct<M> act;
  int64_t n, d0;
  Seq q;
  int64_t s;  // entries of the extended sequence before x_n
  const T* xp;  // x at (row q.b, token q.s, channel d0); token t at xp + t * sx
  int64_t sx;

  __device__ P x_at(int64_t t) const { return ldp<T, CH>(xp + t * sx); }

  // y of token t from the accumulators, with the residual.
  __device__ void out(int64_t t, A (&acc)[CH]) const { decode_store_y<T, CH>(a, act, q.b, q.s + t, d0, acc); }

  // The linear step: the window slides over the tokens (fwd_tm's arithmetic).
  __device__ void linear(A (&sl)[H][CH]) const {
    for (int64_t t = 0; t < q.L; ++t) {
      const P xv = x_at(t);
      A acc[CH];
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const A cur = xv.get(c);
        acc[c] = bs[c];  // bias, then taps oldest -> newest: the order of every path
#pragma unroll
        for (int k = 0; k < H; ++k)
          if (k >= kpad) acc[c] = fma(wp[k][c], sl[k][c], acc[c]);
        acc[c] = fma(wp[H][c], cur, acc[c]);
#pragma unroll
        for (int i = 0; i + 1 < H; ++i) sl[i][c] = sl[i + 1][c];
        sl[H - 1][c] = cur;
      }
      out(t, acc);
    }
  }

  // Tree drafts: token t reads its chain of parents, then the window from its
  // newest entry backwards (positions below s are window registers).
  __device__ void tree(const A (&sl)[H][CH]) const {
    for (int64_t t = 0; t < q.L; ++t) {
      int64_t qpos[WMAX];
      int64_t pos = s + t;
#pragma unroll
      for (int k = H; k >= 0; --k) {
        qpos[k] = pos;
        if (k > kpad) pos = pos - s >= 1 ? s + parent_of(a, n, pos - s) : pos - 1;
      }
      A acc[CH];
#pragma unroll
      for (int c = 0; c < CH; ++c) acc[c] = bs[c];
#pragma unroll
      for (int k = 0; k <= H; ++k) {
        if (k < kpad) continue;
        A u[CH];
        if (qpos[k] >= s) {
          const P v = x_at(qpos[k] - s);
#pragma unroll
          for (int c = 0; c < CH; ++c) u[c] = v.get(c);
        } else {  // window register qpos - (s - H), selected without a dynamic index
#pragma unroll
          for (int c = 0; c < CH; ++c) u[c] = A(0);
#pragma unroll
          for (int i = 0; i < H; ++i)
            if (qpos[k] == s - H + i) {
#pragma unroll
              for (int c = 0; c < CH; ++c) u[c] = sl[i][c];
            }
        }
#pragma unroll
        for (int c = 0; c < CH; ++c) acc[c] = fma(wp[k][c], u[c], acc[c]);
      }
      out(t, acc);
    }
  }
};

// The row of sequence q: ht[j] = u[from + j] for j < E, entries ascending.
// `base` is the h0 entry of u[0]; in / out the rows read and written.
template <class T, int CH, int IO>
__device__ void write_row(const Args& a, Rows<T, CH, IO>& rows, const Seq& q, const T* xp, int64_t sx,
                          int64_t s, int64_t base, int64_t in, int64_t out, int64_t E) {
  using P = Pack<T, CH>;
  const int64_t from = s + q.L - E, S = a.S;
  const bool spec = a.accepted.p != nullptr;
  if (rows.io() == StateIo::row_vec) {  // in the stage, then S vectors (or the E entries) out
    for (int64_t j = 0; j < E; ++j) {
      const int64_t pos = from + j;
      P xv = P::zero();
      if (pos >= s) xv = ldp<T, CH>(xp + (pos - s) * sx);
#pragma unroll
      for (int c = 0; c < CH; ++c)
        rows.stage[c * S + j] = pos < s ? rows.stage[c * S + base + pos] : to_t<T>(xv.get(c));
    }
    T* dst = static_cast<T*>(a.ht.p) + out * a.ht.s0 + rows.d0 * S;
    if (E == S || out == in) {  // entries past E still hold the row's own values
      using Unit = typename Rows<T, CH, IO>::Unit;
      const Unit* src = reinterpret_cast<const Unit*>(rows.stage);
      for (int k = 0; k < S; ++k) reinterpret_cast<Unit*>(dst)[k] = src[k];
    } else {
      for (int c = 0; c < CH; ++c)
        for (int64_t j = 0; j < E; ++j) dst[c * S + j] = rows.stage[c * S + j];
    }
    return;
  }
  if (rows.io() == StateIo::channel_vec) {  // raw copies (state dtype = x's), kRowChunk at a time:
    // a round's entries are all read, then written (entry j copies index >= j)
    constexpr int K = DecodeTraits::kRowChunk;
    for (int64_t j0 = 0; j0 < E; j0 += K) {
      P v[K];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t pos = from + j0 + k;
        v[k] = P::zero();
        if (j0 + k >= E) continue;
        if (pos >= s) v[k] = ldp<T, CH>(xp + (pos - s) * sx);
        else if (in >= 0) v[k] = ldp<T, CH>(rows.vec_at(a.h0, in, base + pos));
      }
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (j0 + k < E) stp<T, CH>(const_cast<T*>(rows.vec_at(a.ht, out, j0 + k)), v[k]);
    }
    return;
  }
  for (int64_t j = 0; j < E; ++j) {
    const int64_t pos = from + j;
    // final-state entry j: slot j, or on a ring the slot of entry L + j, (c + L + j) mod S
    const int64_t dst_slot = spec || !a.ring.p ? j : (rows.ring + q.L % S + j) % S;
    for (int c = 0; c < CH; ++c) {  // through double: every copy exact, rounded once
      double v = 0.0;
      if (pos >= s) v = double(to_f(xp[(pos - s) * sx + c]));
      else if (in >= 0)
        v = ld<double>(a.h0.p, a.h0.dt,
                       in * a.h0.s0 + (rows.d0 + c) * a.h0.s1 + rows.slot(base + pos) * a.h0.s2);
      st<double>(a.ht.p, a.ht.dt, out * a.ht.s0 + (rows.d0 + c) * a.ht.s1 + dst_slot * a.ht.s2, v);
    }
  }
}

// Instances: IO is the plan's StateIo (or kIoAny), TREE whether parent_tokens
// may be present (the linear instances hold no tree code: fewer registers,
// fewer instructions on every step).
template <class T, int CH, int IO, bool TREE>
constexpr int decode_min_blocks() {
  const bool linear16 = !TREE && IO != kIoAny && sizeof(T) == 2 &&
                        CH * int(sizeof(T)) == DecodeTraits::kVecBytes;
  return linear16 ? DecodeTraits::kMinBlocksLinear16 : DecodeTraits::kMinBlocksPerSm;
}

template <class T, int WMAX, int CH, int IO, bool TREE>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (decode_min_blocks<T, CH, IO, TREE>()))
    fwd_decode(const Args a) {
  using A = acc_t<T>;
  constexpr int H = WMAX - 1;
  static_assert(WMAX >= 2, "window of at least one past input");
  extern __shared__ __align__(16) uint32_t decode_stage[];  // row_vec: S units per thread
  const int64_t n = blockIdx.x;
  const int64_t d0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * CH;
  if (n >= a.N || d0 >= a.D) return;
  const int W = a.W, kpad = WMAX - W;
  const RuntimeAct<MathOf<T>> act{a.act};
  const A scale = A(act.scale());  // exact: 1, or 0.5 for a tanh form (core/activation.hpp)
  const Seq q = seq_of(a, n);
  const int64_t in = h0_row_of(a, n), out = ht_row_of(a, n);
  const bool spec = a.accepted.p != nullptr;
  const int64_t s = spec ? W - 1 : a.S;
  const int64_t base = accepted_first(a, n, in);  // the h0 entry of u[0]
  Rows<T, CH, IO> rows{a, StateIo(a.state_io), d0, a.ring.p ? q.c : 0,
                       reinterpret_cast<T*>(decode_stage + int64_t(threadIdx.x) * a.S * (CH * int(sizeof(T)) / 4))};
  // Latency order: the row's window (vLLM rows: raw vectors) and the first
  // token are requested before the taps, whose conversion waits for their own
  // loads; the window is converted after that (one round trip, not two).
  using P = Pack<T, CH>;
  const T* xp = static_cast<const T*>(a.x.p) + q.b * a.x.s0 + q.s * a.x.s1 + d0 * a.x.s2;
  const bool vec_rows = rows.io() == StateIo::channel_vec && in >= 0;
  P raw[H];
#pragma unroll
  for (int i = 0; i < H; ++i)
    if (vec_rows && i >= kpad) raw[i] = ldp<T, CH>(rows.vec_at(a.h0, in, base + s - H + i));
  const P x0 = q.L > 0 ? ldp<T, CH>(xp) : P::zero();
  if (rows.io() == StateIo::row_vec) rows.stage_in(in);
  A wp[WMAX][CH], bs[CH];
  decode_taps<T, WMAX, CH>(a, d0, kpad, scale, wp, bs);
  A sl[H][CH];  // sl[i] = u[s - H + i]: the window, padded at the front
#pragma unroll
  for (int i = 0; i < H; ++i) {
    if (i < kpad) {
#pragma unroll
      for (int c = 0; c < CH; ++c) sl[i][c] = A(0);
    } else if (vec_rows) {
#pragma unroll
      for (int c = 0; c < CH; ++c) sl[i][c] = raw[i].get(c);
    } else {
      rows.entry(in, base + s - H + i, sl[i]);
    }
  }
  (void)x0;  // (the step's first x_at(0) is this load: nothing is stored in between)
  const DecodeSeq<T, WMAX, CH> seq{a, wp, bs, kpad, act, n, d0, q, s, xp, a.x.s1};
  if (TREE && a.parents.p) seq.tree(sl);  // (the tree keeps the window, the linear step slides it)
  else seq.linear(sl);
  if (out < 0) return;
  int64_t E = a.S;  // entries written: S, or (W-2) + L_n from the row's start (speculative)
  if (spec) E = q.L > 0 ? (W - 2 + q.L < a.S ? W - 2 + q.L : a.S) : 0;
  write_row<T, CH, IO>(a, rows, q, xp, a.x.s1, s, base, in, out, E);
}

// The vector instances of type T with CH channels per thread that this file
// holds: the narrow linear step on staged [P, D, S] rows and on scalar rows,
// the tree (any rows, the mode read at run time), the wide step on staged
// [P, D, S] rows.  Linear steps on vLLM rows, and on [P, D, S] rows held in
// registers (narrow or wide), are decode_linear.cu's (launch_decode).
template <class T, int CH>
cudaError_t launch_decode_vec(const Plan& pl, const Args& a, Launch* l) {
  constexpr int WM = DecodeTraits::kVecWmax;
  constexpr int kRv = int(StateIo::row_vec), kSc = int(StateIo::scalar);
  constexpr bool kNarrow = CH * int(sizeof(T)) == DecodeTraits::kVecBytes;
  if constexpr (kNarrow) {
    if (a.parents.p) return l->main("fwd_decode(vector, tree)", fwd_decode<T, WM, CH, kIoAny, true>, pl, a);
    switch (pl.state_io) {
      case StateIo::channel_vec:
        break;  // (decode_linear.cu)
      case StateIo::row_vec:
        return l->main("fwd_decode(vector, rows)", fwd_decode<T, WM, CH, kRv, false>, pl, a);
      case StateIo::scalar:
        return l->main("fwd_decode(vector, scalar rows)", fwd_decode<T, WM, CH, kSc, false>, pl, a);
    }
  } else {
    if (!a.parents.p && pl.state_io == StateIo::row_vec && pl.row_regs == 0)
      return l->main("fwd_decode(wide, staged rows)", fwd_decode<T, WM, CH, kRv, false>, pl, a);
  }
  return l->no_instance("decode (no instance for this state-row mode)");
}

}  // namespace

// The decode step's kernel for the plan (Path::decode): a vector instance
// (W <= kVecWmax; kVecBytes of x per thread, or kWideBytes for a step with
// enough threads, DecodeTraits) or the scalar one (any strides, fp64, W <= 16).
cudaError_t launch_decode(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  if (p.N == 0 || p.D == 0 || (!p.y && !p.ht)) return cudaSuccess;
  return with_act_type(p.act_dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kVecCh = DecodeTraits::kVecBytes / int(sizeof(T));
    constexpr int kWideCh = DecodeTraits::kWideBytes / int(sizeof(T));
    if constexpr (!std::is_same_v<T, double>) {
      if (pl.wmax == DecodeTraits::kVecWmax && (pl.ch == kVecCh || pl.ch == kWideCh)) {
        const bool in_registers = pl.state_io == StateIo::channel_vec || pl.row_regs > 0;
        if (in_registers && !a.parents.p) return launch_decode_linear(p, pl, a, l);
        return pl.ch == kVecCh ? launch_decode_vec<T, kVecCh>(pl, a, l) : launch_decode_vec<T, kWideCh>(pl, a, l);
      }
    }
    if (pl.ch == 1 && pl.wmax == DecodeTraits::kScalarWmax)
      return l->main("fwd_decode(scalar)",
                     fwd_decode<T, DecodeTraits::kScalarWmax, 1, int(StateIo::scalar), true>, pl, a);
    return l->no_instance("decode");
  });
}

}  // namespace shortconv::cuda
