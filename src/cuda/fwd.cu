// CUDA forward kernels.
//
// Math (docs/semantics.md §1), per sequence n, channel d, token t in [0, L_n):
//   pre[t] = bias[d] + sum_{k<W} weight[d,k] * u_n[S-(W-1)+t+k],  u_n = h0_n ++ x_n
//   y[t]   = act(pre[t]) + residual[t]
//   ht_n[j] = u_n[L_n + j]                                        j in [0, S)
// Accumulation is fp32 (fp64 for f64 activations); outputs rounded once.
//
// Kernels and ownership:
// - fwd_tm<T, WMAX, CH>: token-major.  A thread owns CH consecutive channels
//   (one 16-byte vector when the channel axis is contiguous, CH = 1 for any
//   strides) and one tile of tile_t consecutive tokens of the (batch, time)
//   axis.  It keeps the last W-1 inputs in registers (sliding window), so x is
//   read once plus a (W-1)-token halo per tile.  A packed tile may span several
//   sequences: the thread walks them (binary search for the first), and the
//   window of each starts from that sequence's own h0 (or zeros), never from
//   another sequence's rows.  Block = cx threads along channels x ty tiles.
//   The 16-bit full-window SiLU instance (FULL) receives x (and the residual:
//   RES) through the thread's own slots of a shared-memory ring filled by
//   cp.async (stream_staged): no slot is shared, so no barrier.
// - fwd_cm<T, WMAX, FULL>: channel-major (stride_t == 1, dense).  A warp owns
//   one (batch, channel) row and a tile of tokens; each lane a 16-byte vector
//   of VEC consecutive tokens, its W-1 window tokens from the lower lanes by
//   shuffles (cm_window; the first lanes from the previous chunk, or from
//   memory at the tile's start; re-reading them as scalars, L1 hits, cost an
//   address and a load each).  The loads of CmTraits::kFwdUnroll
//   chunks are issued before any of them is computed: with one chunk per
//   step a warp had 512 bytes in flight, too few for the DRAM latency.
//   The full-window instances (FULL: W = 2, 3, 4 with SiLU) fix W and the
//   activation at compile time.
// - fwd_general<A>: W > 16, any strides, runtime dtypes: a thread per
//   (channel, tile) sums the W taps straight from memory.
// - state_fwd: one thread per (sequence, channel) writes ht_n[j] = u_n[L+j]
//   walking j upward, after the main kernel on the same stream, so with an
//   aliased (in-place) pool every h0 read (main kernel, and u_n[L+j] with
//   L+j >= j here) happens before the write of ht[j].  With prefix caching it
//   also writes the snapshot at every block boundary inside the chunk (the
//   last S entries of u after r tokens), the write into h0's own row last.
//   state_fwd_ids: the same for the runs of seq_idx (a thread per (32-token
//   block, channel)).
// - seq_idx: the tiles are on the flat B*T axis; the walker (common.cuh) finds
//   the runs, padding runs write y = 0.
#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

namespace {

// Tokens per unrolled step of the token-major loop: U independent loads in
// flight per thread (and the next U prefetched) before the first use.
constexpr int kUnrollTm = TmTraits::kUnroll;

// Token-major forward state of one thread.  The window is padded to WMAX
// taps: wp[k] = weight[k - kpad] for k >= kpad = WMAX - W, and taps below
// kpad are skipped by a predicate (never multiplied: a zero weight times an
// inf input would give NaN where the definition gives a finite value).
template <class T, int WMAX, int CH>
struct TmFwd {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  using M = MathOf<T>;
  static constexpr int H = WMAX - 1;  // window registers: sl[i] = u(t - H + i)
  static constexpr bool k16Bit = sizeof(T) == 2;
  static_assert(WMAX >= 2, "window of at least one past input");

  int kpad;
  RuntimeAct<M> act;
  A wp[WMAX][CH];
  A bs[CH];
  A sl[H][CH];

  // FULL: W == WMAX and SiLU (compile-time: no pad predicates, no select);
  // the arithmetic is the same as the generic instance's for those inputs.
  template <bool FULL>
  __device__ __forceinline__ P step(const P& xv, const P& rv, bool res) {
    A o[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const A cur = xv.get(c);
      A acc = bs[c];  // bias, then taps oldest -> newest: the order of every path
#pragma unroll
      for (int k = 0; k < H; ++k)
        if (FULL || k >= kpad) acc = fma(wp[k][c], sl[k][c], acc);
      acc = fma(wp[H][c], cur, acc);
      o[c] = FULL ? FixedAct<M, Silu>().value(acc) : act.value(acc);
      if (res) o[c] += rv.get(c);
#pragma unroll
      for (int i = 0; i + 1 < H; ++i) sl[i][c] = sl[i + 1][c];
      sl[H - 1][c] = cur;
    }
    return P::make(o);
  }

  // Tokens [t, e) of sequence q (all inside it), channels d0 .. d0+CH.
  // ring: the thread's first slot of the FULL instance's stage (else unused);
  // RES: the FULL instance has a residual (compile-time).
  // primed: the FULL instance's ring already holds the first stages of [t, e)
  // (fwd_tm issued them before the taps: prime()).
  template <bool FULL, bool RES>
  __device__ void segment(const Args& a, const Seq& q, int64_t n, int64_t d0, int64_t t,
                          int64_t e, P* ring, bool primed) {
    if (q.pad) {  // a padding run of seq_idx: y = 0
      T* yq = static_cast<T*>(a.y.p) + q.b * a.y.s0 + d0 * a.y.s2;
      for (int64_t tok = t; tok < e; ++tok) stp<T, CH>(yq + tok * a.y.s1, P::zero());
      return;
    }
    const int64_t h0row = h0_row_of(a, n);
    const int64_t sx = a.x.s1, sr = a.residual.s1, sy = a.y.s1;
    const T* xp = row_ptr<const T>(a.x, q.b, d0);
    const T* rp = row_ptr<const T>(a.residual, q.b, d0);
    T* yp = row_ptr<T>(a.y, q.b, d0);
    load_window<T, CH>(a, q, h0row, xp, sx, d0, t, kpad, sl);
    const int64_t tok = t;
    const T* xq = xp + tok * sx;
    const T* rq = rp ? rp + tok * sr : nullptr;
    T* yq = yp + tok * sy;
    if constexpr (!k16Bit) {
      stream_copy<FULL>(xq, rq, yq, sx, sr, sy, e - tok);
    } else if constexpr (FULL) {  // (the plan's full_fwd)
      stream_staged<RES>(xq, rq, yq, sx, sr, sy, e - tok, ring, primed);
    } else {
      stream(xq, rq, yq, sx, sr, sy, e - tok);
    }
  }

  // Stage `slot` of the ring filled with the U tokens at xs (and rs).
  template <bool RES>
  __device__ __forceinline__ static void fill(P* ring, int slot, const T* xs, const T* rs,
                                              int64_t sx, int64_t sr) {
    constexpr int U = TmTraits::kFullTokens, kT = TmTraits::kThreads, K = RES ? 2 : 1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      cp_async_pack<T, CH>(ring + ((slot * U + u) * K) * kT, xs + u * sx);
      if constexpr (RES) cp_async_pack<T, CH>(ring + ((slot * U + u) * K + 1) * kT, rs + u * sr);
    }
  }
  // The ring's first NS stages of tokens xq[0 .. len), one commit group each
  // (empty past the whole stages).
  template <bool RES>
  __device__ __forceinline__ static void prime(const T* xq, const T* rq, int64_t sx, int64_t sr,
                                               int64_t len, P* ring) {
    constexpr int NS = TmTraits::full_stages(RES), U = TmTraits::kFullTokens;
    const int64_t stages = len / U;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      if (s < stages) fill<RES>(ring, s, xq + s * U * sx, RES ? rq + s * U * sr : rq, sx, sr);
      cp_async_commit();
    }
  }

  // The FULL instance's tokens xq[0 .. len): x (and with RES the residual)
  // staged through the thread's ring slots (slot (s, u, j) at
  // ring[((s * kFullTokens + u) * K + j) * kThreads], K = 1 + RES packs per
  // token: a warp's 32 packs adjacent, conflict-free), NS stages of
  // kFullTokens tokens in flight before the first is used; stage i is
  // refilled with stage i + NS after its tokens were read back and computed
  // (the reads' values are used first: no write-after-read race).  Every
  // iteration commits one group (empty past the end), so the wait count is
  // one constant.  The last len % kFullTokens tokens: tail().  primed: the
  // first NS stages were issued already (the kernel's prime()).
  template <bool RES>
  __device__ __forceinline__ void stream_staged(const T* xq, const T* rq, T* yq, int64_t sx,
                                                int64_t sr, int64_t sy, int64_t len, P* ring,
                                                bool primed) {
    constexpr int NS = TmTraits::full_stages(RES), U = TmTraits::kFullTokens, kT = TmTraits::kThreads;
    constexpr int K = RES ? 2 : 1;
    const int64_t stages = len / U;
    if (!primed) prime<RES>(xq, rq, sx, sr, len, ring);
    int slot = 0;
    for (int64_t i = 0; i < stages; ++i) {
      cp_async_wait<NS - 1>();  // stage i has landed
      P xv[U], rv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        xv[u] = lds_pack<T, CH>(ring + ((slot * U + u) * K) * kT);
        rv[u] = RES ? lds_pack<T, CH>(ring + ((slot * U + u) * K + 1) * kT) : P::zero();
      }
#pragma unroll
      for (int u = 0; u < U; ++u) stp<T, CH>(yq + u * sy, step<true>(xv[u], rv[u], RES));
      if (i + NS < stages) fill<RES>(ring, slot, xq + NS * U * sx, RES ? rq + NS * U * sr : rq, sx, sr);
      cp_async_commit();
      xq += U * sx;
      if constexpr (RES) rq += U * sr;
      yq += U * sy;
      slot = slot + 1 == NS ? 0 : slot + 1;
    }
    tail<true>(xq, rq, yq, sx, sr, sy, len - stages * U, RES);
  }

  // fp32: U tokens prefetched into a second buffer copied over at each step
  // (the ping-pong form of stream() spilled at fp32's wider vectors).
  template <bool FULL>
  __device__ __forceinline__ void stream_copy(const T* xq, const T* rq, T* yq, int64_t sx,
                                              int64_t sr, int64_t sy, int64_t len) {
    constexpr int U = kUnrollTm;
    const bool res = rq != nullptr;
    if (len >= U) {
      P xv[U], rv[U], nx[U], nr[U];
#pragma unroll
      for (int u = 0; u < U; ++u) nr[u] = P::zero();
#pragma unroll
      for (int u = 0; u < U; ++u) nx[u] = ldp<T, CH>(xq + u * sx);
      if (res) {
#pragma unroll
        for (int u = 0; u < U; ++u) nr[u] = ldp<T, CH>(rq + u * sr);
      }
      for (; len >= U; len -= U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          xv[u] = nx[u];
          rv[u] = nr[u];
        }
        if (len >= 2 * U) {  // prefetch the next step
#pragma unroll
          for (int u = 0; u < U; ++u) nx[u] = ldp<T, CH>(xq + (U + u) * sx);
          if (res) {
#pragma unroll
            for (int u = 0; u < U; ++u) nr[u] = ldp<T, CH>(rq + (U + u) * sr);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) stp<T, CH>(yq + u * sy, step<FULL>(xv[u], rv[u], res));
        xq += U * sx;
        if (res) rq += U * sr;
        yq += U * sy;
      }
    }
    tail<FULL>(xq, rq, yq, sx, sr, sy, len, res);
  }

  // The last len (< U) tokens, one at a time.
  template <bool FULL>
  __device__ __forceinline__ void tail(const T* xq, const T* rq, T* yq, int64_t sx, int64_t sr,
                                       int64_t sy, int64_t len, bool res) {
    for (; len > 0; --len) {
      const P xv = ldp<T, CH>(xq);
      P rv = P::zero();
      if (res) rv = ldp<T, CH>(rq);
      stp<T, CH>(yq, step<FULL>(xv, rv, res));
      xq += sx;
      if (res) rq += sr;
      yq += sy;
    }
  }

  // U tokens: loads then steps (the residual's when rq is not null).
  template <int U>
  __device__ __forceinline__ void load_n(P (&xv)[U], P (&rv)[U], const T* xq, const T* rq,
                                         int64_t sx, int64_t sr) {
#pragma unroll
    for (int u = 0; u < U; ++u) xv[u] = ldp<T, CH>(xq + u * sx);
    if (rq) {
#pragma unroll
      for (int u = 0; u < U; ++u) rv[u] = ldp<T, CH>(rq + u * sr);
    }
  }
  template <int U>
  __device__ __forceinline__ void steps_n(const P (&xv)[U], const P (&rv)[U], T* yq, int64_t sy,
                                          bool res) {
#pragma unroll
    for (int u = 0; u < U; ++u) stp<T, CH>(yq + u * sy, step<false>(xv[u], rv[u], res));
  }

  // The generic 16-bit instance's tokens xq[0 .. len) (strides sx, sr, sy):
  // ping-pong buffers of U tokens, the loads of one issued before the steps
  // of the other (2U tokens in flight, no register copies), then a
  // token-at-a-time tail.
  __device__ __forceinline__ void stream(const T* xq, const T* rq, T* yq, int64_t sx,
                                         int64_t sr, int64_t sy, int64_t len) {
    constexpr int U = kUnrollTm;
    const bool res = rq != nullptr;
    if (len >= U) {
      P xa[U], ra[U], xb[U], rb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) ra[u] = rb[u] = P::zero();
      load_n<U>(xa, ra, xq, rq, sx, sr);
      while (true) {  // xa holds the next U tokens, len >= U
        bool more = len >= 2 * U;
        if (more) load_n<U>(xb, rb, xq + U * sx, res ? rq + U * sr : rq, sx, sr);
        steps_n<U>(xa, ra, yq, sy, res);
        xq += U * sx;
        if (res) rq += U * sr;
        yq += U * sy;
        len -= U;
        if (!more) break;
        more = len >= 2 * U;
        if (more) load_n<U>(xa, ra, xq + U * sx, res ? rq + U * sr : rq, sx, sr);
        steps_n<U>(xb, rb, yq, sy, res);
        xq += U * sx;
        if (res) rq += U * sr;
        yq += U * sy;
        len -= U;
        if (!more) break;
      }
    }
    tail<false>(xq, rq, yq, sx, sr, sy, len, res);
  }
};

// The full-window SiLU instance (FULL: 16-bit vectors, W == WMAX; the plan's
// full_fwd; RES: with a residual) is a kernel of its own, as the backward's:
// in one kernel with the generic instance its code was twice as long (both
// loops, one register allocation); split, the dense bf16 forward+backward ran
// 393.3 -> 385.0 us and the small shape's 35.2 -> 30.2 (H200, same run).
// With x in registers (ping-pong buffers of 8 tokens) it needed 128
// registers, 2 blocks per SM: latency-bound (ncu: 22.8% occupancy, 54% of
// the stall samples on the loaded x), and capped at 3 blocks it spilled
// 288-352 B.  It now stages x in shared memory (stream_staged) under its own
// cap, TmTraits::full_min_blocks.
template <class T, int WMAX, int CH>
constexpr bool kFwdHasFull = CH > 1 && sizeof(T) == 2;

template <class T, int WMAX, int CH, bool FULL, bool RES = false>
__global__ void __launch_bounds__(TmTraits::kThreads, FULL ? TmTraits::full_min_blocks(WMAX) : TmTraits::min_blocks(WMAX, CH))
    fwd_tm(const Args a) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  static_assert(!FULL || P::kBytes <= TmTraits::kFullPackBytes, "the ring's slots hold one pack");
  static_assert(FULL || !RES, "RES is a form of the FULL instance");
  __shared__ __align__(16) P ring[FULL ? TmTraits::full_stages(RES) * TmTraits::kFullTokens * (RES ? 2 : 1) * TmTraits::kThreads : 1];
  const int64_t tile = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t d0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * CH;
  if (tile >= a.ntiles || d0 >= a.D) return;
  using K = TmFwd<T, WMAX, CH>;
  int64_t b, tb, te;
  tile_range(a, tile, &b, &tb, &te);
  P* slot0 = ring + (threadIdx.y * blockDim.x + threadIdx.x);
  // A dense tile (no packing, no seq_idx) is one segment, row b, tokens [tb, te)
  // (for_each_segment's walk, known without reading memory): the FULL instance
  // issues its ring's first stages before the taps' loads, so that the stream's
  // first tokens are in flight during the taps' and the window's round trips
  // instead of after them (a one-wave grid, the small shapes', pays every
  // round trip of a thread's prologue in its time; H100, 2026-12-06: small
  // 1x2048x2048 11.5 -> 10.3 us, dense 8x4096x4096 202.2 -> 198.1 us).
  bool primed = false;
  if constexpr (FULL && WMAX <= TmTraits::kPrimeMaxWmax) {
    primed = !a.packed && !a.sid.p && b < a.N;
    if (primed)
      K::template prime<RES>(row_ptr<const T>(a.x, b, d0) + tb * a.x.s1,
                             RES ? row_ptr<const T>(a.residual, b, d0) + tb * a.residual.s1 : nullptr,
                             a.x.s1, a.residual.s1, te - tb, slot0);
  }
  K k;
  k.kpad = FULL ? 0 : WMAX - a.W;
  k.act.id = a.act;
  const A scale = A(k.act.scale());  // exact: 1, or 0.5 for a tanh form (core/activation.hpp)
  load_taps<A, WMAX, CH>(a.weight, a.bias, d0, a.D, k.kpad, scale, k.wp, k.bs);
  for_each_segment(a, b, tb, te, [&](const Seq& q, int64_t n, int64_t t, int64_t e) {
    k.template segment<FULL, RES>(a, q, n, d0, t, e, slot0, primed);
  });
}

// ---- channel-major ------------------------------------------------------------

// FULL: W == WMAX and SiLU, both compile-time (with_cm_full): no tap
// predicates, no activation select.
template <class T, int WMAX, bool FULL>
__global__ void __launch_bounds__(CmTraits::kThreads, CmTraits::kMinBlocksPerSm) fwd_cm(const Args a) {
  using A = acc_t<T>;
  constexpr int VEC = CmTraits::vec(sizeof(T));
  constexpr int H = WMAX - 1;
  const int64_t gid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t wid = gid >> 5;
  const int lane = int(gid & 31);
  if (wid >= a.B * a.D * a.tiles_per_row) return;
  const int64_t row = wid / a.tiles_per_row, tile = wid - row * a.tiles_per_row;
  const int64_t b = row / a.D, d = row - b * a.D;
  const int W = FULL ? WMAX : a.W;
  const auto act = act_of<T, FULL>(a.act);
  const A scale = A(act.scale());  // 1, or 0.5 for a tanh form
  A wr[WMAX], bs;
  load_taps_newest_first<A, WMAX>(a.weight, a.bias, d, W, scale, wr, &bs);
  const Seq q{b, 0, a.T, ring_of(a, b), false};
  const int64_t h0row = h0_row_of(a, b);
  const T* xr = row_ptr<const T>(a.x, b, d);
  const T* rr = row_ptr<const T>(a.residual, b, d);
  T* yr = row_ptr<T>(a.y, b, d);
  const int64_t tb = tile * a.tile_t;
  const int64_t tend = tb + a.tile_t < a.T ? tb + a.tile_t : a.T;
  constexpr int U = CmTraits::kFwdUnroll;
  constexpr int64_t kChunk = int64_t(CmTraits::kWarp) * VEC;
  using P = Pack<T, VEC>;
  A xp[VEC];  // this lane's x in the previous chunk (the window's source for the next lanes)
#pragma unroll
  for (int i = 0; i < VEC; ++i) xp[i] = A(0);
  for (int64_t c0 = tb + int64_t(lane) * VEC; c0 - int64_t(lane) * VEC < tend; c0 += U * kChunk) {
    P xv[U], rv[U];  // U chunks' loads in flight together
#pragma unroll
    for (int s = 0; s < U; ++s) {
      const int64_t t0 = c0 + s * kChunk;
      xv[s] = t0 < tend ? ldp<T, VEC>(xr + t0) : P::zero();
      rv[s] = rr && t0 < tend ? ldp<T, VEC>(rr + t0) : P::zero();
    }
#pragma unroll
    for (int s = 0; s < U; ++s) {
      const int64_t t0 = c0 + s * kChunk;
      if (t0 - int64_t(lane) * VEC >= tend) break;  // (warp-uniform: every lane shuffles)
      A xc[VEC], u[H + VEC];  // u[H + i] = x[t0 + i]; u[H - 1 - i] = u(t0 - 1 - i)
#pragma unroll
      for (int i = 0; i < VEC; ++i) u[H + i] = xc[i] = xv[s].get(i);
      cm_window<T, H, VEC>(a, q, h0row, d, xr, t0, lane, W, s == 0 && c0 - int64_t(lane) * VEC == tb, xc, xp, u);
#pragma unroll
      for (int i = 0; i < VEC; ++i) xp[i] = xc[i];
      if (t0 >= tend) continue;
      A out[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        A acc = bs;  // bias, then taps oldest -> newest (j = W-1 .. 0): the order of every path
#pragma unroll
        for (int j = WMAX - 1; j >= 0; --j)
          if (j < W) acc = fma(wr[j], u[H + i - j], acc);
        out[i] = act.value(acc);
        if (rr) out[i] += rv[s].get(i);
      }
      stp<T, VEC>(yr + t0, P::make(out));
    }
  }
}

// ---- general (W > 16, any strides) ----------------------------------------------

template <class A>
__global__ void __launch_bounds__(GeneralTraits::kThreads, GeneralTraits::kMinBlocksPerSm)
    fwd_general(const Args a) {
  using M = std::conditional_t<std::is_same_v<A, double>, MathF64, MathF32>;
  int64_t tile, d, b, tb, te;
  if (!general_coords(a, &tile, &d, &b, &tb, &te)) return;
  const RuntimeAct<M> act{a.act};  // (scale 1: the general path never pre-scales)
  const A bs = a.bias.p ? ld<A>(a.bias.p, a.bias.dt, d * a.bias.s0) : A(0);
  for_each_segment(a, b, tb, te, [&](const Seq& q, int64_t n, int64_t t, int64_t e) {
    if (q.pad) {  // a padding run of seq_idx: y = 0
      for (int64_t tok = t; tok < e; ++tok)
        st<A>(a.y.p, a.y.dt, q.b * a.y.s0 + tok * a.y.s1 + d * a.y.s2, A(0));
      return;
    }
    const int64_t h0row = h0_row_of(a, n);
    for (int64_t tok = t; tok < e; ++tok) {
      const int64_t p0 = a.S - (a.W - 1) + (tok - q.s);  // u position of tap 0
      A acc = bs;
      for (int k = 0; k < a.W; ++k)
        acc = fma(ld<A>(a.weight.p, a.weight.dt, d * a.weight.s0 + k * a.weight.s1),
                  load_u<A>(a, q, h0row, d, p0 + k), acc);
      A o = act.value(acc);
      if (a.residual.p)
        o += ld<A>(a.residual.p, a.residual.dt,
                   q.b * a.residual.s0 + tok * a.residual.s1 + d * a.residual.s2);
      st<A>(a.y.p, a.y.dt, q.b * a.y.s0 + tok * a.y.s1 + d * a.y.s2, o);
    }
  });
}

// ---- final state ------------------------------------------------------------------

// ht[j] = u(from + j) of channel d into row `out` (slot j, or its ring slot);
// j upward: u(from + j) (an h0 entry at index >= j, or x) is read before ht[j]
// is written, so the aliased in-place update never reads a written slot (with
// ring rows: ht[j] goes to slot (c + L + j) mod S, the slot u(L+j) was read
// from when it is an h0 entry; later j read other slots).
__device__ __forceinline__ void write_state(const Args& a, const Seq& q, int64_t in, int64_t d,
                                            int64_t out, int64_t from, bool ring_slots) {
  // slot of entry 0, before wrapping (without rings entry j is slot j)
  const int64_t first = ring_slots && a.ring.p && a.S > 0 ? q.c + q.L % a.S : 0;
  for (int64_t j = 0; j < a.S; ++j) {
    const double v = load_u<double>(a, q, in, d, from + j);  // exact copy, rounded once
    int64_t slot = first + j;
    slot -= slot >= a.S ? a.S : 0;
    slot -= slot >= a.S ? a.S : 0;
    st<double>(a.ht.p, a.ht.dt, out * a.ht.s0 + d * a.ht.s1 + slot * a.ht.s2, v);
  }
}

__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    state_fwd(const Args a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.N * a.D) return;
  const int64_t n = i / a.D, d = i - n * a.D;
  const int64_t out = ht_row_of(a, n), in = h0_row_of(a, n);
  const Seq q = seq_of(a, n);
  int64_t m0 = 0;
  const int64_t nsnap = snapshot_count(a, n, q.L, &m0);
  if (out < 0 && nsnap == 0) return;
  // The final state, then (prefix caching) the snapshot at every block boundary
  // inside the chunk, the last S entries of u after r = m * B - c tokens.  A
  // write into the row h0 was read from goes last (rows written are distinct:
  // at most one is h0's), after every write that still reads it.
  const bool in_place = a.h0.p == a.ht.p && in >= 0;
  const int64_t c0 = (m0 - 1) * a.block_size;  // (c rounded down to a block start)
  const int64_t c = a.block_size > 0 ? ld_index(a.computed, n) : 0;
  for (int pass = 0; pass < (in_place ? 2 : 1); ++pass) {
    auto now = [&](int64_t row) { return row >= 0 && (!in_place || (row == in) == (pass == 1)); };
    if (now(out)) write_state(a, q, in, d, out, q.L, true);
    for (int64_t k = 0; k < nsnap; ++k) {
      const int64_t row = table_row(a, a.ht, a.first_blk, n, k);
      const int64_t r = c0 + (k + 1) * a.block_size - (c < 0 ? 0 : c);
      if (now(row)) write_state(a, q, in, d, row, r, false);
    }
  }
}

// seq_idx (semantics section 3): the final state of every real run into its
// id's row.  A block's warps share IdStateTraits::kTokens flat tokens: one
// ballot finds the runs ending there, then each thread writes its channel of
// those runs' rows (j upward, as state_fwd: the in-place rule).  An id past
// final_state's rows writes nothing; one past initial_state's reads zeros.
__global__ void __launch_bounds__(IdStateTraits::kThreads, IdStateTraits::kMinBlocksPerSm)
    state_fwd_ids(const Args a) {
  const int lane = int(threadIdx.x & 31);
  const int64_t d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t g = int64_t(blockIdx.x) * IdStateTraits::kTokens + lane;
  int64_t id = -1, keep = 0;  // keep: run tokens kept in the state (<= S)
  if (g < a.B * a.T) {
    const int64_t b = g / a.T, t = g - b * a.T;
    id = sid_at(a, b, t);
    const bool end = t == a.T - 1 || sid_at(a, b, t + 1) != id;
    if (!end || id < 0 || id >= a.ht.n0) id = -1;
    for (keep = 1; id >= 0 && keep < a.S && t - keep >= 0 && sid_at(a, b, t - keep) == id;)
      ++keep;
  }
  for (unsigned m = __ballot_sync(0xffffffffu, id >= 0); m; m &= m - 1) {
    const int l = __ffs(m) - 1;
    const int64_t i = __shfl_sync(0xffffffffu, id, l), L = __shfl_sync(0xffffffffu, keep, l);
    if (d >= a.D) continue;
    const int64_t ge = int64_t(blockIdx.x) * IdStateTraits::kTokens + l, b = ge / a.T;
    const int64_t t_end = ge - b * a.T, in = a.h0.p && i < a.h0.n0 ? i : -1;
    // ht[j] = u(L + j): the h0 entry L + j (a run shorter than S), else the
    // token t_end + 1 - S + j; L = keep when the run is shorter than S.
    for (int64_t j = 0; j < a.S; ++j) {
      double v = 0.0;
      if (j < a.S - L)
        v = in >= 0 ? ld<double>(a.h0.p, a.h0.dt, in * a.h0.s0 + d * a.h0.s1 + (L + j) * a.h0.s2) : 0.0;
      else
        v = ld<double>(a.x.p, a.x.dt, b * a.x.s0 + (t_end + 1 - a.S + j) * a.x.s1 + d * a.x.s2);
      st<double>(a.ht.p, a.ht.dt, i * a.ht.s0 + d * a.ht.s1 + j * a.ht.s2, v);
    }
  }
}

// ---- launches -----------------------------------------------------------------------

// The forward's kernels, for launch_path (dispatch.cuh).
struct FwdKernels {
  template <class T, int WMAX, int CH>
  static cudaError_t tm(const Plan& pl, const Args& a, Launch* l) {
    if constexpr (kFwdHasFull<T, WMAX, CH>) {
      if (pl.full_fwd && a.residual.p)
        return l->main("fwd_tm(vector, full window, residual)", fwd_tm<T, WMAX, CH, true, true>, pl, a);
      if (pl.full_fwd) return l->main("fwd_tm(vector, full window)", fwd_tm<T, WMAX, CH, true>, pl, a);
    }
    if constexpr (WMAX > kTmWideFullOnly && CH > 1) return l->no_instance("fwd_tm(vector, wide window, generic)");
    else return l->main(CH > 1 ? "fwd_tm(vector)" : "fwd_tm(scalar)", fwd_tm<T, WMAX, CH, false>, pl, a);
  }
  template <class T, int WMAX>
  static cudaError_t cm(const Plan& pl, const Args& a, Launch* l) {
    cudaError_t e = cudaSuccess;
    if (with_cm_full<WMAX>(a, [&](auto w) {
          e = l->main("fwd_cm(full window)", fwd_cm<T, decltype(w)::value, true>, pl, a);
        }))
      return e;
    return l->main("fwd_cm", fwd_cm<T, WMAX, false>, pl, a);
  }
  template <class A>
  static cudaError_t general(const Plan& pl, const Args& a, Launch* l) {
    return l->main("fwd_general", fwd_general<A>, pl, a);
  }
};

}  // namespace

cudaError_t launch_fwd(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  if (pl.path == Path::decode) return launch_decode(p, pl, a, l);  // outputs and rows, one launch
  if (p.y && pl.ntiles > 0 && p.D > 0) {
    const cudaError_t e =
        with_act_type(p.act_dtype, [&](auto t) { return launch_path<FwdKernels, typename decltype(t)::type>(pl, a, l); });
    if (e != cudaSuccess) return e;
  }
  if (!p.ht || p.N == 0 || p.D == 0 || p.S == 0) return cudaSuccess;
  if (p.seq_idx) return l->ids("state_fwd_ids", state_fwd_ids, p.B * p.T, p.D, a);
  return l->small("state_fwd", state_fwd, p.N * p.D, a);
}

}  // namespace shortconv::cuda
