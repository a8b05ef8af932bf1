// CPU backend: the forward and backward tile kernels (see cpu_plan.hpp for
// the decomposition into tiles and pieces).  NO include guard: cpu_isa.cpp
// includes this once per ISA inside that ISA's namespace, after cpu_simd.hpp.
//
// Math (docs/semantics.md), per channel d, sequence n, off = S-(W-1),
// u = h0 ++ x (so u[S+t] = x[t], and the W-1 entries before x[0] are the
// last W-1 entries of h0, copied into the workspace "halo"):
//
//   forward   pre[t] = bias + sum_k w[k] * x[t-(W-1)+k]        (x[<0] = halo)
//             y[t]   = act(pre[t]) + residual[t]
//   backward  dpre[t] = dy[t] * act'(pre[t])
//             dx[t]   = sum_k w[k] * dpre[t+W-1-k]  (dpre[>=L] = 0)
//                       + (S+t >= L ? dht[S+t-L] : 0)        -- a GATHER over dpre
//             dh0[j]  = sum_k w[k] * dpre[j-off-k]  (0 <= j-off-k < L)
//                       + (j >= L ? dht[j-L] : 0)
//             dweight[k] += dpre[t] * x[t-(W-1)+k],  dbias += dpre[t]
//
// Ownership: a piece (n, [tb, te)) of a tile writes y[tb..te) (forward) or
// dx[tb..te) (backward) for the tile's channels, and dh0 of sequence n when
// tb == 0 (the piece that starts the sequence; it alone computes dpre[0..W-2]
// with its own halo).  A backward piece recomputes pre/dpre for the W-1 rows
// after te (never writes them), so any tile_t >= 1 gives the same sums.
//
// Loop order: time rows outside, vectors of L channels inside, so each tile
// row is one contiguous run per tensor and every cache line is consumed once.
// The last W inputs (and, backward, the last W dpre) of every channel of the
// tile sit in small rings [W][tile_d] (stack, or workspace when large); the
// slot of time position q is (q - tb + W - 1) mod W.  WT > 0 fixes W at
// compile time (W <= 4: loops unroll, weights stay in registers).  Sums over
// k are always taken in increasing k.

// Prefetch the element `rows` rows ahead in the same column: a tile row is
// only tile_d channels wide, and with row strides of >= 4 KiB every row
// starts a new page, where the hardware prefetchers stop.
constexpr int64_t kPrefetchRows = 2;
template <class XT>
inline void prefetch(const XT* p, int64_t row_stride, int write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + uintptr_t(kPrefetchRows * row_stride) * sizeof(XT);
  if (write) __builtin_prefetch(reinterpret_cast<const void*>(a), 1, 3);
  else __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 3);
}

// ring slot + k, modulo W (slot < W, k < W)
inline int ring_slot(int slot, int k, int W) {
  const int s = slot + k;
  return s >= W ? s - W : s;
}

template <class O, int WT, class XT>
inline void fill_x_ring(const Ctx& c, int64_t n, int64_t tb, int64_t d0, int64_t d1,
                        typename O::A* ring) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int64_t Dp = c.plan->Dp, td = c.plan->tile_d;
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + n * (W - 1) * Dp : nullptr;  // [W-1][Dp]
  const XT* x = p.x.ptr<const XT>() + seq_base(p, p.x, n);  // x: rows of sequence n
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  for (int i = 0; i < W - 1; ++i) {  // position tb-(W-1)+i goes to slot i
    const int64_t pos = tb - (W - 1) + i;
    for (int64_t j = 0; j < d1 - d0; j += L) {
      const int nl = int(std::min<int64_t>(L, d1 - d0 - j));
      const V v = pos >= 0 ? load_lanes<O>(x + pos * xst + (d0 + j) * xsd, xsd, nl)
                           : (halo ? O::load(halo + (W - 1 + pos) * Dp + d0 + j) : O::zero());
      O::store(ring + i * td + j, v);
    }
  }
}

template <class O, int WT, class XT, bool SILU>
void fwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t d0, int64_t d1,
               typename O::A* ring) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int64_t Dp = c.plan->Dp, td = c.plan->tile_d;
  const A* wT = static_cast<const A*>(c.wT) + d0;      // [W][Dp], from channel d0
  const A* bias = static_cast<const A*>(c.bias) + d0;  // [Dp], from channel d0
  // x, residual, y: [B, T, D] views; *_ point at (token 0 of sequence n, channel d0)
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* x_ = p.x.ptr<const XT>() + seq_base(p, p.x, n) + d0 * xsd;
  const int64_t yst = p.y.stride[1], ysd = p.y.stride[2];
  XT* y_ = p.y.ptr<XT>() + seq_base(p, p.y, n) + d0 * ysd;
  const int64_t rst = p.residual.stride[1], rsd = p.residual.stride[2];
  const XT* res_ = p.residual ? p.residual.ptr<const XT>() + seq_base(p, p.residual, n) + d0 * rsd : nullptr;
  const int64_t nd = d1 - d0;

  fill_x_ring<O, WT, XT>(c, n, tb, d0, d1, ring);  // ring: [W][td]
  for (int64_t t = tb; t < te; ++t) {
    const int base = int((t - tb) % W);            // slot of position t-(W-1)
    const int cur = ring_slot(base, W - 1, W);     // slot of position t
    const XT* xr = x_ + t * xst;
    XT* yr = y_ + t * yst;
    const XT* rr = res_ ? res_ + t * rst : nullptr;
    const bool pf = t + kPrefetchRows < te;
    for (int64_t j = 0; j < nd; j += L) {
      const int nl = int(std::min<int64_t>(L, nd - j));
      if (pf) {
        prefetch(xr + j * xsd, xst, 0);
        prefetch(yr + j * ysd, yst, 1);
        if (rr) prefetch(rr + j * rsd, rst, 0);
      }
      const V xv = load_lanes<O>(xr + j * xsd, xsd, nl);
      V acc = O::load(bias + j);
      for (int k = 0; k < W - 1; ++k)
        acc = O::fma(O::load(wT + k * Dp + j), O::load(ring + ring_slot(base, k, W) * td + j), acc);
      acc = O::fma(O::load(wT + (W - 1) * Dp + j), xv, acc);
      O::store(ring + cur * td + j, xv);
      V out = SILU ? silu<O>(acc) : acc;
      if (rr) out = out + load_lanes<O>(rr + j * rsd, rsd, nl);
      store_lanes<O>(yr + j * ysd, ysd, nl, out);
    }
  }
}

template <class O, int WT, class XT, bool SILU>
void bwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t Ln, int64_t d0,
               int64_t d1, typename O::A* part, typename O::A* ring) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int S = p.S, off = p.S - (W - 1);
  const int64_t Dp = c.plan->Dp, td = c.plan->tile_d;
  const A* wT = static_cast<const A*>(c.wT) + d0;      // [W][Dp], from channel d0
  const A* bias = static_cast<const A*>(c.bias) + d0;  // [Dp], from channel d0
  // x, dy, dx: [B, T, D] views; *_ point at (token 0 of sequence n, channel d0)
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* x_ = p.x.ptr<const XT>() + seq_base(p, p.x, n) + d0 * xsd;
  const int64_t gst = p.dy.stride[1], gsd = p.dy.stride[2];
  const XT* dy_ = p.dy ? p.dy.ptr<const XT>() + seq_base(p, p.dy, n) + d0 * gsd : nullptr;
  const int64_t dxst = p.dx.stride[1], dxsd = p.dx.stride[2];
  XT* dx_ = p.dx ? p.dx.ptr<XT>() + seq_base(p, p.dx, n) + d0 * dxsd : nullptr;
  const int64_t nd = d1 - d0;
  const bool want_dh0 = p.dh0 && tb == 0;
  const int64_t nh = std::min<int64_t>(W - 1, Ln);  // dpre rows that reach h0
  // Rows whose dpre is needed: the piece, W-1 rows of look-ahead for dx, and
  // (first piece) the rows that reach h0.
  const int64_t rend = dx_ ? std::min<int64_t>(te + W - 1, Ln) : std::max(te, want_dh0 ? nh : 0);

  A* xring = ring;           // [W][td] x window
  A* gring = ring + W * td;  // [W][td] dpre window, same slots as xring
  fill_x_ring<O, WT, XT>(c, n, tb, d0, d1, xring);

  // dh0[jj] = sum_k w[k] dpre[jj-off-k] (rows < nh, in the ring) + dht[jj-L]
  auto store_dh0 = [&]() {
    for (int64_t j = 0; j < nd; j += L) {
      const int nl = int(std::min<int64_t>(L, nd - j));
      for (int jj = 0; jj < S; ++jj) {
        V acc = O::zero();
        for (int k = 0; k < W; ++k) {
          const int64_t t = int64_t(jj) - off - k;
          if (t >= 0 && t < nh)
            acc = O::fma(O::load(wT + k * Dp + j), O::load(gring + ring_slot(int(t), W - 1, W) * td + j), acc);
        }
        if (p.dht && jj >= Ln) acc = acc + load_state_lanes<O>(p.dht, n, d0 + j, jj - Ln, nl);
        store_state_lanes<O>(p.dh0, n, d0 + j, jj, nl, acc);
      }
    }
  };
  if (want_dh0 && nh == 0) store_dh0();

  // dx[t] = sum_k w[k] dpre[t+W-1-k] (+ dht), t = r-(W-1); dpre[r] in slot cur.
  // (Flags and row pointers are hoisted into locals: the float stores into
  // the rings may alias the Problem as far as the compiler knows.)
  const bool has_dht = bool(p.dht);
  // wk(k): weight tap k of vector j -- cached in registers for WT > 0 (the
  // compiler cannot keep them itself: the ring stores might alias wT).
  V wv[WT ? WT : 1];
  auto wk = [&](int64_t j, int k) -> V {
    if constexpr (WT > 0) return wv[k];
    else return O::load(wT + k * Dp + j);
  };
  auto dx_vec = [&](int64_t j, int nl, int base, int64_t t, XT* dxr, bool dht_row) {
    V acc = O::zero();
    for (int k = 0; k < W; ++k)
      acc = O::fma(wk(j, k), O::load(gring + ring_slot(base, W - 1 - k, W) * td + j), acc);
    if (dht_row) acc = acc + load_state_lanes<O>(p.dht, n, d0 + j, S + t - Ln, nl);
    store_lanes<O>(dxr + j * dxsd, dxsd, nl, acc);
  };
  for (int64_t r = tb; r < rend; ++r) {
    const int base = int((r - tb) % W);         // slot of position r-(W-1)
    const int cur = ring_slot(base, W - 1, W);  // slot of position r
    const XT* xr = x_ + r * xst;
    const XT* gr = dy_ ? dy_ + r * gst : nullptr;
    const bool emit = dx_ && r - (W - 1) >= tb;
    const bool acc_dw = part && r < te;
    const bool pf = r + kPrefetchRows < rend;
    const int64_t t_out = r - (W - 1);
    XT* dxr = emit ? dx_ + t_out * dxst : nullptr;
    const bool dht_row = has_dht && S + t_out >= Ln;
    for (int64_t j = 0; j < nd; j += L) {
      const int nl = int(std::min<int64_t>(L, nd - j));
      if (pf) {
        prefetch(xr + j * xsd, xst, 0);
        if (gr) prefetch(gr + j * gsd, gst, 0);
        if (emit) prefetch(dxr + j * dxsd, dxst, 1);
      }
      if constexpr (WT > 0)
        for (int k = 0; k < W; ++k) wv[k] = O::load(wT + k * Dp + j);
      // uk(k): x at r-(W-1)+k (the window; k = W-1 is the new row xv)
      V uv[WT ? WT : 1];
      const V xv = load_lanes<O>(xr + j * xsd, xsd, nl);
      if constexpr (WT > 0) {
        for (int k = 0; k < W - 1; ++k) uv[k] = O::load(xring + ring_slot(base, k, W) * td + j);
        uv[W - 1] = xv;
      }
      auto uk = [&](int k) -> V {
        if constexpr (WT > 0) return uv[k];
        else return k == W - 1 ? xv : O::load(xring + ring_slot(base, k, W) * td + j);
      };
      O::store(xring + cur * td + j, xv);
      V dp = O::zero();
      if (gr) {
        V acc = O::load(bias + j);
        for (int k = 0; k < W; ++k) acc = O::fma(wk(j, k), uk(k), acc);
        const V gy = load_lanes<O>(gr + j * gsd, gsd, nl);
        dp = SILU ? gy * silu_grad<O>(acc) : gy;
      }
      O::store(gring + cur * td + j, dp);
      if (acc_dw) {  // part: [W+1][td] -- dweight rows, then dbias
        for (int k = 0; k < W; ++k) {
          A* pk = part + k * td + j;
          O::store(pk, O::fma(dp, uk(k), O::load(pk)));
        }
        O::store(part + W * td + j, O::load(part + W * td + j) + dp);
      }
      if (emit) dx_vec(j, nl, base, t_out, dxr, dht_row);
    }
    if (want_dh0 && r == nh - 1) store_dh0();
  }
  if (dx_) {
    for (int64_t r = std::max(rend, tb); r < te + W - 1; ++r) {  // dpre = 0 past the end
      const int base = int((r - tb) % W), cur = ring_slot(base, W - 1, W);
      for (int64_t j = 0; j < nd; j += L) O::store(gring + cur * td + j, O::zero());
      const int64_t t_out = r - (W - 1);
      if (t_out >= tb)
        for (int64_t j = 0; j < nd; j += L) {
          if constexpr (WT > 0)
            for (int k = 0; k < W; ++k) wv[k] = O::load(wT + k * Dp + j);
          dx_vec(j, int(std::min<int64_t>(L, nd - j)), base, t_out, dx_ + t_out * dxst,
                 has_dht && S + t_out >= Ln);
        }
    }
  }
}

// Rings of a tile: on the stack when they fit, else the tile's workspace slot.
template <class A>
struct Rings {
  alignas(64) A stack[TilePolicy::kStackRingBytes / sizeof(A)];
  A* get(const Ctx& c, int64_t tile) {
    return c.plan->ws_scratch ? static_cast<A*>(c.scr) + tile * c.plan->ring_elems : stack;
  }
};

template <class O, int WT, class XT, bool SILU>
void fwd_tile(const Ctx& c, int64_t tile) {
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk = tile / pl.n_dtiles, dt = tile % pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  Rings<typename O::A> rings;
  typename O::A* ring = rings.get(c, tile);
  for_each_piece(p, pl, chunk, [&](int64_t n, int64_t tb, int64_t te, int64_t) {
    fwd_piece<O, WT, XT, SILU>(c, n, tb, te, d0, d1, ring);
  });
}

template <class O, int WT, class XT, bool SILU>
void bwd_tile(const Ctx& c, int64_t tile) {
  using A = typename O::A;
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk = tile / pl.n_dtiles, dt = tile % pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  A* part = nullptr;  // this tile's [W+1][tile_d] partial dweight / dbias
  if (c.part) {
    part = static_cast<A*>(c.part) + tile * (p.W + 1) * pl.tile_d;
    std::fill(part, part + (p.W + 1) * pl.tile_d, A(0));
  }
  Rings<A> rings;
  A* ring = rings.get(c, tile);
  for_each_piece(p, pl, chunk, [&](int64_t n, int64_t tb, int64_t te, int64_t Ln) {
    bwd_piece<O, WT, XT, SILU>(c, n, tb, te, Ln, d0, d1, part, ring);
  });
}
