// CPU backend: the forward and backward tile kernels (see cpu_plan.hpp for
// the decomposition into tiles and pieces).  NO include guard: each per-ISA
// unit (cpu_isa_{v128,avx2,avx512}.cpp) includes this once inside that ISA's
// namespace, after cpu_simd.hpp.
//
// Math (docs/semantics.md), per channel d, sequence n, off = S-(W-1),
// u = h0 ++ x (so u[S+t] = x[t], and the W-1 entries before x[0] are the
// last W-1 entries of h0, copied into the workspace "halo"):
//
//   forward   pre[t] = bias + sum_k w[k] * x[t-(W-1)+k]        (x[<0] = halo)
//             y[t]   = act(pre[t]) + residual[t]
//   backward  dpre[t] = dy[t] * act'(pre[t])                 (no dy: no dpre terms)
//             dx[t]   = sum_k w[k] * dpre[t+W-1-k]  (k with t+W-1-k < L only)
//                       + (S+t >= L ? dht[S+t-L] : 0)        -- a GATHER over dpre
//             dh0[j]  = sum_k w[k] * dpre[j-off-k]  (0 <= j-off-k < L)
//                       + (j >= L ? dht[j-L] : 0)
//             dweight[k] += dpre[t] * x[t-(W-1)+k],  dbias += dpre[t]
//
// Ownership: a piece (n, [tb, te)) of a tile writes y[tb..te) (forward) or
// dx[tb..te) (backward) for the tile's channels, and dh0 of sequence n when
// tb == 0 (the piece that starts the sequence; it alone computes dpre[0..W-2]
// with its own halo).  A backward piece recomputes pre/dpre for the rows
// after te that its dx needs (at most W-1, never past the sequence end) and
// writes no output for them, so any tile_t >= 1 gives the same sums.
//
// Loop order: time rows outside, vectors of L channels inside, so each tile
// row is one contiguous run per tensor and every cache line is consumed once.
// The last W inputs (and, backward, the last W dpre) of every channel of the
// tile sit in a ring (stack, or workspace when large), VECTOR-MAJOR like the
// packed weights, so the inner loop needs one pointer per array:
//   wb   [Dp/L][W+1][L]   weight taps 0..W-1, then bias     (workspace)
//   ring [tile_d/L][R*W][L]  x window slots, (backward) then dpre slots
//   part [tile_d/L][W+1][L]  backward partial dweight taps, then dbias
// The slot of time position q is (q - tb + W - 1) mod W.  WT > 0 fixes W at
// compile time (W <= 4) and the rows are unrolled in groups of W, so every
// slot offset is a constant.  Sums over taps have one order on every path:
// the forward's bias first, then k increasing (oldest input first); dx and
// dh0 from zero, k decreasing (oldest dpre row first: the row being computed
// is then the last term, so its long chain -- exp, division -- joins only the
// final fma).

// Prefetch the element kPrefetchRows rows ahead in the same column: a tile
// row is only tile_d channels wide, and with row strides of >= 4 KiB every
// row starts a new page, where the hardware prefetchers stop.  Ahead() is
// the row kPrefetchRows below `row` (an address only: it may lie past the
// tensor, prefetches never fault), computed once per row so that the vector
// loop holds one pointer per stream.
constexpr int64_t kPrefetchRows = 6;
template <class XT>
inline const char* ahead(const XT* row, int64_t row_stride) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row) +
                                       uintptr_t(kPrefetchRows * row_stride) * sizeof(XT));
}
template <class XT>
inline void prefetch(const char* ahead_row, int64_t j, int write) {
  const char* a = ahead_row + uintptr_t(j) * sizeof(XT);
  if (write) __builtin_prefetch(a, 1, 3);
  else __builtin_prefetch(a, 0, 3);
}

// ring slot + k, modulo W (slot < W, k < W)
constexpr int ring_slot(int slot, int k, int W) {
  const int s = slot + k;
  return s >= W ? s - W : s;
}

// Calls row(t, base) for t in [tb, te), base = (t - tb) mod W; for WT > 0 the
// base is a compile-time constant (rows unrolled in groups of WT).
template <int WT, class F>
inline void for_rows(int64_t tb, int64_t te, int W, F&& row) {
  if constexpr (WT > 0) {
    for (int64_t t0 = tb; t0 < te; t0 += WT)
      [&]<int... I>(std::integer_sequence<int, I...>) {
        (void)((t0 + I < te ? (row(t0 + I, std::integral_constant<int, I>{}), true) : false) && ...);
      }(std::make_integer_sequence<int, WT>{});
  } else {
    for (int64_t t = tb; t < te; ++t) row(t, int((t - tb) % W));
  }
}

// Fills ring slots 0..W-2 with x[tb-(W-1) .. tb-1] (halo / zeros before 0).
// ring stride per vector: R*W*L (R = rings per vector).
template <class O, int WT, class XT>
inline void fill_x_ring(const Ctx& c, int64_t n, int64_t tb, int64_t d0, int64_t d1,
                        typename O::A* ring, int R) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int64_t Dp = c.plan->Dp;
  const int64_t hrow = c.seqs.row(n);  // the halo of sequence n (seq_idx: of its id's row)
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + hrow * (W - 1) * Dp : nullptr;  // [W-1][Dp]
  const XT* x = p.x.ptr<const XT>() + c.seqs.base(p.x, n);  // x: rows of sequence n
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  for (int i = 0; i < W - 1; ++i) {  // position tb-(W-1)+i goes to slot i
    const int64_t pos = tb - (W - 1) + i;
    for (int64_t j = 0, v = 0; j < d1 - d0; j += L, ++v) {
      const int nl = int(std::min<int64_t>(L, d1 - d0 - j));
      const V u = pos >= 0 ? load_lanes<O>(x + pos * xst + (d0 + j) * xsd, xsd, nl)
                           : (halo ? O::load(halo + (W - 1 + pos) * Dp + d0 + j) : O::zero());
      O::store(ring + (v * R * W + i) * L, u);
    }
  }
}

// A tile row's full vectors in passes instead of one loop: the forward's
// sums into an L1 buffer, then the activation, then (16-bit y) the rounding;
// the backward's sums into the dpre ring, then dpre, then the partials and
// the dx gather (the time-vectorised kernels likewise: cpu_kernels_time.hpp).
// Every operation and its order stay the same, so the bits do too.  Why:
// in one loop each vector is one dependency chain of ~80 cycles (4 taps,
// the exp, the division, the bf16 rounding) and ~40 vector operations, so the out-of-order scheduler holds only 2-3 vectors and the
// loop runs at the chain's latency, not the pipes' rate: the AVX2 bf16
// forward took the same 28 cycles per 8 lanes from L2 as from memory (AMD
// Zen 2, 3.35 GHz).  Shorter chains overlap further (SiLU then the rounding,
// 8 lanes from L1: 18.4 cycles in one loop, 12.5 in two).  Measured from L2
// (1x64x1024, one thread) on that machine, forward / backward:
//   AVX2  bf16 76.6 -> 55.2 / 184 -> 134 us,  fp32 66.1 -> 61.8 / 165 -> 131
//   v128  bf16 185 -> 130 / 500 -> 337 us,    fp32 forward 147 -> 173 in two
//         passes: kept in one; backward 344 -> 295
//   channel-major, AVX2: bf16 103 -> 74 / 206 -> 192 us, fp32 91 -> 78 / 197
// Tried and not kept: dx rounded in a pass of its own (2% slower).  AVX-512
// keeps one loop: not measured (that machine had no AVX-512).
template <class A, class XT>
struct RowPasses {
  static constexpr bool kFloat = std::is_same_v<A, float>;  // (fp64 not measured)
  // the forward of an activation other than the identity: sums, then y
  static constexpr bool kFwd = kFloat && (SC_ISA == 1 || (SC_ISA == 0 && sizeof(XT) == 2));
  // ... and a 16-bit y rounded in a third pass
  static constexpr bool kRoundPass = kFwd && sizeof(XT) == 2;
  // the backward's rows with every term (dy, partials, a dx row, no dht):
  // sums, dpre, then partials and dx
  static constexpr bool kBwd = kFloat && SC_ISA != 2;
  // the forward's row buffer, A elements on the stack: rows of wider
  // (forced) tiles take one loop
  static constexpr int64_t kMaxRow = Tiling::kAutoTileD;
};

template <class O, int WT, class XT, class Act>
void fwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t d0, int64_t d1,
               typename O::A* ring) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const A* wb = static_cast<const A*>(c.wT) + d0 * (W + 1);  // [Dp/L][W+1][L], from channel d0
  // x, residual, y: [B, T, D] views; *_ point at (token 0 of sequence n, channel d0)
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* x_ = p.x.ptr<const XT>() + c.seqs.base(p.x, n) + d0 * xsd;
  const int64_t yst = p.y.stride[1], ysd = p.y.stride[2];
  XT* y_ = p.y.ptr<XT>() + c.seqs.base(p.y, n) + d0 * ysd;
  const int64_t rst = p.residual.stride[1], rsd = p.residual.stride[2];
  const XT* res_ = p.residual ? p.residual.ptr<const XT>() + c.seqs.base(p.residual, n) + d0 * rsd : nullptr;
  const int64_t nd = d1 - d0;
  const bool contig = xsd == 1 && ysd == 1 && (!res_ || rsd == 1);
  const int64_t nfull = contig ? nd / L * L : 0;  // channels done by the full-vector loop

  fill_x_ring<O, WT, XT>(c, n, tb, d0, d1, ring, 1);  // ring: [td/L][W][L]
  for_rows<WT>(tb, te, W, [&](int64_t t, auto base_) {
    const int base = int(base_);                 // slot of position t-(W-1)
    const int cur = ring_slot(base, W - 1, W);   // slot of position t
    const XT* xr = x_ + t * xst;
    XT* yr = y_ + t * yst;
    const XT* rr = res_ ? res_ + t * rst : nullptr;
    // one vector: v-th of the tile, channels j..j+nl
    // the sums of one vector (taps wv, ring rv; x row vector xv), xv into the ring
    auto sums = [&](const A* wv, A* rv, V xv) {
      V acc = O::load(wv + W * L);  // bias
      for (int k = 0; k < W - 1; ++k)
        acc = O::fma(O::load(wv + k * L), O::load(rv + ring_slot(base, k, W) * L), acc);
      acc = O::fma(O::load(wv + (W - 1) * L), xv, acc);
      O::store(rv + cur * L, xv);
      return acc;
    };
    auto vec = [&](int64_t j, int nl, const A* wv, A* rv, auto full, auto res) {
      V xv;
      if constexpr (decltype(full)::value) {
        xv = O::load_x(xr + j);
      } else {
        xv = load_lanes<O>(xr + j * xsd, xsd, nl);
      }
      V out = Act::template value<O>(sums(wv, rv, xv));
      if constexpr (decltype(full)::value) {
        if constexpr (decltype(res)::value) out = out + O::load_x(rr + j);
        O::store_x(yr + j, out);
      } else {
        if (rr) out = out + load_lanes<O>(rr + j * rsd, rsd, nl);
        store_lanes<O>(yr + j * ysd, ysd, nl, out);
      }
    };
    const A* wv = wb;
    A* rv = ring;
    int64_t j = 0;
    // The full vectors, with the residual's presence a constant of the loop.
    // Prefetches past the piece's last row are harmless (they never fault)
    // and mostly useful: the next chunk's rows.
    // (The residual is a third stream of the same shape: without its own
    // prefetch the forward with one took 15.0 ms against 6.4 without, bf16
    // 4x4096x2048 on the 2-core Sapphire Rapids VM.)
    auto full_vectors = [&](auto res) {
      const char *xa = ahead(xr, xst), *ya = ahead(yr, yst);
      const char* ra = decltype(res)::value ? ahead(rr, rst) : nullptr;
      for (const int64_t jn = nfull; j < jn; j += L, wv += (W + 1) * L, rv += W * L) {
        prefetch<XT>(xa, j, 0);
        prefetch<XT>(ya, j, 1);
        if constexpr (decltype(res)::value) prefetch<XT>(ra, j, 0);
        vec(j, L, wv, rv, std::true_type{}, res);
      }
    };
    // in passes (RowPasses), the residual's presence a constant of the loops
    auto in_passes = [&](auto res) {
      constexpr bool R = decltype(res)::value, kRound = RowPasses<A, XT>::kRoundPass;
      alignas(64) A pre[RowPasses<A, XT>::kMaxRow];
      const char *xa = ahead(xr, xst), *ya = ahead(yr, yst), *ra = R ? ahead(rr, rst) : nullptr;
      for (; j < nfull; j += L, wv += (W + 1) * L, rv += W * L) {
        prefetch<XT>(xa, j, 0);
        prefetch<XT>(ya, j, 1);
        if constexpr (R) prefetch<XT>(ra, j, 0);
        O::store(pre + j, sums(wv, rv, O::load_x(xr + j)));
      }
      for (int64_t i = 0; i < nfull; i += L) {
        V out = Act::template value<O>(O::load(pre + i));
        if constexpr (R) out = out + O::load_x(rr + i);
        if constexpr (kRound) O::store(pre + i, out);
        else O::store_x(yr + i, out);
      }
      if constexpr (kRound)
        for (int64_t i = 0; i < nfull; i += L) O::store_x(yr + i, O::load(pre + i));
    };
    if constexpr (RowPasses<A, XT>::kFwd && Act::kId != SC_ACT_NONE) {
      if (nfull > 0 && nfull <= RowPasses<A, XT>::kMaxRow) {
        if (rr) in_passes(std::true_type{});
        else in_passes(std::false_type{});
      }
    }
    if (rr) full_vectors(std::true_type{});
    else full_vectors(std::false_type{});
    for (; j < nd; j += L, wv += (W + 1) * L, rv += W * L)
      vec(j, int(std::min<int64_t>(L, nd - j)), wv, rv, std::false_type{}, std::false_type{});
  });
}

// The W taps and the W window entries u(k) = x[r-(W-1)+k] of one channel
// vector at row r: in registers when W is a compile-time constant (WT > 0),
// read from wv / the ring otherwise.  u(W-1) is row r itself, xv.
template <class O, int WT>
struct Window {
  using V = typename O::V;
  using A = typename O::A;
  static constexpr int L = O::L;
  const A* wv;
  const A* rv;
  int base, W;
  V xv;
  V w[WT ? WT : 1], u[WT ? WT : 1];

  Window(const A* wv_, const A* rv_, int base_, int W_, V xv_)
      : wv(wv_), rv(rv_), base(base_), W(W_), xv(xv_) {
    if constexpr (WT > 0) {
      for (int k = 0; k < W; ++k) w[k] = O::load(wv + k * L);
      for (int k = 0; k < W - 1; ++k) u[k] = O::load(rv + ring_slot(base, k, W) * L);
      u[W - 1] = xv;
    }
  }
  V wk(int k) const {
    if constexpr (WT > 0) return w[k]; else return O::load(wv + k * L);
  }
  V uk(int k) const {
    if constexpr (WT > 0) return u[k];
    else return k == W - 1 ? xv : O::load(rv + ring_slot(base, k, W) * L);
  }
};

// The GATHER of the header for one channel vector of dx[r-(W-1)]:
//   sum over the taps k in [k0, W) of w(k) * dpre(k),  dpre(k) = dpre[r-k],
//   k decreasing.
// Terms outside the sum are never formed: the caller starts at k0 > 0 where
// rows r-k lie past the sequence end (a NaN / inf weight must not meet a zero
// that is not there), and without dy there are no dpre terms at all
// (semantics §2).  The hot loop and the sequence's last rows both use it;
// each adds the dht term itself.
template <class O, class WK, class GK>
inline typename O::V gather_dx(int W, int k0, bool has_dy, WK&& w, GK&& dpre) {
  typename O::V acc = O::zero();
  for (int k = W - 1; k >= k0 && has_dy; --k) acc = O::fma(w(k), dpre(k), acc);
  return acc;
}

// dh0 of the piece that starts sequence n (row `row` of dht / dh0), channels [d0, d0+nd):
// dh0[jj] = sum_k w[k] dpre[jj-off-k] over the dpre rows 0 <= t < nh (still
// in the ring; none without dy, semantics §2) + dht[jj-Ln] where jj >= Ln.
template <class O, int WT>
void bwd_store_dh0(const Problem& p, int64_t row, int64_t Ln, int64_t nh, int64_t d0, int64_t nd,
                   const typename O::A* wb, const typename O::A* ring) {
  using V = typename O::V;
  constexpr int L = O::L;
  const int W = WT ? WT : p.W, S = p.S, off = S - (W - 1);
  const bool has_dy = bool(p.dy), has_dht = bool(p.dht);
  for (int64_t j = 0, v = 0; j < nd; j += L, ++v) {
    const int nl = int(std::min<int64_t>(L, nd - j));
    const auto* wv = wb + v * (W + 1) * L;
    const auto* gv = ring + (v * 2 * W + W) * L;
    for (int jj = 0; jj < S; ++jj) {
      V acc = O::zero();
      for (int k = W - 1; k >= 0 && has_dy; --k) {  // oldest dpre row first
        const int64_t t = int64_t(jj) - off - k;
        if (t >= 0 && t < nh)
          acc = O::fma(O::load(wv + k * L), O::load(gv + ring_slot(int(t), W - 1, W) * L), acc);
      }
      if (has_dht && jj >= Ln) acc = acc + load_state_lanes<O>(p.dht, row, d0 + j, jj - Ln, nl);
      store_state_lanes<O>(p.dh0, row, d0 + j, jj, nl, acc);
    }
  }
}

// The dx rows t_out in [tb, te) whose gather row r = t_out+W-1 lies past the
// sequence end (r >= rend = Ln): only the taps k >= r-Ln+1, whose dpre rows
// exist, take part.  dx_: at (token 0 of sequence n, channel d0); row: its dht row.
template <class O, int WT, class XT>
void bwd_dx_tail(const Problem& p, int64_t row, int64_t tb, int64_t te, int64_t Ln, int64_t rend,
                 int64_t d0, int64_t nd, const typename O::A* wb, const typename O::A* ring,
                 XT* dx_) {
  using V = typename O::V;
  constexpr int L = O::L;
  const int W = WT ? WT : p.W, S = p.S;
  const int64_t dxst = p.dx.stride[1], dxsd = p.dx.stride[2];
  const bool has_dy = bool(p.dy), has_dht = bool(p.dht);
  for (int64_t r = std::max(rend, tb + W - 1); r < te + W - 1; ++r) {
    const int base = int((r - tb) % W);
    const int64_t t_out = r - (W - 1);
    for (int64_t j = 0, v = 0; j < nd; j += L, ++v) {
      const int nl = int(std::min<int64_t>(L, nd - j));
      const auto* wv = wb + v * (W + 1) * L;
      const auto* gv = ring + (v * 2 * W + W) * L;
      auto wk = [&](int k) { return O::load(wv + k * L); };
      auto dpre = [&](int k) { return O::load(gv + ring_slot(base, W - 1 - k, W) * L); };
      V acc = gather_dx<O>(W, int(r - Ln + 1), has_dy, wk, dpre);
      if (has_dht && S + t_out >= Ln) acc = acc + load_state_lanes<O>(p.dht, row, d0 + j, S + t_out - Ln, nl);
      store_lanes<O>(dx_ + t_out * dxst + j * dxsd, dxsd, nl, acc);
    }
  }
}

// A backward piece: rows [tb, rend) compute dpre into the ring, add the
// dweight / dbias partials of the rows < te and complete dx[r-(W-1)] (the
// hot loop); then the dx rows whose gather reaches past the sequence end
// (bwd_dx_tail), and dh0 once the first piece holds dpre rows 0..nh-1.
template <class O, int WT, class XT, class Act>
void bwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t Ln, int64_t d0,
               int64_t d1, typename O::A* part, typename O::A* ring) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W, S = p.S;
  const A* wb = static_cast<const A*>(c.wT) + d0 * (W + 1);  // [Dp/L][W+1][L], from channel d0
  // x, dy, dx: [B, T, D] views; *_ point at (token 0 of sequence n, channel d0)
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* x_ = p.x.ptr<const XT>() + c.seqs.base(p.x, n) + d0 * xsd;
  const int64_t gst = p.dy.stride[1], gsd = p.dy.stride[2];
  const XT* dy_ = p.dy ? p.dy.ptr<const XT>() + c.seqs.base(p.dy, n) + d0 * gsd : nullptr;
  const int64_t dxst = p.dx.stride[1], dxsd = p.dx.stride[2];
  XT* dx_ = p.dx ? p.dx.ptr<XT>() + c.seqs.base(p.dx, n) + d0 * dxsd : nullptr;
  const int64_t row = c.seqs.row(n);  // of dht / dh0
  const bool want_dh0 = p.dh0 && tb == 0, has_dht = bool(p.dht);
  const int64_t nd = d1 - d0, nh = std::min<int64_t>(W - 1, Ln);  // nh: dpre rows that reach h0
  // Rows whose dpre is needed: the piece, W-1 rows of look-ahead for dx, and
  // (first piece) the rows that reach h0.
  const int64_t rend = dx_ ? std::min<int64_t>(te + W - 1, Ln) : std::max(te, want_dh0 ? nh : 0);
  const int RW = 2 * W;  // ring per vector: [x slots W][dpre slots W][L]
  const bool contig = xsd == 1 && (!dy_ || gsd == 1) && (!dx_ || dxsd == 1);
  const int64_t nfull = contig ? nd / L * L : 0;

  fill_x_ring<O, WT, XT>(c, n, tb, d0, d1, ring, 2);  // ring: [td/L][2W][L]
  if (want_dh0 && nh == 0) bwd_store_dh0<O, WT>(p, row, Ln, nh, d0, nd, wb, ring);
  for_rows<WT>(tb, rend, W, [&](int64_t r, auto base_) {
    const int base = int(base_);                 // slot of position r-(W-1)
    const int cur = ring_slot(base, W - 1, W);   // slot of position r
    const XT* xr = x_ + r * xst;
    const XT* gr = dy_ ? dy_ + r * gst : nullptr;
    const int64_t t_out = r - (W - 1);            // the dx row this row completes
    XT* dxr = dx_ && t_out >= tb ? dx_ + t_out * dxst : nullptr;
    const bool dht_row = has_dht && S + t_out >= Ln;
    A* pw = part && r < te ? part : nullptr;      // dweight/dbias of rows in the piece
    // One vector.  HOT: a row of the piece's interior with everything the
    // common call has (dy, partials, a dx row, no dht term): the checks
    // below are then constants, out of the loop.
    auto vec = [&](int64_t j, int nl, const A* wv, A* rv, A* pv, auto full, auto hot) {
      constexpr bool F = decltype(full)::value, HOT = decltype(hot)::value;
      V xv;
      if constexpr (F) xv = O::load_x(xr + j); else xv = load_lanes<O>(xr + j * xsd, xsd, nl);
      const Window<O, WT> win(wv, rv, base, W, xv);
      O::store(rv + cur * L, xv);
      V dp = O::zero();
      if (HOT || gr) {
        V acc = O::load(wv + W * L);  // bias
        for (int k = 0; k < W; ++k) acc = O::fma(win.wk(k), win.uk(k), acc);
        V gy;
        if constexpr (F) gy = O::load_x(gr + j); else gy = load_lanes<O>(gr + j * gsd, gsd, nl);
        dp = Act::template dgrad<O>(gy, acc);
      }
      A* gv = rv + W * L;  // dpre slots
      O::store(gv + cur * L, dp);
      if (HOT || (pv && gr)) {  // [W+1][L]: dweight taps, then dbias (no dy: no terms)
        for (int k = 0; k < W; ++k) O::store(pv + k * L, O::fma(dp, win.uk(k), O::load(pv + k * L)));
        O::store(pv + W * L, O::load(pv + W * L) + dp);
      }
      if (HOT || dxr) {  // every dpre row r-k of the gather exists (r < rend <= Ln); k = 0 is this row
        auto wk = [&](int k) { return win.wk(k); };
        auto dpre = [&](int k) { return k == 0 ? dp : O::load(gv + ring_slot(base, W - 1 - k, W) * L); };
        V acc = gather_dx<O>(W, 0, HOT || gr != nullptr, wk, dpre);
        if (!HOT && dht_row) acc = acc + load_state_lanes<O>(p.dht, row, d0 + j, S + t_out - Ln, nl);
        if constexpr (F) O::store_x(dxr + j, acc); else store_lanes<O>(dxr + j * dxsd, dxsd, nl, acc);
      }
    };
    const A* wv = wb;
    A* rv = ring;
    A* pv = pw;
    const int64_t pstep = pw ? (W + 1) * L : 0;
    int64_t j = 0;
    // Prefetches past the piece's rows are harmless (they never fault).
    auto full_vectors = [&](auto hot) {
      constexpr bool HOT = decltype(hot)::value;
      const char *xa = ahead(xr, xst), *ga = ahead(gr, gst), *dxa = ahead(dxr, dxst);
      for (const int64_t jn = nfull; j < jn; j += L, wv += (W + 1) * L, rv += RW * L, pv += pstep) {
        prefetch<XT>(xa, j, 0);
        if (HOT || gr) prefetch<XT>(ga, j, 0);
        if (HOT || dxr) prefetch<XT>(dxa, j, 1);
        vec(j, L, wv, rv, pv, std::true_type{}, hot);
      }
    };
    const bool hot_row = gr && pw && dxr && !dht_row;
    if constexpr (RowPasses<A, XT>::kBwd) {
      if (hot_row && nfull > 0) {  // in passes (RowPasses)
        // 1: the window into the ring, the sums into the dpre slots
        const char *xa = ahead(xr, xst), *ga = ahead(gr, gst);
        const A* wv1 = wv;
        A* rv1 = rv;
        for (int64_t i = 0; i < nfull; i += L, wv1 += (W + 1) * L, rv1 += RW * L) {
          prefetch<XT>(xa, i, 0);
          prefetch<XT>(ga, i, 0);
          const V xv = O::load_x(xr + i);
          const Window<O, WT> win(wv1, rv1, base, W, xv);
          O::store(rv1 + cur * L, xv);
          V acc = O::load(wv1 + W * L);  // bias
          for (int k = 0; k < W; ++k) acc = O::fma(win.wk(k), win.uk(k), acc);
          O::store(rv1 + (W + cur) * L, acc);  // (the sums: dpre below)
        }
        {  // 2: dpre in place of the sums
          A* gv1 = rv + (W + cur) * L;
          for (int64_t i = 0; i < nfull; i += L, gv1 += RW * L)
            O::store(gv1, Act::template dgrad<O>(O::load_x(gr + i), O::load(gv1)));
        }
        // 3: the partials and the dx gather, as `vec` does them, from the ring
        const char* dxa = ahead(dxr, dxst);
        for (const int64_t jn = nfull; j < jn; j += L, wv += (W + 1) * L, rv += RW * L, pv += pstep) {
          prefetch<XT>(dxa, j, 1);
          const Window<O, WT> win(wv, rv, base, W, O::load(rv + cur * L));
          const A* gv = rv + W * L;  // dpre slots
          const V dp = O::load(gv + cur * L);
          for (int k = 0; k < W; ++k) O::store(pv + k * L, O::fma(dp, win.uk(k), O::load(pv + k * L)));
          O::store(pv + W * L, O::load(pv + W * L) + dp);
          auto wk = [&](int k) { return win.wk(k); };
          auto dpre = [&](int k) { return k == 0 ? dp : O::load(gv + ring_slot(base, W - 1 - k, W) * L); };
          O::store_x(dxr + j, gather_dx<O>(W, 0, true, wk, dpre));
        }
      }
    }
    if (hot_row) full_vectors(std::true_type{});
    else full_vectors(std::false_type{});
    for (; j < nd; j += L, wv += (W + 1) * L, rv += RW * L, pv += pstep)
      vec(j, int(std::min<int64_t>(L, nd - j)), wv, rv, pv, std::false_type{}, std::false_type{});
    if (want_dh0 && r == nh - 1) bwd_store_dh0<O, WT>(p, row, Ln, nh, d0, nd, wb, ring);
  });
  if (dx_) bwd_dx_tail<O, WT>(p, row, tb, te, Ln, rend, d0, nd, wb, ring, dx_);
}

// Rows [tb, te) x channels [d0, d1) of activation output v, from element
// offset `base` (token 0 of a sequence), set to +0: a padding run's y or dx.
template <class O, class XT>
void zero_rows(const View& v, int64_t base, int64_t tb, int64_t te, int64_t d0, int64_t d1) {
  constexpr int L = O::L;
  const int64_t st = v.stride[1], sd = v.stride[2];
  XT* p = v.ptr<XT>() + base + d0 * sd;
  for (int64_t t = tb; t < te; ++t)
    for (int64_t j = 0; j < d1 - d0; j += L)
      store_lanes<O>(p + t * st + j * sd, sd, int(std::min<int64_t>(L, d1 - d0 - j)), O::zero());
}

#include "cpu/cpu_kernels_time.hpp"

// Rings (or the time-vectorised kernels' staging buffers) of a tile: on the
// stack when they fit, else the tile's workspace slot.
template <class A>
struct Rings {
  alignas(64) A stack[Tiling::kStackRingBytes / sizeof(A)];
  A* get(const Ctx& c, int64_t tile) {
    return c.plan->ws_scratch ? static_cast<A*>(c.scr) + tile * c.plan->ring_elems : stack;
  }
};

// The CPU evaluates every activation on the unscaled pre-activation.
template <class O, class Act>
constexpr bool unscaled() { return Act::template scale<O>() == 1.f; }

// Forward task `task`: chunk_group consecutive chunks of one d-tile (one chunk,
// task = tile, unless the plan groups them for the time-vectorised kernels),
// as pieces of whole sequences within them (the forward has no per-tile sums).
template <class O, int WT, class XT, class Act>
void fwd_tile(const Ctx& c, int64_t task) {
  static_assert(unscaled<O, Act>(), "the CPU kernels do not pre-scale weights");
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk = task / pl.n_dtiles * pl.chunk_group, dt = task % pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  Rings<typename O::A> rings;
  typename O::A* ring = rings.get(c, chunk * pl.n_dtiles + dt);  // (its first tile's slot)
  const bool tv = time_vectorised(p);
  const int64_t g0 = chunk * pl.tile_t, g1 = std::min(g0 + pl.chunk_group * pl.tile_t, pl.total);
  for_each_piece_in(c.seqs, g0, g1, [&](int64_t n, int64_t tb, int64_t te, int64_t) {
    if (c.seqs.pad(n))  // a padding run of seq_idx: y = 0
      zero_rows<O, XT>(p.y, c.seqs.base(p.y, n), tb, te, d0, d1);
    else if (tv)
      fwd_piece_time<O, WT, XT, Act>(c, n, tb, te, d0, d1, ring);
    else
      fwd_piece<O, WT, XT, Act>(c, n, tb, te, d0, d1, ring);
  });
}

// Tree drafts (parent_tokens, semantics section 5): token t of sequence n
// reads its chain of parents, then the state, instead of the W-1 positions
// before it.  One task = (sequence n, d-tile) = task / n_dtiles, task %
// n_dtiles, every token of the sequence; the chain's u positions go into the
// task's workspace slot (oldest tap first).  The arithmetic is fwd_piece's in
// fwd_piece's order (bias, taps 0..W-2, the token itself), so a chain of
// parents t-1 gives fwd_piece's bits.  u positions below s (s = S, or W-1
// with num_accepted) come from the halo, which holds u[s-(W-1) .. s).
template <class O, class XT, class Act>
void tree_task(const Ctx& c, int64_t task) {
  static_assert(unscaled<O, Act>(), "the CPU kernels do not pre-scale weights");
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int W = p.W;
  const int64_t n = task / pl.n_dtiles, dt = task % pl.n_dtiles, Dp = pl.Dp;
  const int64_t d0 = dt * pl.tile_d, nd = std::min(d0 + pl.tile_d, p.D) - d0;
  const int64_t s = p.accepted ? W - 1 : p.S, Ln = c.seqs.len(n);
  const A* wb = static_cast<const A*>(c.wT) + d0 * (W + 1);  // [Dp/L][W+1][L], from channel d0
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + n * (W - 1) * Dp + d0 : nullptr;
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* x_ = p.x.ptr<const XT>() + c.seqs.base(p.x, n) + d0 * xsd;
  const int64_t yst = p.y.stride[1], ysd = p.y.stride[2];
  XT* y_ = p.y.ptr<XT>() + c.seqs.base(p.y, n) + d0 * ysd;
  const int64_t rst = p.residual.stride[1], rsd = p.residual.stride[2];
  const XT* res_ = p.residual ? p.residual.ptr<const XT>() + c.seqs.base(p.residual, n) + d0 * rsd : nullptr;
  int64_t* q = c.chains + task * W;  // q[k]: the u position tap k reads
  for (int64_t t = 0; t < Ln; ++t) {
    int64_t pos = s + t;
    for (int k = W - 1; k >= 0; --k) {
      q[k] = pos;
      pos = pos - s >= 1 ? s + p.parent(n, pos - s) : pos - 1;
    }
    for (int64_t j = 0; j < nd; j += L) {
      const int nl = int(std::min<int64_t>(L, nd - j));
      const A* wv = wb + (j / L) * (W + 1) * L;
      auto u = [&](int64_t at) {  // u[at] of channels j..j+nl
        if (at >= s) return load_lanes<O>(x_ + (at - s) * xst + j * xsd, xsd, nl);
        return halo ? O::load(halo + (at - (s - (W - 1))) * Dp + j) : O::zero();
      };
      V acc = O::load(wv + W * L);  // bias
      for (int k = 0; k < W - 1; ++k) acc = O::fma(O::load(wv + k * L), u(q[k]), acc);
      acc = O::fma(O::load(wv + (W - 1) * L), u(q[W - 1]), acc);
      V out = Act::template value<O>(acc);
      if (res_) out = out + load_lanes<O>(res_ + t * rst + j * rsd, rsd, nl);
      store_lanes<O>(y_ + t * yst + j * ysd, ysd, nl, out);
    }
  }
}

#include "cpu/cpu_kernels_decode.hpp"

// Backward task `task`: chunk_group consecutive chunks of one d-tile (see
// fwd_tile).  Each chunk's tile keeps its own partial row and pieces; with
// several chunks (time-vectorised only) the task walks channel by channel
// through all of them, each channel's pieces in time order, so every partial
// entry gets the same terms in the same order as one chunk at a time.
template <class O, int WT, class XT, class Act>
void bwd_tile(const Ctx& c, int64_t task) {
  static_assert(unscaled<O, Act>(), "the CPU kernels do not pre-scale weights");
  using A = typename O::A;
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk0 = task / pl.n_dtiles * pl.chunk_group, dt = task % pl.n_dtiles;
  const int64_t chunk1 = std::min(chunk0 + pl.chunk_group, pl.n_chunks);
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  // tile (chunk, dt)'s [tile_d/L][W+1][L] partial dweight / dbias, zeroed first
  auto part_of = [&](int64_t chunk) -> A* {
    return c.part ? static_cast<A*>(c.part) + (chunk * pl.n_dtiles + dt) * (p.W + 1) * pl.tile_d
                  : nullptr;
  };
  for (int64_t ch = chunk0; ch < chunk1; ++ch)
    if (A* part = part_of(ch)) std::fill(part, part + (p.W + 1) * pl.tile_d, A(0));
  Rings<A> rings;
  A* ring = rings.get(c, chunk0 * pl.n_dtiles + dt);  // (its first tile's slot)
  const bool tv = time_vectorised(p);
  auto pad = [&](int64_t n, int64_t tb, int64_t te) {  // a padding run of seq_idx: dx = 0, no other term
    if (p.dx) zero_rows<O, XT>(p.dx, c.seqs.base(p.dx, n), tb, te, d0, d1);
  };
  if (tv && chunk1 - chunk0 > 1) {
    for (int64_t ch = chunk0; ch < chunk1; ++ch)
      for_each_piece(c.seqs, pl, ch, [&](int64_t n, int64_t tb, int64_t te, int64_t) {
        if (c.seqs.pad(n)) pad(n, tb, te);
      });
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t ch = chunk0; ch < chunk1; ++ch)
        for_each_piece(c.seqs, pl, ch, [&](int64_t n, int64_t tb, int64_t te, int64_t Ln) {
          if (!c.seqs.pad(n)) bwd_piece_time<O, WT, XT, Act>(c, n, tb, te, Ln, d, d + 1, part_of(ch), ring, d0);
        });
    return;
  }
  for (int64_t ch = chunk0; ch < chunk1; ++ch)
    for_each_piece(c.seqs, pl, ch, [&](int64_t n, int64_t tb, int64_t te, int64_t Ln) {
      if (c.seqs.pad(n)) pad(n, tb, te);
      else if (tv) bwd_piece_time<O, WT, XT, Act>(c, n, tb, te, Ln, d0, d1, part_of(ch), ring, d0);
      else bwd_piece<O, WT, XT, Act>(c, n, tb, te, Ln, d0, d1, part_of(ch), ring);
    });
}

// The kernel table of the ISA namespace it is expanded in: every (dtype slot,
// activation of core/activation.hpp's list, W class) gets its tile kernels.
// OF: the forward's ops and math, OB: the backward's (the same vectors; a
// 16-bit output may use a cheaper exp in the forward, cpu_simd.hpp).
template <class OF, class OB, class XT, class Act>
constexpr void fill_row(Kernels& k, int slot) {
  static_assert(OF::L == OB::L, "one vector width per dtype slot");
  constexpr int a = int(Act::kId);
  k.fwd[slot][a][0] = &fwd_tile<OF, 0, XT, Act>;
  k.fwd[slot][a][1] = &fwd_tile<OF, 1, XT, Act>;
  k.fwd[slot][a][2] = &fwd_tile<OF, 2, XT, Act>;
  k.fwd[slot][a][3] = &fwd_tile<OF, 3, XT, Act>;
  k.fwd[slot][a][4] = &fwd_tile<OF, 4, XT, Act>;
  k.bwd[slot][a][0] = &bwd_tile<OB, 0, XT, Act>;
  k.bwd[slot][a][1] = &bwd_tile<OB, 1, XT, Act>;
  k.bwd[slot][a][2] = &bwd_tile<OB, 2, XT, Act>;
  k.bwd[slot][a][3] = &bwd_tile<OB, 3, XT, Act>;
  k.bwd[slot][a][4] = &bwd_tile<OB, 4, XT, Act>;
  k.tree[slot][a] = &tree_task<OF, XT, Act>;  // a speculative tree step: forward only
  k.decode[slot][a][0] = nullptr;             // (W > kMaxWClass: the tiles)
  k.decode[slot][a][1] = &decode_task<OF, 1, XT, Act>;
  k.decode[slot][a][2] = &decode_task<OF, 2, XT, Act>;
  k.decode[slot][a][3] = &decode_task<OF, 3, XT, Act>;
  k.decode[slot][a][4] = &decode_task<OF, 4, XT, Act>;
}
// OF16 / OB16: the bf16 forward's and backward's ops (OpsFNarrow<3> and
// OpsF, or with AVX-512 BF16 the same with one-instruction rounding, Bf16Cvt).
template <class OF16 = OpsFNarrow<3>, class OB16 = OpsF, class... Act>
constexpr Kernels make_table(const char* name, ActList<Act...>) {
  static_assert(kMaxWClass == 4, "fill_row lists W classes 0..4");
  Kernels k{};
  k.isa = name;
  k.lanes[0] = k.lanes[1] = k.lanes[2] = OpsF::L;
  k.lanes[3] = OpsD::L;
  (fill_row<OpsF, OpsF, float, Act>(k, 0), ...);
  (fill_row<OpsFNarrow<4>, OpsF, f16_t, Act>(k, 1), ...);
  (fill_row<OF16, OB16, bf16_t, Act>(k, 2), ...);
  (fill_row<OpsD, OpsD, double, Act>(k, 3), ...);
  return k;
}
#ifndef SC_TABLE
#define SC_TABLE(NAME) constexpr Kernels table = make_table(NAME, Activations{});
#endif
