// CUDA backward kernels.
//
// Math (docs/semantics.md §2), per sequence n, channel d, off = S-(W-1):
//   dpre[t] = dy[t] * act'(pre[t])                         (pre recomputed from x and h0)
//   du[p]   = sum_{t,k: off+t+k=p} weight[k] * dpre[t]  +  (p >= L ? dht[p-L] : 0)
//   dx[t]   = du[S+t],  dh0[j] = du[j]
//   dweight[k] = sum_n sum_t dpre[t] * u[off+t+k],  dbias = sum_n sum_t dpre[t]
//
// Ownership (every output element has exactly one writer; no atomics):
// - bwd_tm<T, WMAX, CH>: token-major.  A thread owns CH channels and a tile of
//   tokens [t, e) of dx.  It streams t' from t to e+W-2 (clipped at its
//   sequence's end; a (W-1)-token look-behind for pre and a (W-1)-token
//   look-ahead for dpre), computing pre, dpre in registers; dx[t'-(W-1)] is a
//   gather over the last W dpre values.  dweight/dbias partials come from the
//   dpre of its own tokens only, summed over the block's ty tiles in shared
//   memory in a fixed order, one partial row per block in the workspace.
// - bwd_cm<T, WMAX, FULL>: channel-major (stride_t == 1, dense).  A warp owns a
//   (batch, channel) row and a tile of tokens, a lane VEC consecutive tokens;
//   the (W-1)-token window before and the look-ahead dpre after them come
//   from neighbouring lanes by shuffles (dx one chunk behind dpre); partials
//   reduced over the warp by a fixed xor butterfly, one row per warp tile.
//   x and dy reach the lanes through a per-warp shared-memory stage filled by
//   cp.async, CmTraits::kBwdStages - 1 chunks ahead of the one computed (its
//   registers allow few warps per SM, and one chunk of register prefetch per
//   warp kept too few bytes in flight: 39% of DRAM throughput).  Full-window
//   instances (FULL: W = 2, 3, 4 with SiLU) as in the forward.
// - dpre_general / bwd_general<A>: W > 16 or nothing else fits: dpre to the
//   workspace, then a per-(channel, tile) gather; one partial row per tile.
// - state_bwd<A>: one thread per (sequence, channel) writes dh0_n[0..S),
//   recomputing dpre for the first W-1 tokens (zero-length sequences included).
//   seq_idx: zero_dh0 (every row), then state_bwd_ids (the runs' rows).
// - seq_idx: the tiles are on the flat B*T axis; the walker (common.cuh) finds
//   the runs; padding runs write dx = 0 and add no partial.
// - reduce_parts<A>: one thread per (channel, tap) sums the partial rows in
//   index order and rounds once into dweight / dbias: deterministic.
#include <algorithm>

#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

namespace {

constexpr int kUnroll = TmTraits::kUnroll;  // t' steps whose loads are issued together

// part[(row * D + d) * (W+1) + k]: k < W dweight partial, k == W dbias partial.
template <class A>
__device__ __forceinline__ A* part_at(const Args& a, int64_t row, int64_t d) {
  return static_cast<A*>(a.part) + (row * a.D + d) * (a.W + 1);
}

// Token-major backward state of one thread.  Weights padded to WMAX taps as
// in the forward (wp[k] = weight[k - kpad], taps k < kpad predicated off).
// With padding, dx[t] = sum_m wp[m] * dpre[t + H - m], so dx of token t'-H is
// complete once dpre(t') is known: the stream runs t' in [t, e + H).
//
// Weights and bias are scaled by the activation's scale on load (0.5 for the
// tanh form of an activation), so the tap sum is p = scale * pre and the
// dpre kept in dh / summed into the partials is g = dpre / scale (the
// activation policy's dgrad): dx = sum of (scale w)(dpre / scale) is
// unchanged, and the partials are multiplied by scale once at the end.
template <class T, int WMAX, int CH>
struct TmBwd {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  using M = MathOf<T>;
  static constexpr int H = WMAX - 1;

  int kpad;
  RuntimeAct<M> act;
  bool want_dw;
  A wp[WMAX][CH];
  A bs[CH];
  A sl[H][CH];      // sl[i] = u(t' - H + i)
  A dh[H][CH];      // dh[i] = dpre(t' - H + i)
  A dwp[WMAX][CH];  // dweight[m - kpad] partial
  A db[CH];

  // One t': dpre(t') (zero when !in_seq), partials when OWN, and the conv part
  // of dx(t' - H) into dxo.  `skip`: the newest taps m < skip read dpre rows
  // past the sequence's end, which do not exist: they are not formed (a NaN or
  // infinite weight must not meet the zero held for them).
  //
  // FULL (16-bit vector kernels, W == WMAX, SiLU, dy, dx and dweight/dbias
  // wanted, compile-time: no pad predicates, no activation select, no want_*
  // tests); the arithmetic is the generic instance's for those inputs.
  template <bool OWN, bool FULL = false>
  __device__ __forceinline__ void step(const P& xv, const P& gv, bool in_seq, int skip,
                                       A (&dxo)[CH]) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      A cur = A(0), dp = A(0);
      if (in_seq) {
        cur = xv.get(c);
        A pre = bs[c];  // same order as the forward (scaled: p = scale * pre)
#pragma unroll
        for (int k = 0; k < H; ++k)
          if (FULL || k >= kpad) pre = fma(wp[k][c], sl[k][c], pre);
        pre = fma(wp[H][c], cur, pre);
        dp = FULL ? FixedAct<M, Silu>().dgrad(gv.get(c), pre) : act.dgrad(gv.get(c), pre);
      }
      if (OWN && (FULL || want_dw)) {
        db[c] += dp;
        dwp[H][c] = fma(dp, cur, dwp[H][c]);
#pragma unroll
        for (int m = 0; m < H; ++m)
          if (FULL || m >= kpad) dwp[m][c] = fma(dp, sl[m][c], dwp[m][c]);
      }
      A v = ((FULL || kpad == 0) && skip == 0) ? wp[0][c] * dp : A(0);
#pragma unroll
      for (int m = 1; m <= H; ++m)
        if ((FULL || m >= kpad) && m >= skip) v = fma(wp[m][c], dh[H - m][c], v);
      dxo[c] = v;
#pragma unroll
      for (int i = 0; i + 1 < H; ++i) {
        sl[i][c] = sl[i + 1][c];
        dh[i][c] = dh[i + 1][c];
      }
      sl[H - 1][c] = cur;
      dh[H - 1][c] = dp;
    }
  }

  // The FULL instance's hot steps t' in [tp, end) (whole stages only; the
  // caller's generic steps take the rest): x and dy staged through the
  // thread's ring slots (slot (s, u, x|dy) at ring[((s * kBwdTokens + u) * 2
  // + x|dy) * kThreads]: a warp's 32 packs adjacent), kBwdStages stages in
  // flight before the first is used, each stage refilled after its tokens
  // were read back and computed, one commit group per iteration (empty past
  // the end), as the forward's stream_staged.  Returns the first t' not taken.
  __device__ __forceinline__ int64_t stream_staged(const T* xp, const T* gp, T* dp, int64_t sx,
                                                   int64_t sg, int64_t sd, int64_t tp, int64_t end,
                                                   P* ring) {
    constexpr int NS = TmTraits::kBwdStages, U = TmTraits::kBwdTokens, kT = TmTraits::kThreads;
    const int64_t stages = (end - tp) / U;
    const T* xq = xp + tp * sx;
    const T* gq = gp + tp * sg;
    T* dq = dp + (tp - H) * sd;
    auto fill = [&](int slot, const T* xs, const T* gs) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        cp_async_pack<T, CH>(ring + ((slot * U + u) * 2) * kT, xs + u * sx);
        cp_async_pack<T, CH>(ring + ((slot * U + u) * 2 + 1) * kT, gs + u * sg);
      }
    };
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      if (s < stages) fill(s, xq + s * U * sx, gq + s * U * sg);
      cp_async_commit();
    }
    int slot = 0;
    constexpr int kStageUnroll = TmTraits::kBwdUnroll;
#pragma unroll kStageUnroll
    for (int64_t i = 0; i < stages; ++i) {
      cp_async_wait<NS - 1>();  // stage i has landed
      P xv[U], gv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        xv[u] = lds_pack<T, CH>(ring + ((slot * U + u) * 2) * kT);
        gv[u] = lds_pack<T, CH>(ring + ((slot * U + u) * 2 + 1) * kT);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        A dxo[CH];
        step<true, true>(xv[u], gv[u], true, 0, dxo);
        stp<T, CH>(dq + u * sd, P::make(dxo));
      }
      if (i + NS < stages) fill(slot, xq + NS * U * sx, gq + NS * U * sg);
      cp_async_commit();
      xq += U * sx;
      gq += U * sg;
      dq += U * sd;
      slot = slot + 1 == NS ? 0 : slot + 1;
    }
    return tp + stages * U;
  }

  // dx tokens [t, e) of sequence q (channels d0 .. d0+CH); dy present.
  // ring: the thread's first slot of the FULL instance's stage (else unused).
  template <bool FULL>
  __device__ void segment(const Args& a, const Seq& q, int64_t n, int64_t d0, int64_t t,
                          int64_t e, P* ring) {
    const int64_t sx = a.x.s1, sg = a.dy.s1, sd = a.dx.s1;
    T* dp = row_ptr<T>(a.dx, q.b, d0);
    if (q.pad) {  // a padding run of seq_idx: dx = 0, no partial, no state term
      for (int64_t tok = t; dp && tok < e; ++tok) stp<T, CH>(dp + tok * sd, P::zero());
      return;
    }
    const int64_t h0row = h0_row_of(a, n), dhtrow = dht_row_of(a, n);
    const T* xp = row_ptr<const T>(a.x, q.b, d0);
    const T* gp = row_ptr<const T>(a.dy, q.b, d0);  // (dy present: dx_from_dht handles its absence)
    const P zero = P::zero();
    load_window<T, CH>(a, q, h0row, xp, sx, d0, t, kpad, sl);
#pragma unroll
    for (int i = 0; i < H; ++i)
#pragma unroll
      for (int c = 0; c < CH; ++c) dh[i][c] = A(0);
    const int64_t send = q.s + q.L, stop = e + H;
    const int64_t fast_begin = t + H;  // first t' whose dx token is in the tile
    const int64_t dht_from = dhtrow >= 0 ? send - a.S + H : stop;  // first t' whose dx token takes dht
    const int64_t fast_end = e < dht_from ? e : dht_from;
    // Generic step: any t' (look-ahead, warm-up, dht tokens, tails).  Past the
    // sequence's end nothing is loaded and the taps reading dpre rows past
    // the end are skipped.  (A version with in- and past-sequence steps as two
    // instances, more code, had the fp32 backward 2-3% slower in one H200 run.)
    auto generic = [&](int64_t tp) {
      const bool in_seq = tp < send;
      const P xv = in_seq ? ldp<T, CH>(xp + tp * sx) : zero;
      const P gv = in_seq ? ldp<T, CH>(gp + tp * sg) : zero;
      A dxo[CH];
      const int skip = in_seq ? 0 : int(tp - send + 1 < WMAX ? tp - send + 1 : WMAX);
      if (tp < e) step<true, FULL>(xv, gv, in_seq, skip, dxo);
      else step<false, FULL>(xv, gv, in_seq, skip, dxo);
      const int64_t tout = tp - H;
      if (!dp || tout < t) return;
      A out[CH];
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        A v = dxo[c];
        if (dhtrow >= 0 && tout - q.s >= q.L - a.S)
          v += ld<A>(a.dht.p, a.dht.dt,
                     dhtrow * a.dht.s0 + (d0 + c) * a.dht.s1 + (a.S + tout - q.s - q.L) * a.dht.s2);
        out[c] = v;
      }
      stp<T, CH>(dp + tout * sd, P::make(out));
    };
    int64_t tp = t;
    for (const int64_t w_end = fast_begin < stop ? fast_begin : stop; tp < w_end; ++tp) generic(tp);
    // Hot loop: own tokens, in sequence, dx out, no dht.  (No prefetch of the
    // next step here: its registers made ptxas spill at the 2-blocks/SM cap,
    // also in the FULL instance, tried with ping-pong buffers; the FULL
    // instance stages its loads in shared memory instead.)
    if constexpr (FULL) {
      if (fast_end > tp) tp = stream_staged(xp, gp, dp, sx, sg, sd, tp, fast_end, ring);
    }
    for (; !FULL && tp + kUnroll <= fast_end; tp += kUnroll) {
      P xv[kUnroll], gv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) xv[u] = ldp<T, CH>(xp + (tp + u) * sx);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) gv[u] = ldp<T, CH>(gp + (tp + u) * sg);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        A dxo[CH];
        step<true, false>(xv[u], gv[u], true, 0, dxo);
        if (dp) stp<T, CH>(dp + (tp + u - H) * sd, P::make(dxo));
      }
    }
    for (; tp < stop; ++tp) generic(tp);
  }
};

// The full-window instance (FULL: 16-bit vectors, W == WMAX, SiLU, dx, dy and
// dweight/dbias wanted, tiles of at least kBwdFullMinTileT tokens: the plan's
// full_bwd) is its own kernel: each kernel's registers are then allocated for
// its own loop (as one kernel, the generic steps spilled more).  It stages x
// and dy in a static shared-memory ring (stream_staged) and reduces the
// partials in the same memory afterwards.
template <class T, int WMAX, int CH>
constexpr bool kHasFull = CH > 1 && sizeof(T) == 2;

template <class T, int WMAX, int CH, bool FULL>
__global__ void __launch_bounds__(TmTraits::kThreads, TmTraits::min_blocks(WMAX, CH)) bwd_tm(const Args a) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  static_assert(!FULL || P::kBytes <= TmTraits::kFullPackBytes, "the ring's slots hold one pack");
  // (the ring's stages, or the block's reduction where that is larger: the
  // 16-tap instance's 17 partials of 2 channels)
  constexpr size_t kRed = TmTraits::bwd_smem(1, TmTraits::kThreads, CH, WMAX, sizeof(A));
  constexpr size_t kStaged = size_t(TmTraits::kBwdStages) * TmTraits::kBwdTokens * 2 * TmTraits::kThreads;
  constexpr size_t kRing = !FULL ? 1 : kStaged * sizeof(P) >= kRed ? kStaged : (kRed + sizeof(P) - 1) / sizeof(P);
  __shared__ __align__(16) P ring[kRing];
  static_assert(!FULL || kRed <= sizeof(P) * kRing, "the block's reduction fits in the ring");
  static_assert(sizeof(P) * kRing <= 48 * 1024, "the ring is static shared memory (48 KB at most)");
  const int64_t tile = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t d0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * CH;
  const bool active = tile < a.ntiles && d0 < a.D;
  TmBwd<T, WMAX, CH> k;
  k.kpad = WMAX - a.W;
  k.act.id = a.act;
  k.want_dw = a.dweight.p != nullptr || a.dbias.p != nullptr;
  const A scale = A(k.act.scale());  // exact: 1, or 0.5 for a tanh form (core/activation.hpp)
  // (per-load conversions kept here: with load_taps the dense bf16 forward+backward
  // measured 5-8% slower on the H200, though the tiles' start is not its bound)
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const int64_t d = d0 + c;
    const bool in = active && d < a.D;
#pragma unroll
    for (int j = 0; j < WMAX; ++j) {
      k.wp[j][c] = (in && j >= k.kpad) ? scale * ld<A>(a.weight.p, a.weight.dt,
                                                       d * a.weight.s0 + (j - k.kpad) * a.weight.s1)
                                       : A(0);
      k.dwp[j][c] = A(0);
    }
    k.bs[c] = (in && a.bias.p) ? scale * ld<A>(a.bias.p, a.bias.dt, d * a.bias.s0) : A(0);
    k.db[c] = A(0);
  }
  if (active) {
    int64_t b, tb, te;
    tile_range(a, tile, &b, &tb, &te);
    P* slot0 = ring + (threadIdx.y * blockDim.x + threadIdx.x);
    for_each_segment(a, b, tb, te, [&](const Seq& q, int64_t n, int64_t t, int64_t e) {
      k.template segment<FULL>(a, q, n, d0, t, e, slot0);
    });
#pragma unroll
    for (int c = 0; c < CH; ++c) {  // partials of dpre / scale -> of dpre (exact)
#pragma unroll
      for (int j = 0; j < WMAX; ++j) k.dwp[j][c] *= scale;
      k.db[c] *= scale;
    }
  }
  if (!k.want_dw) return;  // uniform over the grid
  // Block reduction over the ty tiles in a fixed order (y = 0, 1, ...), then
  // one partial row per block.  Thread (x, y) stores its E partials at
  // red[(y * cx + x) * E + e]; sum i = x * E + e over y is then
  // red[y * cx * E + i]: every thread of the block takes some i (consecutive
  // threads read consecutive words: no bank conflicts), rather than one warp
  // summing all of them (its serial tail held the block's SM slot).
  constexpr int E = CH * (WMAX + 1);
  // (FULL: in the ring, once every thread of the block is done with its slots;
  // their last commit groups are empty)
  A* red = FULL ? reinterpret_cast<A*>(ring) : reinterpret_cast<A*>(smem_raw);
  if constexpr (FULL) __syncthreads();
  const int cx = int(blockDim.x), ty = int(blockDim.y);
  A* mine = red + (int64_t(threadIdx.y) * cx + threadIdx.x) * E;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
#pragma unroll
    for (int j = 0; j < WMAX; ++j) mine[c * (WMAX + 1) + j] = k.dwp[j][c];
    mine[c * (WMAX + 1) + WMAX] = k.db[c];
  }
  __syncthreads();
  const int row = cx * E;
  for (int i = int(threadIdx.y) * cx + int(threadIdx.x); i < row; i += cx * ty) {
    const int x = i / E, c = (i % E) / (WMAX + 1), j = i % (WMAX + 1);
    const int64_t d = (int64_t(blockIdx.y) * cx + x) * CH + c;
    if (j < k.kpad || d >= a.D) continue;
    A s = A(0);
    for (int y = 0; y < ty; ++y) s += red[y * row + i];
    part_at<A>(a, blockIdx.x, d)[j < WMAX ? j - k.kpad : a.W] = s;
  }
}

// ---- channel-major ---------------------------------------------------------------

// Chunks of 32 * VEC tokens as in fwd_cm (cm_window: the x window from the
// lower lanes).  dx(t) needs dpre(t .. t + W-1), which at a chunk's end is in
// the next chunk, so dx runs one chunk behind: step k forms dpre of chunk k
// (the lane's own VEC tokens, once each) and dx of chunk k-1, whose
// look-ahead dpre values come by shuffles from the higher lanes of chunk
// k-1 or, past its lane 31, from chunk k.  After the tile's last chunk one
// more step forms dx of that chunk; when the tile ends inside the row it
// first forms the dpre of the next W-1 tokens (the next tile's; x and dy
// read again for those lanes only), at the row's end those terms do not
// exist and are not formed.
//
// FULL: W == WMAX and SiLU, both compile-time (with_cm_full): no tap
// predicates, no activation select.
template <class T, int WMAX, bool FULL>
__global__ void __launch_bounds__(CmTraits::kBwdThreads, CmTraits::bwd_min_blocks(WMAX)) bwd_cm(const Args a) {
  using A = acc_t<T>;
  constexpr int VEC = CmTraits::vec(sizeof(T));
  constexpr int H = WMAX - 1;
  constexpr int64_t kChunk = int64_t(CmTraits::kWarp) * VEC;
  using P = Pack<T, VEC>;
  const int64_t gid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t wid = gid >> 5;
  const int lane = int(gid & 31);
  if (wid >= a.B * a.D * a.tiles_per_row) return;  // whole warps only
  const int64_t row = wid / a.tiles_per_row, tile = wid - row * a.tiles_per_row;
  const int64_t b = row / a.D, d = row - b * a.D;
  const int W = FULL ? WMAX : a.W;
  const bool want_dw = a.dweight.p || a.dbias.p;
  const auto act = act_of<T, FULL>(a.act);
  const A scale = A(act.scale());  // p = scale * pre; dp = dpre / scale (see TmBwd)
  A wr[WMAX], dwr[WMAX], db = A(0), bs;
  load_taps_newest_first<A, WMAX>(a.weight, a.bias, d, W, scale, wr, &bs);
#pragma unroll
  for (int j = 0; j < WMAX; ++j) dwr[j] = A(0);
  const Seq q{b, 0, a.T, ring_of(a, b), false};
  const int64_t h0row = h0_row_of(a, b);
  const T* xr = row_ptr<const T>(a.x, b, d);
  const T* gr = row_ptr<const T>(a.dy, b, d);  // (dy present: dx_from_dht handles its absence)
  T* dxr = row_ptr<T>(a.dx, b, d);
  const int64_t tb = tile * a.tile_t;
  const int64_t tend = tb + a.tile_t < a.T ? tb + a.tile_t : a.T;
  // Tokens a lane of the step at `base` holds: the tile's own, or in the step
  // after the tile (base >= tend) the next tile's first W-1 (none at the row's end).
  const int64_t look_end = tend + (W - 1) < a.T ? tend + (W - 1) : a.T;
  auto holds = [&](int64_t t0) { return t0 < tend || (t0 >= tend && t0 < look_end); };
  // The stage: slot k of this warp holds the x and dy vectors of every lane
  // for one step; each lane reads back only what it copied itself.
  constexpr int K = CmTraits::kBwdStages;
  __shared__ uint4 stage[CmTraits::kBwdThreads / CmTraits::kWarp][K][2][CmTraits::kWarp];
  auto& mine = stage[threadIdx.x / CmTraits::kWarp];
  const int64_t nsteps = (tend - tb + kChunk - 1) / kChunk + 1;  // the tile's chunks, then one more
  // Step s's copies into slot s % K, one commit group per step (an empty one
  // past the last step, so that the wait count stays the same).
  auto issue = [&](int64_t s, int slot) {
    if (s < nsteps) {
      const int64_t t0 = tb + s * kChunk + int64_t(lane) * VEC;
      const bool in = holds(t0);
      cp_async16(&mine[slot][0][lane], xr + (in ? t0 : 0), in);
      cp_async16(&mine[slot][1][lane], gr + (in ? t0 : 0), in);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < K - 1; ++s) issue(s, s);
  int64_t step = 0;  // the step computed next, and its slot step % K
  int slot = 0;
  A xp[VEC], dpp[VEC];  // x and dpre of this lane in the previous chunk
#pragma unroll
  for (int i = 0; i < VEC; ++i) xp[i] = dpp[i] = A(0);
  // One step at `base`.  FAST (warp-uniform): a full chunk of the tile after
  // its first, whose previous chunk's dx takes no dht term and reads no dpre
  // row past the row's end: no predicates, no memory window, no dht loads.
  auto chunk_step = [&](int64_t base, bool own, auto fast_c) {
    constexpr bool FAST = decltype(fast_c)::value;
    const int64_t t0 = base + int64_t(lane) * VEC;
    cp_async_wait<K - 2>();  // this step's group has landed
    const P xv = pack_of<T, VEC>(mine[slot][0][lane]), gv = pack_of<T, VEC>(mine[slot][1][lane]);
    A xc[VEC], u[H + VEC], dpc[VEC];  // u[H + i] = x(t0 + i), u[H - 1 - i] = u(t0 - 1 - i)
#pragma unroll
    for (int i = 0; i < VEC; ++i) u[H + i] = xc[i] = xv.get(i);
    cm_window<T, H, VEC>(a, q, h0row, d, xr, t0, lane, W, !FAST && base == tb, xc, xp, u);
    const bool here = FAST || holds(t0);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      A v = A(0);
      if (here) {
        A pre = bs;  // same order as the forward
#pragma unroll
        for (int j = WMAX - 1; j >= 0; --j)
          if (j < W) pre = fma(wr[j], u[H + i - j], pre);
        v = act.dgrad(gv.get(i), pre);
      }
      dpc[i] = v;
    }
    if (own && here && want_dw) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        db += dpc[i];
#pragma unroll
        for (int j = 0; j < WMAX; ++j)
          if (j < W) dwr[j] = fma(dpc[i], u[H + i - j], dwr[j]);
      }
    }
    if ((FAST || base > tb) && dxr) {  // dx of the previous chunk (warp-uniform test)
      A dp[VEC + H];  // dp[i] = dpre(tp + i), tp = t0 - kChunk
#pragma unroll
      for (int i = 0; i < VEC; ++i) dp[i] = dpp[i];
#pragma unroll
      for (int i = 0; i < H; ++i) {  // from lane + k, element i % VEC (sender chooses the chunk)
        const int k = 1 + i / VEC, e = i % VEC;
        const A v = __shfl_sync(0xffffffffu, lane >= k ? dpp[e] : dpc[e], (lane + k) & 31);
        dp[VEC + i] = i < W - 1 ? v : A(0);
      }
      const int64_t tp = t0 - kChunk;
      if (FAST || tp < tend) {
        A out[VEC];
        // dpre rows past the row's end (i + m >= lim) are never formed; only a
        // row's last chunk has such rows, and only it pays for the predicates
        const int lim = FAST || tp + VEC + H <= a.T ? VEC + H : int(a.T - tp);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          A v = A(0);
          // weight[W-1-m] * dpre(t + m), newest dpre first: bwd_tm's order, so
          // dx is bitwise the same in either layout (semantics section 6)
          if (lim == VEC + H) {
#pragma unroll
            for (int m = WMAX - 1; m >= 0; --m)
              if (m < W) v = fma(wr[m], dp[i + m], v);
          } else {
#pragma unroll
            for (int m = WMAX - 1; m >= 0; --m)
              if (m < W && i + m < lim) v = fma(wr[m], dp[i + m], v);
          }
          const int64_t t = tp + i;
          if (!FAST && a.dht.p && t >= a.T - a.S)
            v += ld<A>(a.dht.p, a.dht.dt, b * a.dht.s0 + d * a.dht.s1 + (a.S + t - a.T) * a.dht.s2);
          out[i] = v;
        }
        stp<T, VEC>(dxr + tp, P::make(out));
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      xp[i] = xc[i];
      dpp[i] = dpc[i];
    }
    // Refill the slot of the step before this one (its vectors were consumed
    // by that step's arithmetic, which precedes this copy in issue order).
    const int back = slot == 0 ? K - 1 : slot - 1;
    issue(step + K - 1, back);
    ++step;
    slot = slot + 1 == K ? 0 : slot + 1;
  };
  for (int64_t base = tb;; base += kChunk) {  // warp-uniform
    const bool own = base < tend;  // a chunk of the tile (else: the step after it)
    const bool fast = own && base > tb && base + kChunk <= tend && base + H <= a.T &&
                      (!a.dht.p || base <= a.T - a.S);
    if (fast) chunk_step(base, true, std::true_type{});
    else chunk_step(base, own, std::false_type{});
    if (!own) break;
  }
  if (!want_dw) return;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    db += __shfl_xor_sync(0xffffffffu, db, off);
#pragma unroll
    for (int j = 0; j < WMAX; ++j) dwr[j] += __shfl_xor_sync(0xffffffffu, dwr[j], off);
  }
  if (lane != 0) return;
  A* dst = part_at<A>(a, row / a.D * a.tiles_per_row + tile, d);
#pragma unroll
  for (int j = 0; j < WMAX; ++j)
    if (j < W) dst[W - 1 - j] = scale * dwr[j];
  dst[W] = scale * db;
}

// ---- general (W > 16, any strides) ----------------------------------------------

template <class A>
__device__ __forceinline__ A pre_at(const Args& a, const Seq& q, int64_t h0row, int64_t d,
                                    int64_t t) {  // t: token index within the sequence
  const int64_t p0 = a.S - (a.W - 1) + t;
  A acc = a.bias.p ? ld<A>(a.bias.p, a.bias.dt, d * a.bias.s0) : A(0);
  for (int k = 0; k < a.W; ++k)
    acc = fma(ld<A>(a.weight.p, a.weight.dt, d * a.weight.s0 + k * a.weight.s1),
              load_u<A>(a, q, h0row, d, p0 + k), acc);
  return acc;
}

// The precise math of accumulation type A (the general path and state_bwd;
// its scale is 1 for every activation).
template <class A>
using MathAcc = std::conditional_t<std::is_same_v<A, double>, MathF64, MathF32>;

// dpre of token t of sequence q (callers skip it when dy is absent).
template <class A>
__device__ __forceinline__ A dpre_at(const Args& a, const Seq& q, int64_t h0row, int64_t d,
                                     int64_t t) {
  const A g = ld<A>(a.dy.p, a.dy.dt, q.b * a.dy.s0 + (q.s + t) * a.dy.s1 + d * a.dy.s2);
  return RuntimeAct<MathAcc<A>>{a.act}.dgrad(g, pre_at<A>(a, q, h0row, d, t));
}

// dpre[(b*T + t) * D + d] for every token.
template <class A>
__global__ void __launch_bounds__(GeneralTraits::kThreads, GeneralTraits::kMinBlocksPerSm)
    dpre_general(const Args a) {
  int64_t tile, d, b, tb, te;
  if (!general_coords(a, &tile, &d, &b, &tb, &te)) return;
  A* dp = static_cast<A*>(a.dpre);
  for_each_segment(a, b, tb, te, [&](const Seq& q, int64_t n, int64_t t, int64_t e) {
    if (q.pad) return;  // (padding: no dpre is read)
    const int64_t h0row = h0_row_of(a, n);
    for (int64_t tok = t; tok < e; ++tok)
      dp[(q.b * a.T + tok) * a.D + d] = dpre_at<A>(a, q, h0row, d, tok - q.s);
  });
}

// Per (channel, tile): the dweight / dbias partial row, then dx.
template <class A>
__global__ void __launch_bounds__(GeneralTraits::kThreads, GeneralTraits::kMinBlocksPerSm)
    bwd_general(const Args a) {
  int64_t tile, d, b, tb, te;
  if (!general_coords(a, &tile, &d, &b, &tb, &te)) return;
  const bool want_dw = a.dweight.p || a.dbias.p;
  const A* dp = static_cast<const A*>(a.dpre);
  A* dst = want_dw ? part_at<A>(a, tile, d) : nullptr;
  // k == W: dbias; k < W: dweight[k]; then dx (k == W+1).
  for (int k = want_dw ? 0 : a.W + 1; k <= a.W + 1; ++k) {
    if (k == a.W + 1 && !a.dx.p) break;
    A acc = A(0);
    for_each_segment(a, b, tb, te, [&](const Seq& q, int64_t n, int64_t t, int64_t e) {
      if (q.pad) {  // a padding run of seq_idx: dx = 0, no partial
        for (int64_t tok = t; k == a.W + 1 && tok < e; ++tok)
          st<A>(a.dx.p, a.dx.dt, q.b * a.dx.s0 + tok * a.dx.s1 + d * a.dx.s2, A(0));
        return;
      }
      const int64_t send = q.s + q.L, rowoff = q.b * a.T;
      const int64_t h0row = h0_row_of(a, n), dhtrow = dht_row_of(a, n);
      for (int64_t tok = t; tok < e; ++tok) {
        if (k < a.W) {
          acc = fma(dp[(rowoff + tok) * a.D + d],
                      load_u<A>(a, q, h0row, d, a.S - (a.W - 1) + (tok - q.s) + k), acc);
        } else if (k == a.W) {
          acc += dp[(rowoff + tok) * a.D + d];
        } else {
          A v = A(0);
          for (int kk = 0; kk < a.W; ++kk) {
            const int64_t src = tok + (a.W - 1) - kk;
            if (src < send)
              v = fma(ld<A>(a.weight.p, a.weight.dt, d * a.weight.s0 + kk * a.weight.s1),
                      dp[(rowoff + src) * a.D + d], v);
          }
          if (dhtrow >= 0 && tok - q.s >= q.L - a.S)
            v += ld<A>(a.dht.p, a.dht.dt, dhtrow * a.dht.s0 + d * a.dht.s1 + (a.S + tok - q.s - q.L) * a.dht.s2);
          st<A>(a.dx.p, a.dx.dt, q.b * a.dx.s0 + tok * a.dx.s1 + d * a.dx.s2, v);
        }
      }
    });
    if (k <= a.W) dst[k] = acc;
  }
}

// ---- initial-state gradient ------------------------------------------------------------

// dh0 of sequence q (its h0 row, dht row; -1: none) for channel d into row
// `out` of dinitial_state: the dpre of its first W-1 tokens recomputed.
template <class A>
__device__ __forceinline__ void write_dh0(const Args& a, const Seq& q, int64_t h0row,
                                          int64_t dhtrow, int64_t out, int64_t d) {
  constexpr int kCache = SmallTraits::kDpreCache;
  const int64_t off = a.S - (a.W - 1);
  // tokens whose window reaches h0 (none without dy: no dpre term, semantics §2)
  const int64_t nd = !a.dy.p ? 0 : q.L < a.W - 1 ? q.L : a.W - 1;
  A cache[kCache];
#pragma unroll
  for (int t = 0; t < kCache; ++t) cache[t] = (t < nd) ? dpre_at<A>(a, q, h0row, d, t) : A(0);
  for (int64_t j = 0; j < a.S; ++j) {
    A du = A(0);
    if (j >= off) {
      const int64_t m = j - off;  // du[j] = sum_k weight[k] * dpre[m - k]
      for (int k = 0; k < a.W; ++k) {
        const int64_t t = m - k;
        if (t < 0 || t >= nd) continue;
        const A dpv = t < kCache ? cache[t] : dpre_at<A>(a, q, h0row, d, t);
        du = fma(ld<A>(a.weight.p, a.weight.dt, d * a.weight.s0 + k * a.weight.s1), dpv, du);
      }
    }
    if (dhtrow >= 0 && j >= q.L)
      du += ld<A>(a.dht.p, a.dht.dt, dhtrow * a.dht.s0 + d * a.dht.s1 + (j - q.L) * a.dht.s2);
    st<A>(a.dh0.p, a.dh0.dt, out * a.dh0.s0 + d * a.dh0.s1 + j * a.dh0.s2, du);
  }
}

template <class A>
__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    state_bwd(const Args a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.N * a.D) return;
  const int64_t n = i / a.D, d = i - n * a.D;
  write_dh0<A>(a, seq_of(a, n), h0_row_of(a, n), dht_row_of(a, n), n, d);
}

// seq_idx: every dinitial_state element 0 (rows of ids that do not occur keep
// it; state_bwd_ids then writes the rows of the runs, later on the stream).
template <class A>
__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    zero_dh0(const Args a) {
  const int64_t count = a.dh0.n0 * a.D * a.S;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % a.S, rd = i / a.S, d = rd % a.D, r = rd / a.D;
    st<A>(a.dh0.p, a.dh0.dt, r * a.dh0.s0 + d * a.dh0.s1 + j * a.dh0.s2, A(0));
  }
}

// seq_idx: dh0 of every real run into its id's row (state_fwd_ids' geometry:
// one ballot finds the runs starting in the block's tokens).  The run length
// is resolved up to max(S, W-1) tokens, all that dh0 reads of it.
template <class A>
__global__ void __launch_bounds__(IdStateTraits::kThreads, IdStateTraits::kMinBlocksPerSm)
    state_bwd_ids(const Args a) {
  const int lane = int(threadIdx.x & 31);
  const int64_t d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t g = int64_t(blockIdx.x) * IdStateTraits::kTokens + lane;
  const int64_t reach = a.S > a.W - 1 ? a.S : a.W - 1;
  int64_t id = -1, len = 0;
  if (g < a.B * a.T) {
    const int64_t b = g / a.T, t = g - b * a.T;
    id = sid_at(a, b, t);
    const bool start = t == 0 || sid_at(a, b, t - 1) != id;
    if (!start || id < 0 || id >= a.dh0.n0) id = -1;
    for (len = 1; id >= 0 && len < reach && t + len < a.T && sid_at(a, b, t + len) == id;) ++len;
  }
  for (unsigned m = __ballot_sync(0xffffffffu, id >= 0); m; m &= m - 1) {
    const int l = __ffs(m) - 1;
    const int64_t i = __shfl_sync(0xffffffffu, id, l), L = __shfl_sync(0xffffffffu, len, l);
    if (d >= a.D) continue;
    const int64_t gs = int64_t(blockIdx.x) * IdStateTraits::kTokens + l, b = gs / a.T;
    const Seq q{b, gs - b * a.T, L, 0, false};
    write_dh0<A>(a, q, a.h0.p && i < a.h0.n0 ? i : -1, dht_row_of(a, i), i, d);
  }
}

// ---- no dy -------------------------------------------------------------------------------

// Without dy there is no dpre term (semantics §2): dx is its dht term (the
// last S tokens of a sequence) or 0; dweight = dbias = 0 (reduce_parts over no
// partial rows) and dh0 the dht pass-through (state_bwd).  A grid-stride loop
// over (token, channel), consecutive threads on consecutive channels.
template <class A>
__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    dx_from_dht(const Args a) {
  const int64_t count = a.B * a.T * a.D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % a.D, bt = i / a.D, tok = bt % a.T, b = bt / a.T;
    A v = A(0);
    if (a.sid.p) {  // seq_idx: the run's end, if within S tokens (padding: 0)
      const int64_t id = sid_at(a, b, tok), row = id >= 0 ? dht_row_of(a, id) : -1;
      int64_t end = tok + 1;
      while (row >= 0 && end < a.T && end - tok <= a.S && sid_at(a, b, end) == id) ++end;
      if (row >= 0 && end - tok <= a.S)
        v = ld<A>(a.dht.p, a.dht.dt, row * a.dht.s0 + d * a.dht.s1 + (a.S + tok - end) * a.dht.s2);
    } else {
      const int64_t n = a.packed ? find_seq(a, tok) : b;
      const Seq q = seq_of(a, n);
      if (a.dht.p && tok - q.s >= q.L - a.S)
        v = ld<A>(a.dht.p, a.dht.dt, n * a.dht.s0 + d * a.dht.s1 + (a.S + tok - q.s - q.L) * a.dht.s2);
    }
    st<A>(a.dx.p, a.dx.dt, b * a.dx.s0 + tok * a.dx.s1 + d * a.dx.s2, v);
  }
}

// ---- deterministic reduction of the partials ---------------------------------------------

template <class A>
__global__ void __launch_bounds__(SmallTraits::kThreads, SmallTraits::kMinBlocksPerSm)
    reduce_parts(const Args a, int64_t parts) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t K = a.W + 1;
  if (i >= a.D * K) return;
  const int64_t d = i / K, k = i - d * K;
  const A* src = static_cast<const A*>(a.part);
  A s = A(0);
  for (int64_t r = 0; r < parts; ++r) s += src[r * a.D * K + i];  // fixed order
  if (k < a.W) {
    if (a.dweight.p) st<A>(a.dweight.p, a.dweight.dt, d * a.dweight.s0 + k * a.dweight.s1, s);
  } else if (a.dbias.p) {
    st<A>(a.dbias.p, a.dbias.dt, d * a.dbias.s0, s);
  }
}

// ---- launches -----------------------------------------------------------------------

// The backward's main kernels (dy present), for launch_path (dispatch.cuh).
struct BwdKernels {
  template <class T, int WMAX, int CH>
  static cudaError_t tm(const Plan& pl, const Args& a, Launch* l) {
    if constexpr (kHasFull<T, WMAX, CH>) {
      if (pl.full_bwd) return l->main("bwd_tm(vector, full window)", bwd_tm<T, WMAX, CH, true>, pl, a);
    }
    if constexpr (WMAX > kTmWideFullOnly && CH > 1) return l->no_instance("bwd_tm(vector, wide window, generic)");
    else return l->main(CH > 1 ? "bwd_tm(vector)" : "bwd_tm(scalar)", bwd_tm<T, WMAX, CH, false>, pl, a);
  }
  template <class T, int WMAX>
  static cudaError_t cm(const Plan& pl, const Args& a, Launch* l) {
    cudaError_t e = cudaSuccess;
    if (with_cm_full<WMAX>(a, [&](auto w) {
          e = l->main("bwd_cm(full window)", bwd_cm<T, decltype(w)::value, true>, pl, a);
        }))
      return e;
    return l->main("bwd_cm", bwd_cm<T, WMAX, false>, pl, a);
  }
  template <class A>
  static cudaError_t general(const Plan& pl, const Args& a, Launch* l) {
    const cudaError_t e = l->main("dpre_general", dpre_general<A>, pl, a);
    return e != cudaSuccess ? e : l->main("bwd_general", bwd_general<A>, pl, a);
  }
};

// dweight / dbias from `parts` partial rows, then dh0.
template <class A>
cudaError_t launch_rest(const Problem& p, int64_t parts, const Args& a, Launch* l) {
  if ((p.dweight || p.dbias) && p.D > 0) {
    const cudaError_t e = l->small("reduce_parts", reduce_parts<A>, p.D * (p.W + 1), a, parts);
    if (e != cudaSuccess) return e;
  }
  if (!p.dh0 || p.D == 0 || p.S == 0) return cudaSuccess;
  if (p.seq_idx) {
    const int64_t count = p.dh0.shape[0] * p.D * p.S;
    if (count == 0) return cudaSuccess;
    const cudaError_t e = l->small("zero_dh0", zero_dh0<A>,
                                   std::min<int64_t>(count, SmallTraits::kMaxGridThreads), a);
    if (e != cudaSuccess || p.B * p.T == 0) return e;
    return l->ids("state_bwd_ids", state_bwd_ids<A>, p.B * p.T, p.D, a);
  }
  if (p.N > 0) return l->small("state_bwd", state_bwd<A>, p.N * p.D, a);
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_bwd(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  return with_act_type(p.act_dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const int64_t tokens = p.B * p.T * p.D;
    if (!p.dy) {  // no dpre term anywhere: dx = dht terms, zero parameter gradients
      if (p.dx && tokens > 0) {
        const cudaError_t e = l->small("dx_from_dht", dx_from_dht<acc_t<T>>,
                                       std::min<int64_t>(tokens, SmallTraits::kMaxGridThreads), a);
        if (e != cudaSuccess) return e;
      }
      return launch_rest<acc_t<T>>(p, 0, a, l);
    }
    if ((p.dx || p.dweight || p.dbias) && pl.ntiles > 0 && p.D > 0) {
      const cudaError_t e = launch_path<BwdKernels, T>(pl, a, l);
      if (e != cudaSuccess) return e;
    }
    return launch_rest<acc_t<T>>(p, pl.parts, a, l);
  });
}

}  // namespace shortconv::cuda
