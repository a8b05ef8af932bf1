// CPU backend: the TIME-vectorised tile kernels, for activations whose time
// axis is contiguous (channel-major [B, D, T] storage and views of it).  NO
// include guard: cpu_kernels.hpp includes this inside each ISA's namespace.
//
// Math: that of cpu_kernels.hpp, element for element.  Here a vector holds L
// consecutive time rows of ONE channel, so every tensor is read and written
// along its contiguous axis (the channel-vectorised kernels would gather L
// channels T elements apart, one cache line each).  Each output element is
// computed by exactly the lane operations of the channel-vectorised kernels
// (bias first, taps in increasing k with O::fma, the same activation math,
// dx and dh0 from zero over the same taps in decreasing k, dht terms added
// the same way), so
// y, dx and dh0 are bitwise those of the token-major layout; dweight and
// dbias are summed in another order (lanes of time, then across lanes), so
// they agree to rounding, and are deterministic like everything else.
//
// Ownership is the tiling's (cpu_plan.hpp): a piece (n, [tb, te)) of a tile
// writes y / dx rows [tb, te) of the tile's channels and, when tb == 0, dh0.
// Loop order: channel outer, time inner, within time BLOCKS of at most
// kTimeBlock rows, each treated like a piece of its own (re-reading the W-1
// inputs before it and recomputing the W-1 dpre rows after it, as pieces do),
// so the staging buffers stay small whatever tile_t is forced:
//   xs [W-1 + rows + W-1 + pad]  the block's window u = x[t0-(W-1) ..], as A
//   gs [rows + W-1 + pad]        dpre[t0 ..] (backward)
// Lanes past a block's rows are computed from zero padding and never stored
// or summed.  Rows whose dx gather reaches past the sequence end or that take
// a dht term (the last max(W-1, S) rows of a sequence) are done row by row in
// lane 0, with the channel-vectorised kernels' operations.

constexpr int64_t kTimeBlock = Tiling::kAutoTileT;

// Staging buffer elements a tile needs for width W (any lane count <= kLane).
// (make_plan reserves the same, as rings of at least this size.)
constexpr int64_t time_buffer_elems(int64_t W) { return 2 * kTimeBlock + 3 * (W - 1) + 4 * Tiling::kLane; }
static_assert(time_buffer_elems(4) * 8 <= int64_t(Tiling::kStackRingBytes), "W <= 4 buffers fit the stack");

// The time-vectorised kernels run when x's time axis is contiguous and its
// channel axis is not (time_vectorised, cpu_plan.hpp; dy, y, dx, residual: any
// strides, lane by lane when theirs differ).

// Calls f(i, n, full) for the vectors [i, i + L) of [0, rows), n real lanes:
// full = std::true_type for whole vectors when `contig` (every tensor the
// loop reads or writes lane by lane has time stride 1: plain vector loads and
// stores), else std::false_type (lanes gathered at the strides, the last one
// partial).
template <int L, class F>
inline void for_vectors(int64_t rows, bool contig, F&& f) {
  int64_t i = 0;
  if (contig)
    for (; i + L <= rows; i += L) f(i, L, std::true_type{});
  for (; i < rows; i += L) f(i, int(std::min<int64_t>(L, rows - i)), std::false_type{});
}
template <class O, class XT, class FULL>
inline typename O::V load_time(const XT* p, int64_t st, int n, FULL) {
  if constexpr (FULL::value) return O::load_x(p); else return load_lanes<O>(p, st, n);
}
template <class O, class XT, class FULL>
inline void store_time(XT* p, int64_t st, int n, typename O::V v, FULL) {
  if constexpr (FULL::value) O::store_x(p, v); else store_lanes<O>(p, st, n, v);
}

// a where lane i < n, else b.
template <class O>
inline typename O::V first_lanes(int n, typename O::V a, typename O::V b) {
  typename O::A lane[O::L];
  for (int i = 0; i < O::L; ++i) lane[i] = typename O::A(i);
  return O::load(lane) < O::set1(typename O::A(n)) ? a : b;
}

// The lanes of v summed in lane order.
template <class O>
inline typename O::A lane_sum(typename O::V v) {
  typename O::A s = v[0];
  for (int i = 1; i < O::L; ++i) s += v[i];
  return s;
}

// xs[i] = u at position t0 - (W-1) + i of channel d, i in [0, (W-1) + rows),
// then zeros up to a whole vector past the end: positions < 0 from the halo
// (zeros without an initial state), the others converted from x (contiguous
// in time), each exactly as the channel kernels convert it.
template <class O, class XT>
inline void stage_x(const Ctx& c, int64_t n, int64_t d, int64_t t0, int64_t rows, int W,
                    typename O::A* xs) {
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int64_t Dp = c.plan->Dp;
  const A* halo = c.halo ? static_cast<const A*>(c.halo) + c.seqs.row(n) * (W - 1) * Dp + d : nullptr;
  const XT* x = p.x.ptr<const XT>() + c.seqs.base(p.x, n) + d * p.x.stride[2];
  int64_t i = 0, pos = t0 - (W - 1);
  for (; pos < 0 && i < (W - 1) + rows; ++i, ++pos) xs[i] = halo ? halo[(W - 1 + pos) * Dp] : A(0);
  const int64_t end = (W - 1) + rows;
  for (; i + L <= end; i += L, pos += L) O::store(xs + i, O::load_x(x + pos));
  O::store(xs + i, load_lanes<O>(x + pos, 1, int(end - i)));  // the rest, zero padded
  O::store(xs + i + L, O::zero());
}

// Lanes K .. K+L-1 of the 2L lanes a ++ b: the window vector xs[i + K ..]
// from the two whole vectors at xs + i (one shuffle, where a load at i + K
// straddles two cache lines).
template <class O, int K>
inline typename O::V shifted(typename O::V a, typename O::V b) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return __builtin_shufflevector(a, b, (K + I)...);
  }(std::make_integer_sequence<int, O::L>{});
}

// The packed taps and bias of channel d, broadcast.
template <class O, int WT>
struct Taps {
  using V = typename O::V;
  static constexpr int kMax = WT ? WT : 1;
  V w[kMax], bias;
  const typename O::A* src;  // generic W: tap k at src[k * L]
  Taps(const Ctx& c, int64_t d, int W) {
    constexpr int L = O::L;
    src = static_cast<const typename O::A*>(c.wT) + (d / L) * (W + 1) * L + d % L;
    bias = O::set1(src[W * L]);
    if constexpr (WT > 0)
      for (int k = 0; k < WT; ++k) w[k] = O::set1(src[k * L]);
  }
  V operator()(int k) const {
    if constexpr (WT > 0) return w[k]; else return O::set1(src[k * O::L]);
  }
};

// Prefetches the first `rows` elements of a channel's run (the channel after
// next: one channel of time to arrive): each channel's run starts a new
// stream, T elements after the previous one, where hardware prefetchers
// would first miss a line or two.
template <class XT>
inline void prefetch_run(const XT* p, int64_t rows) {
  const char* a = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < rows * int64_t(sizeof(XT)); b += 64) __builtin_prefetch(a + b);
}

template <class O, int WT, class XT, class Act>
void fwd_piece_time(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t d0, int64_t d1,
                    typename O::A* buf) {
  using V = typename O::V;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  const int64_t yst = p.y.stride[1], rst = p.residual.stride[1];
  const bool contig = yst == 1 && (!p.residual || rst == 1);
  for (int64_t d = d0; d < d1; ++d) {
    const Taps<O, WT> w(c, d, W);
    XT* y = p.y.ptr<XT>() + c.seqs.base(p.y, n) + d * p.y.stride[2];
    const XT* res = p.residual ? p.residual.ptr<const XT>() + c.seqs.base(p.residual, n) + d * p.residual.stride[2]
                               : nullptr;
    if (d + 2 < d1)
      prefetch_run(p.x.ptr<const XT>() + c.seqs.base(p.x, n) + (d + 2) * p.x.stride[2] + tb,
                   std::min(kTimeBlock, te - tb));
    for (int64_t t0 = tb; t0 < te; t0 += kTimeBlock) {
      const int64_t rows = std::min(kTimeBlock, te - t0);
      stage_x<O, XT>(c, n, d, t0, rows, W, buf);
      auto sums = [&](int64_t i) {
        V acc = w.bias;
        if constexpr (WT > 0 && WT - 1 <= L) {  // (taps in increasing k, as below)
          const V a = O::load(buf + i), b = O::load(buf + i + L);
          [&]<int... K>(std::integer_sequence<int, K...>) {
            ((acc = O::fma(w(K), shifted<O, K>(a, b), acc)), ...);
          }(std::make_integer_sequence<int, WT>{});
        } else {
          for (int k = 0; k < W; ++k) acc = O::fma(w(k), O::load(buf + i + k), acc);
        }
        return acc;
      };
      auto block = [&](auto has_res) {
        auto activate = [&](int64_t i, int nl, auto full, V acc) {
          V out = Act::template value<O>(acc);
          if constexpr (decltype(has_res)::value) out = out + load_time<O>(res + (t0 + i) * rst, rst, nl, full);
          return out;
        };
        auto store_y = [&](int64_t i, int nl, auto full, V v) { store_time<O>(y + (t0 + i) * yst, yst, nl, v, full); };
        if constexpr (RowPasses<typename O::A, XT>::kFwd && Act::kId != SC_ACT_NONE) {
          // in passes (RowPasses): the sums first, each into the staged
          // entries it was the last to read (buf[i, i + L)), then the
          // activation (and the residual), then (16-bit y) the rounding
          constexpr bool kRound = RowPasses<typename O::A, XT>::kRoundPass;
          for (int64_t i = 0; i < rows; i += L) O::store(buf + i, sums(i));
          for_vectors<L>(rows, contig, [&](int64_t i, int nl, auto full) {
            const V out = activate(i, nl, full, O::load(buf + i));
            if constexpr (kRound) O::store(buf + i, out);
            else store_y(i, nl, full, out);
          });
          if constexpr (kRound)
            for_vectors<L>(rows, contig, [&](int64_t i, int nl, auto full) { store_y(i, nl, full, O::load(buf + i)); });
        } else {
          for_vectors<L>(rows, contig, [&](int64_t i, int nl, auto full) { store_y(i, nl, full, activate(i, nl, full, sums(i))); });
        }
      };
      if (res) block(std::true_type{});
      else block(std::false_type{});
    }
  }
}

// Adds the block's dweight / dbias terms of channel dd of the tile to the
// tile's partial ([tile_d/L][W+1][L]): per tap, the block's rows [0, rows)
// summed lane-wise, then across lanes.
template <class O>
void add_partials(int W, int64_t rows, const typename O::A* xs, const typename O::A* gs,
                  typename O::A* part, int64_t dd) {
  using V = typename O::V;
  constexpr int L = O::L;
  typename O::A* pc = part + (dd / L) * (W + 1) * L + dd % L;
  const int64_t nv = rows / L * L;
  const int tail = int(rows - nv);
  for (int k = 0; k <= W; ++k) {  // k = W: dbias
    V acc = O::zero();
    for (int64_t i = 0; i < nv; i += L)
      acc = k < W ? O::fma(O::load(gs + i), O::load(xs + i + k), acc) : acc + O::load(gs + i);
    if (tail) {
      const V g = O::load(gs + nv);
      acc = first_lanes<O>(tail, k < W ? O::fma(g, O::load(xs + nv + k), acc) : acc + g, acc);
    }
    pc[k * L] += lane_sum<O>(acc);
  }
}

// dh0 of channel d (first piece of a sequence whose state row is `row`): the
// channel kernels' sums (bwd_store_dh0) over the dpre rows 0 <= t < nh, each in lane 0.
template <class O, int WT>
void dh0_time(const Problem& p, int64_t row, int64_t Ln, int64_t nh, int64_t d, const Taps<O, WT>& w,
              const typename O::A* gs) {
  using V = typename O::V;
  const int W = WT ? WT : p.W, S = p.S, off = S - (W - 1);
  for (int jj = 0; jj < S; ++jj) {
    V acc = O::zero();
    for (int k = W - 1; k >= 0 && p.dy; --k) {
      const int64_t t = int64_t(jj) - off - k;
      if (t >= 0 && t < nh) acc = O::fma(w(k), O::set1(gs[t]), acc);
    }
    if (p.dht && jj >= Ln) acc = acc + load_state_lanes<O>(p.dht, row, d, jj - Ln, 1);
    store_state_lanes<O>(p.dh0, row, d, jj, 1, acc);
  }
}

// dx rows [t0, t0 + rows) of channel d from gs = dpre[t0 ..]: whole vectors
// while every tap's dpre row exists and no dht term is due, then row by row
// (taps k >= t + W - Ln only: rows past the sequence end form no term);
// `row`: the sequence's state row (of dht).
template <class O, int WT, class XT>
void dx_time(const Problem& p, int64_t row, int64_t t0, int64_t rows, int64_t Ln, int64_t d,
             const Taps<O, WT>& w, const typename O::A* gs, XT* dx) {
  using V = typename O::V;
  constexpr int L = O::L;
  const int W = WT ? WT : p.W, S = p.S;
  const int64_t st = p.dx.stride[1];
  const bool has_dy = bool(p.dy);
  const int64_t last_fast = Ln - (p.dht ? std::max(W - 1, S) : W - 1);  // rows < last_fast: full gathers
  const int64_t nfast = std::clamp<int64_t>(last_fast - t0, 0, rows);
  for_vectors<L>(nfast, st == 1, [&](int64_t i, int nl, auto full) {
    V acc = O::zero();
    for (int k = W - 1; k >= 0 && has_dy; --k) acc = O::fma(w(k), O::load(gs + i + W - 1 - k), acc);
    store_time<O>(dx + (t0 + i) * st, st, nl, acc, full);
  });
  for (int64_t i = nfast; i < rows; ++i) {
    const int64_t t = t0 + i;
    V acc = O::zero();
    for (int k = W - 1; k >= std::max<int64_t>(0, t + W - Ln) && has_dy; --k)
      acc = O::fma(w(k), O::set1(gs[i + W - 1 - k]), acc);
    if (p.dht && S + t >= Ln) acc = acc + load_state_lanes<O>(p.dht, row, d, S + t - Ln, 1);
    store_lanes<O>(dx + t * st, st, 1, acc);
  }
}

// A backward piece, channel by channel, block by block: dpre of the block's
// rows and the W-1 after them (never past the sequence end) into gs, the
// partials of the block's rows, dx, and dh0 in the sequence's first block.
template <class O, int WT, class XT, class Act>
void bwd_piece_time(const Ctx& c, int64_t n, int64_t tb, int64_t te, int64_t Ln, int64_t d0,
                    int64_t d1, typename O::A* part, typename O::A* buf, int64_t part_d0) {
  // (channels [d0, d1) of the tile whose partial row `part` starts at channel part_d0)
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L;
  const Problem& p = *c.p;
  const int W = WT ? WT : p.W;
  A* xs = buf;
  A* gs = buf + kTimeBlock + 2 * (W - 1) + 2 * Tiling::kLane;
  const int64_t gst = p.dy.stride[1];
  const int64_t nh = std::min<int64_t>(W - 1, Ln);  // dpre rows that reach h0
  for (int64_t d = d0; d < d1; ++d) {
    const Taps<O, WT> w(c, d, W);
    const XT* dy = p.dy ? p.dy.ptr<const XT>() + c.seqs.base(p.dy, n) + d * p.dy.stride[2] : nullptr;
    XT* dx = p.dx ? p.dx.ptr<XT>() + c.seqs.base(p.dx, n) + d * p.dx.stride[2] : nullptr;
    if (d + 2 < d1) {
      const int64_t ahead_rows = std::min(kTimeBlock, te - tb);
      prefetch_run(p.x.ptr<const XT>() + c.seqs.base(p.x, n) + (d + 2) * p.x.stride[2] + tb, ahead_rows);
      if (dy && gst == 1) prefetch_run(dy + 2 * p.dy.stride[2] + tb, ahead_rows);
    }
    for (int64_t t0 = tb; t0 < te; t0 += kTimeBlock) {
      const int64_t t1 = std::min(te, t0 + kTimeBlock), rows = t1 - t0;
      const bool dh0_here = p.dh0 && t0 == 0;
      const int64_t rend = dx ? std::min<int64_t>(t1 + W - 1, Ln) : std::max(t1, dh0_here ? nh : 0);
      if (dy) {
        stage_x<O, XT>(c, n, d, t0, rend - t0, W, xs);
        auto sums = [&](int64_t i) {
          V acc = w.bias;
          for (int k = 0; k < W; ++k) acc = O::fma(w(k), O::load(xs + i + k), acc);
          return acc;
        };
        if constexpr (RowPasses<typename O::A, XT>::kBwd) {  // the sums, then dpre in their place (RowPasses)
          for (int64_t i = 0; i < rend - t0; i += L) O::store(gs + i, sums(i));
          for_vectors<L>(rend - t0, gst == 1, [&](int64_t i, int nl, auto full) {
            O::store(gs + i, Act::template dgrad<O>(load_time<O>(dy + (t0 + i) * gst, gst, nl, full), O::load(gs + i)));
          });
        } else {
          for_vectors<L>(rend - t0, gst == 1, [&](int64_t i, int nl, auto full) {
            const V acc = sums(i);
            const V gy = load_time<O>(dy + (t0 + i) * gst, gst, nl, full);
            O::store(gs + i, Act::template dgrad<O>(gy, acc));
          });
        }
        O::store(gs + (rend - t0 + L - 1) / L * L, O::zero());  // what dx's last lanes read past rend
        if (part) add_partials<O>(W, rows, xs, gs, part, d - part_d0);
      }
      if (dx) dx_time<O, WT, XT>(p, c.seqs.row(n), t0, rows, Ln, d, w, gs, dx);
      if (dh0_here) dh0_time<O, WT>(p, c.seqs.row(n), Ln, nh, d, w, gs);
    }
  }
}
