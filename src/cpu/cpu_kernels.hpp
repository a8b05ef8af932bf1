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
// Loop order: vector columns of L channels outside, time inside.  The window
// of the last W inputs (and, backward, of the last W dpre) then lives in
// registers for W <= 4 (template WT), and every input element is loaded once
// per piece plus the halo.  Sums over k are always taken in increasing k, so
// the generic-W path and the register path round identically.

template <class O, int WT, class XT, bool SILU>
void fwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t d0, int64_t d1,
               typename O::V* scr) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int64_t Dp = c.plan->Dp;
  const A* wT = static_cast<const A*>(c.wT);    // [W][Dp]
  const A* bias = static_cast<const A*>(c.bias);  // [Dp]
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + n * (W - 1) * Dp : nullptr;  // [W-1][Dp]
  // x, residual, y: [B, T, D] views; rows of sequence n start at *_base
  const XT* x = p.x.ptr<const XT>() + seq_base(p, p.x, n);
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  XT* y = p.y.ptr<XT>() + seq_base(p, p.y, n);
  const int64_t yst = p.y.stride[1], ysd = p.y.stride[2];
  const XT* res = p.residual ? p.residual.ptr<const XT>() + seq_base(p, p.residual, n) : nullptr;
  const int64_t rst = p.residual.stride[1], rsd = p.residual.stride[2];

  V w_reg[WT ? WT : 1], u_reg[WT ? WT : 1];
  V* w = WT ? w_reg : scr;      // w[k]: weight tap k for this column
  V* u = WT ? u_reg : scr + W;  // u[k]: input at t-(W-1)+k
  for (int64_t d = d0; d < d1; d += L) {
    const int nl = int(std::min<int64_t>(L, d1 - d));
    for (int k = 0; k < W; ++k) w[k] = O::load(wT + k * Dp + d);
    const V b = O::load(bias + d);
    for (int i = 0; i < W - 1; ++i) {
      const int64_t pos = tb - (W - 1) + i;
      u[i] = pos >= 0 ? load_lanes<O>(x + pos * xst + d * xsd, xsd, nl)
                      : (halo ? O::load(halo + (W - 1 + pos) * Dp + d) : O::zero());
    }
    for (int64_t t = tb; t < te; ++t) {
      u[W - 1] = load_lanes<O>(x + t * xst + d * xsd, xsd, nl);
      V acc = b;
      for (int k = 0; k < W; ++k) acc = O::fma(w[k], u[k], acc);
      V out = SILU ? silu<O>(acc) : acc;
      if (res) out = out + load_lanes<O>(res + t * rst + d * rsd, rsd, nl);
      store_lanes<O>(y + t * yst + d * ysd, ysd, nl, out);
      for (int k = 0; k < W - 1; ++k) u[k] = u[k + 1];
    }
  }
}

template <class O, int WT, class XT, bool SILU>
void fwd_tile(const Ctx& c, int64_t tile) {
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk = tile / pl.n_dtiles, dt = tile % pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  typename O::V stack_scr[WT ? 1 : TilePolicy::kMaxStackW * TilePolicy::kScratchPerW];
  typename O::V* scr = stack_scr;
  if (!WT && pl.ws_scratch)
    scr = reinterpret_cast<typename O::V*>(static_cast<typename O::A*>(c.scr) +
                                           tile * pl.scratch_elems);
  for_each_piece(p, pl, chunk, [&](int64_t n, int64_t tb, int64_t te, int64_t) {
    fwd_piece<O, WT, XT, SILU>(c, n, tb, te, d0, d1, scr);
  });
}

template <class O, int WT, class XT, bool SILU>
void bwd_piece(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t Ln, int64_t d0,
               int64_t d1, typename O::A* part, typename O::V* scr) {
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int S = p.S, off = p.S - (W - 1);
  const int64_t Dp = c.plan->Dp, td = c.plan->tile_d;
  const A* wT = static_cast<const A*>(c.wT);      // [W][Dp]
  const A* bias = static_cast<const A*>(c.bias);  // [Dp]
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + n * (W - 1) * Dp : nullptr;  // [W-1][Dp]
  // x, dy, dx: [B, T, D] views; rows of sequence n start at *_base
  const XT* x = p.x.ptr<const XT>() + seq_base(p, p.x, n);
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const XT* dy = p.dy ? p.dy.ptr<const XT>() + seq_base(p, p.dy, n) : nullptr;
  const int64_t gst = p.dy.stride[1], gsd = p.dy.stride[2];
  XT* dx = p.dx ? p.dx.ptr<XT>() + seq_base(p, p.dx, n) : nullptr;
  const int64_t dxst = p.dx.stride[1], dxsd = p.dx.stride[2];
  const bool want_dh0 = p.dh0 && tb == 0;
  const bool want_dw = part != nullptr;
  // Rows whose dpre is needed: the piece, plus W-1 rows of look-ahead for dx.
  const int64_t rend = dx ? std::min<int64_t>(te + W - 1, Ln)
                          : std::max(te, want_dh0 ? std::min<int64_t>(W - 1, Ln) : 0);

  V w_reg[WT ? WT : 1], u_reg[WT ? WT : 1], g_reg[WT ? WT : 1], dw_reg[WT ? WT : 1],
      head_reg[WT ? WT : 1];
  V* w = WT ? w_reg : scr;             // weight taps
  V* u = WT ? u_reg : scr + W;         // u[k]: x at r-(W-1)+k
  V* g = WT ? g_reg : scr + 2 * W;     // g[k]: dpre at r-(W-1)+k
  V* dw = WT ? dw_reg : scr + 3 * W;   // partial dweight
  V* head = WT ? head_reg : scr + 4 * W;  // dpre[0..W-2] for dh0

  for (int64_t d = d0; d < d1; d += L) {
    const int nl = int(std::min<int64_t>(L, d1 - d));
    for (int k = 0; k < W; ++k) {
      w[k] = O::load(wT + k * Dp + d);
      g[k] = O::zero();
      dw[k] = O::zero();
      head[k] = O::zero();
    }
    V db = O::zero();
    const V b = O::load(bias + d);
    for (int i = 0; i < W - 1; ++i) {
      const int64_t pos = tb - (W - 1) + i;
      u[i] = pos >= 0 ? load_lanes<O>(x + pos * xst + d * xsd, xsd, nl)
                      : (halo ? O::load(halo + (W - 1 + pos) * Dp + d) : O::zero());
    }
    // dx[t] from the dpre window g (rows t..t+W-1), plus the dht pass-through.
    auto emit_dx = [&](int64_t t) {
      V acc = O::zero();
      for (int k = 0; k < W; ++k) acc = O::fma(w[k], g[W - 1 - k], acc);
      if (p.dht && S + t >= Ln) acc = acc + load_state_lanes<O>(p.dht, n, d, S + t - Ln, nl);
      store_lanes<O>(dx + t * dxst + d * dxsd, dxsd, nl, acc);
    };
    for (int64_t r = tb; r < rend; ++r) {
      u[W - 1] = load_lanes<O>(x + r * xst + d * xsd, xsd, nl);
      V dp = O::zero();
      if (dy) {
        V acc = b;
        for (int k = 0; k < W; ++k) acc = O::fma(w[k], u[k], acc);
        const V gy = load_lanes<O>(dy + r * gst + d * gsd, gsd, nl);
        dp = SILU ? gy * silu_grad<O>(acc) : gy;
      }
      if (want_dw && r < te) {
        for (int k = 0; k < W; ++k) dw[k] = O::fma(dp, u[k], dw[k]);
        db = db + dp;
      }
      if (want_dh0 && r < W - 1) head[r] = dp;
      for (int k = 0; k < W - 1; ++k) {
        u[k] = u[k + 1];
        g[k] = g[k + 1];
      }
      g[W - 1] = dp;
      if (dx && r - (W - 1) >= tb) emit_dx(r - (W - 1));
    }
    if (dx) {
      // rows past the sequence end have dpre = 0
      for (int64_t r = std::max(rend, tb); r < te + W - 1; ++r) {
        for (int k = 0; k < W - 1; ++k) g[k] = g[k + 1];
        g[W - 1] = O::zero();
        if (r - (W - 1) >= tb) emit_dx(r - (W - 1));
      }
    }
    if (want_dw) {
      A* pw = part + (d - d0);  // part: [W+1][td]
      for (int k = 0; k < W; ++k) O::store(pw + k * td, O::load(pw + k * td) + dw[k]);
      O::store(pw + W * td, O::load(pw + W * td) + db);
    }
    if (want_dh0) {
      const int64_t nh = std::min<int64_t>(W - 1, Ln);  // rows of dpre that reach h0
      for (int j = 0; j < S; ++j) {
        V acc = O::zero();
        for (int k = 0; k < W; ++k) {
          const int64_t t = int64_t(j) - off - k;
          if (t >= 0 && t < nh) acc = O::fma(w[k], head[t], acc);
        }
        if (p.dht && j >= Ln) acc = acc + load_state_lanes<O>(p.dht, n, d, j - Ln, nl);
        store_state_lanes<O>(p.dh0, n, d, j, nl, acc);
      }
    }
  }
}

template <class O, int WT, class XT, bool SILU>
void bwd_tile(const Ctx& c, int64_t tile) {
  using A = typename O::A;
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t chunk = tile / pl.n_dtiles, dt = tile % pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, d1 = std::min(d0 + pl.tile_d, p.D);
  A* part = nullptr;
  if (c.part) {
    part = static_cast<A*>(c.part) + tile * (p.W + 1) * pl.tile_d;
    std::fill(part, part + (p.W + 1) * pl.tile_d, A(0));
  }
  typename O::V stack_scr[WT ? 1 : TilePolicy::kMaxStackW * TilePolicy::kScratchPerW];
  typename O::V* scr = stack_scr;
  if (!WT && pl.ws_scratch)
    scr = reinterpret_cast<typename O::V*>(static_cast<A*>(c.scr) + tile * pl.scratch_elems);
  for_each_piece(p, pl, chunk, [&](int64_t n, int64_t tb, int64_t te, int64_t Ln) {
    bwd_piece<O, WT, XT, SILU>(c, n, tb, te, Ln, d0, d1, part, scr);
  });
}
