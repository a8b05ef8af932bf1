// CPU backend: the decode-shaped forward (cpu_plan.hpp, decode_shaped): the
// engines' steps, a few tokens per sequence, each with its state rows.  NO
// include guard: cpu_kernels.hpp includes it once per ISA namespace.
//
// Math: fwd_piece's and final_states' (cpu_kernels.hpp, cpu.cpp), per
// sequence n and channel d, with s = S (or W-1 with num_accepted) entries of
// u before x_n, u[pos] for pos < s the h0 entry at slot state_slot(n, base +
// pos) (base = window_start(n) with num_accepted, else 0; zeros without a
// row):
//   pre[t] = bias + sum_{k<W-1} w[k] * u[s-(W-1)+t+k] + w[W-1] * x[t]
//   y[t]   = act(pre[t]) + residual[t]                        t < L_n
//   ht, slot final_slot(n, j) (j with num_accepted) = u[from + j],  j < E
//   (E = final_entries(n), from = s + L_n - E).
// The same vector operations in the same order as fwd_piece (the bias, taps
// 0..W-2 on the window, the token itself, then the activation and the
// residual) and the same element copies as final_states (raw bits: the
// states have x's dtype), so a step gives the tile path's bits (cpu_test.cpp
// Serving.DecodeStepsEqualTheTiledForward, serving_test.cpp, compares them).
//
// Ownership: a task is (d-tile, group of kDecodeGroup sequences).  For each
// sequence it prefetches the next one's lines of the d-tile, then walks the
// d-tile in blocks of RowPasses::kMaxRow channels: each vector's W-1 window
// entries into registers ([P, D, S] rows: the block's entries converted into
// wbuf first), every token's sums into pre, the activation and rounding
// passes into y, and only then the block's E state entries, in ascending j
// (or, for [P, D, S] rows rewritten whole, one memmove of the block and x's
// entries).  x, y or a residual whose channels are not adjacent (channel-first
// views, time axis contiguous: vLLM's speculative (batch, dim, seqlen) x; a
// packed one keeps the tiles, decode_shaped) go through [token][channel]
// copies of the block (xs, rs, ys), so the passes read and write whole
// vectors: the time-vectorised tiles these calls took before spent most of a
// step on vectors of 1-5 tokens (this VM, bf16, D = 4096, 1+3 tokens, batch
// 64: 8.5 ms against 0.56 for token-major x).  Every h0 entry the block's
// windows need is read before its ht row is written, and ascending j reads
// entry base + from + j (>= j) before ht[j] is written, final_states' rule:
// so ht may be h0's own row (in-place pools, rings); distinct sequences' rows
// are distinct (validated).
//
// Why a kernel of its own (bench/RESULTS.md, "Decode steps on the CPU
// backend: where the time goes"): the tile path runs a piece per sequence with
// its ring set-up, moves the W-1 window through the workspace halo in typed
// copies of 64-channel blocks, writes the final states in a pass of their
// own, and re-reads the d-tile's taps from L2 for every sequence.  Here the
// window goes from the pool row to registers, the state entries are copied
// while the block's lines are in L1, and the d-tile's taps (tile_d * (W+1)
// values) stay in L1 across the task's sequences.
template <class XT>
inline void copy_lanes(const XT* src, int64_t ss, XT* dst, int64_t ds, int64_t n) {
  if (!src) {
    for (int64_t i = 0; i < n; ++i) dst[i * ds] = XT{};  // +0 (all-zero bits)
  } else if (ss == 1 && ds == 1) {
    std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), size_t(n) * sizeof(XT));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * ds] = src[i * ss];
  }
}

// One state element as A (the conversion O::load_x makes: exact for every pair here).
template <class A, class XT>
inline A to_acc(XT v) {
  if constexpr (std::is_same_v<XT, bf16_t>) return A(bf16_to_f32(v.bits));
  else if constexpr (std::is_same_v<XT, f16_t>) return A(f16_to_f32(v.bits));
  else return A(v);
}

template <class O, int WT, class XT, class Act>
void decode_task(const Ctx& c, int64_t task) {
  static_assert(unscaled<O, Act>(), "the CPU kernels do not pre-scale weights");
  static_assert(WT >= 1 && WT <= kMaxWClass, "the window lives in registers: W is a constant");
  using V = typename O::V;
  using A = typename O::A;
  constexpr int L = O::L, W = WT, H = W - 1;
  // fwd_piece's passes (RowPasses, cpu_kernels.hpp) over blocks of kBlock channels: the sums
  // of every token into pre, then the activation, then (16-bit y) the rounding
  constexpr bool kPasses = RowPasses<A, XT>::kFwd && Act::kId != SC_ACT_NONE;
  constexpr bool kRound = RowPasses<A, XT>::kRoundPass;
  constexpr int64_t kBlock = RowPasses<A, XT>::kMaxRow, kT = Tiling::kDecodeMaxTokens;
  static_assert(kBlock % L == 0, "whole vectors per block");
  alignas(64) A pre[kPasses ? kT * kBlock : 1];  // [token][channel of the block]
  alignas(64) A wbuf[(H > 0 ? H : 1) * kBlock];    // [entry][channel of the block]: strided windows
  // x, y and the residual of a block staged [token][channel of the block] when their channel
  // stride is not 1 (channel-first views: vLLM's speculative (batch, dim, seqlen) x), as bits
  alignas(64) XT xs[kT * kBlock], ys[kT * kBlock], rs[kT * kBlock];
  const Plan& pl = *c.plan;
  const Problem& p = *c.p;
  const int64_t dt = task % pl.n_dtiles, group = task / pl.n_dtiles;
  const int64_t d0 = dt * pl.tile_d, nd = std::min(d0 + pl.tile_d, p.D) - d0;
  const int64_t n0 = group * Tiling::kDecodeGroup, n1 = std::min(n0 + Tiling::kDecodeGroup, p.N);
  const A* wb = static_cast<const A*>(c.wT) + d0 * (W + 1);  // [Dp/L][W+1][L], from channel d0
  const int64_t s = p.accepted ? H : p.S;                      // entries of u before x_n
  // x, residual, y: [B, T, D] views (token and channel strides); h0, ht: [rows, D, S] (channel
  // stride hsd / tsd; entries by slot)
  const int64_t xst = p.x.stride[1], xsd = p.x.stride[2];
  const int64_t yst = p.y.stride[1], ysd = p.y.stride[2];
  const int64_t rst = p.residual.stride[1], rsd = p.residual.stride[2];
  const int64_t hsd = p.h0.stride[1], tsd = p.ht.stride[1];
  const XT* h0 = p.h0 ? p.h0.ptr<const XT>() : nullptr;
  XT* ht = p.ht ? p.ht.ptr<XT>() : nullptr;
  const bool stage_x = xsd != 1, stage_y = ysd != 1, stage_r = p.residual && rsd != 1;
  // Software prefetch of sequence m's lines of the d-tile (its x and y rows, its state rows),
  // issued while the sequence before it computes: a task touches a 512-byte piece of each of
  // a sequence's rows, too little for the hardware prefetchers, which stop at page boundaries
  // (fwd_piece's prefetch kPrefetchRows rows ahead, cpu_kernels.hpp, does the same for the tiles).
  const int64_t es = int64_t(sizeof(XT)), piece = nd * es;
  auto prefetch_lines = [](const void* at, int64_t bytes, int write) {
    const char* c0 = static_cast<const char*>(at);
    for (int64_t b = 0; b < bytes; b += 64) {
      if (write) __builtin_prefetch(c0 + b, 1, 3);
      else __builtin_prefetch(c0 + b, 0, 3);
    }
  };
  auto prefetch_state = [&](const View& v, int64_t row, int write) {
    if (row < 0) return;
    if (v.stride[1] == 1)  // entry rows with adjacent channels
      for (int64_t e = 0; e < p.S; ++e) prefetch_lines(static_cast<const char*>(v.data) + v.off(row, d0, e) * es, piece, write);
    else if (v.stride[2] == 1 && v.stride[1] == p.S)  // [P, D, S] rows: one block
      prefetch_lines(static_cast<const char*>(v.data) + v.off(row, d0, 0) * es, piece * p.S, write);
  };
  // sequence m's tokens of the d-tile in x or y: rows of adjacent channels, or (time axis
  // contiguous, channel-first) one span of nd channels of Lm tokens
  auto prefetch_io = [&](const View& v, int64_t m, int64_t Lm, int write) {
    const int64_t st = v.stride[1], sd = v.stride[2];
    const char* at = static_cast<const char*>(v.data) + (c.seqs.base(v, m) + d0 * sd) * es;
    if (sd == 1)
      for (int64_t t = 0; t < Lm; ++t) prefetch_lines(at + t * st * es, piece, write);
    else if (st == 1 && Lm > 0 && sd <= 2 * Lm)
      prefetch_lines(at, ((nd - 1) * sd + Lm) * es, write);
  };
  auto prefetch_seq = [&](int64_t m) {
    if (m >= p.N) return;
    const int64_t Lm = c.seqs.len(m);
    prefetch_io(p.x, m, Lm, 0);
    prefetch_io(p.y, m, Lm, 1);
    const int64_t r0m = p.h0_row(m), r1m = p.ht_row(m);
    prefetch_state(p.h0, r0m, 0);
    if (!(p.state_in_place && r1m == r0m)) prefetch_state(p.ht, r1m, 1);
  };
  // Copies an [Ln][nb] block from (token, channel) strides (st, sd) to (dt_, dd), as bits,
  // walking whichever axis is adjacent in the source.
  auto stage = [](const XT* from, int64_t st, int64_t sd, XT* to, int64_t dt_, int64_t dd, int64_t nt,
                  int64_t nc) {
    if (st == 1)
      for (int64_t d = 0; d < nc; ++d)
        for (int64_t t = 0; t < nt; ++t) to[t * dt_ + d * dd] = from[t + d * sd];
    else
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t d = 0; d < nc; ++d) to[t * dt_ + d * dd] = from[t * st + d * sd];
  };
  for (int64_t n = n0; n < n1; ++n) {
    prefetch_seq(n + 1);
    const int64_t Ln = c.seqs.len(n), r0 = p.h0_row(n), r1 = p.ht_row(n);
    const int64_t base = p.accepted && r0 >= 0 ? p.window_start(n) : 0;  // h0 entry of u[0]
    // Per sequence, element offsets at channel d0: the window's entries in h0 (-1: zeros),
    // then each final-state entry's source (x: its token, h0: entry offset; -1: zeros)
    // and its slot in ht.
    int64_t win[H > 0 ? H : 1];
    for (int i = 0; i < H; ++i)
      win[i] = r0 >= 0 ? p.h0.off(r0, d0, p.state_slot(n, base + s - H + i)) : -1;
    const int64_t E = r1 >= 0 ? p.final_entries(n) : 0, from = s + Ln - E;
    int64_t src[Tiling::kDecodeMaxEntries], dst[Tiling::kDecodeMaxEntries];
    bool from_x[Tiling::kDecodeMaxEntries];
    for (int64_t e = 0; e < E; ++e) {
      const int64_t pos = from + e;
      from_x[e] = pos >= s;
      src[e] = from_x[e] ? pos - s : r0 >= 0 ? p.h0.off(r0, d0, p.state_slot(n, base + pos)) : -1;
      dst[e] = p.ht.off(r1, d0, p.accepted ? e : p.final_slot(n, e));
    }
    // [P, D, S] rows (entries adjacent, channels S apart, in order; no rings) rewritten whole
    // (E = S) from a row: entry j is h0 entry sh + j for j < S - L_n (sh = base + from: L_n in a
    // plain step, the accepted count in a speculative one), then x's tokens.  So the new row
    // block is the old one moved by sh entries (as bits, across channels; the entries that
    // cross into the next channel are x's positions, sh <= L_n), then x's entries.
    const int64_t sh = base + from;
    const bool shift = E > 0 && E == p.S && Ln < p.S && sh <= Ln && r0 >= 0 && !p.ring &&
                       hsd == p.S && tsd == p.S && p.h0.stride[2] == 1 && p.ht.stride[2] == 1 && !from_x[0];
    const XT* x_ = p.x.ptr<const XT>() + c.seqs.base(p.x, n) + d0 * xsd;  // token 0, channel d0
    XT* y_ = p.y.ptr<XT>() + c.seqs.base(p.y, n) + d0 * ysd;
    const XT* r_ = p.residual ? p.residual.ptr<const XT>() + c.seqs.base(p.residual, n) + d0 * rsd : nullptr;
    // The window of channels j.. (a vector's) from its h0 entries, or zeros; entries of
    // strided channels ([P, D, S] rows) come from the block's copy in wbuf.
    const bool gather = hsd != 1 && r0 >= 0;
    auto window = [&](int64_t j, int nl, V (&u)[H > 0 ? H : 1], int64_t b0) {
      for (int i = 0; i < H; ++i)
        u[i] = r0 < 0 ? O::zero()
               : gather ? O::load(wbuf + i * kBlock + (j - b0))
                        : load_lanes<O>(h0 + win[i] + j, 1, nl);
    };
    // pre of token t from the window u (then slid onto x[t])
    auto sums = [&](const A* wv, V (&u)[H > 0 ? H : 1], V xv) {
      V acc = O::load(wv + W * L);  // bias
      for (int k = 0; k < H; ++k) acc = O::fma(O::load(wv + k * L), u[k], acc);
      acc = O::fma(O::load(wv + H * L), xv, acc);
      for (int k = 0; k + 1 < H; ++k) u[k] = u[k + 1];
      if constexpr (H > 0) u[H - 1] = xv;
      return acc;
    };
    for (int64_t b0 = 0; b0 < nd; b0 += kBlock) {  // channels [b0, b1) of the d-tile
      const int64_t b1 = std::min(b0 + kBlock, nd), nb = b1 - b0;
      if constexpr (H > 0) {
        if (gather) {  // the window entries of strided channels, converted once per block,
                       // channel by channel (a [P, D, S] row block is read in order)
          const int64_t nv = (nb + L - 1) / L * L;  // (whole vectors: zeros past b1)
          const XT* hp[H];
          for (int i = 0; i < H; ++i) hp[i] = h0 + win[i] + b0 * hsd;
          for (int64_t d = 0; d < nb; ++d)
            for (int i = 0; i < H; ++i) wbuf[i * kBlock + d] = to_acc<A>(hp[i][d * hsd]);
          for (int i = 0; i < H; ++i) std::fill(wbuf + i * kBlock + nb, wbuf + i * kBlock + nv, A(0));
        }
      }
      // The block's x, residual and y as [token][channel] views from channel b0 (token and
      // channel strides): the tensors' own, or the staging buffers' (kBlock, 1).
      const XT* xb = stage_x ? xs : x_ + b0 * xsd;
      const int64_t xbt = stage_x ? kBlock : xst, xbd = stage_x ? 1 : xsd;
      const XT* rb = stage_r ? rs : r_ ? r_ + b0 * rsd : nullptr;
      const int64_t rbt = stage_r ? kBlock : rst, rbd = stage_r ? 1 : rsd;
      XT* yb = stage_y ? ys : y_ + b0 * ysd;
      const int64_t ybt = stage_y ? kBlock : yst, ybd = stage_y ? 1 : ysd;
      if (stage_x) stage(x_ + b0 * xsd, xst, xsd, xs, kBlock, 1, Ln, nb);
      if (stage_r) stage(r_ + b0 * rsd, rst, rsd, rs, kBlock, 1, Ln, nb);
      int64_t j = 0;  // (channels of the block from here on)
      if constexpr (kPasses) {  // the full vectors (every view has adjacent channels now)
        const int64_t jf = nb / L * L;
        for (; j < jf; j += L) {
          const A* wv = wb + ((b0 + j) / L) * (W + 1) * L;
          V u[H > 0 ? H : 1];
          window(b0 + j, L, u, b0);
          for (int64_t t = 0; t < Ln; ++t) O::store(pre + t * kBlock + j, sums(wv, u, O::load_x(xb + t * xbt + j)));
        }
        for (int64_t t = 0; t < Ln; ++t) {
          A* pt = pre + t * kBlock;
          XT* yt = yb + t * ybt;
          const XT* rt = rb ? rb + t * rbt : nullptr;
          for (int64_t i = 0; i < jf; i += L) {
            V out = Act::template value<O>(O::load(pt + i));
            if (rt) out = out + O::load_x(rt + i);
            if constexpr (kRound) O::store(pt + i, out);
            else O::store_x(yt + i, out);
          }
          if constexpr (kRound)
            for (int64_t i = 0; i < jf; i += L) O::store_x(yt + i, O::load(pt + i));
        }
      }
      for (; j < nb; j += L) {  // one loop per vector: the rest
        const int nl = int(std::min<int64_t>(L, nb - j));
        const A* wv = wb + ((b0 + j) / L) * (W + 1) * L;
        V u[H > 0 ? H : 1];
        window(b0 + j, nl, u, b0);
        for (int64_t t = 0; t < Ln; ++t) {
          V out = Act::template value<O>(sums(wv, u, load_lanes<O>(xb + t * xbt + j * xbd, xbd, nl)));
          if (rb) out = out + load_lanes<O>(rb + t * rbt + j * rbd, rbd, nl);
          store_lanes<O>(yb + t * ybt + j * ybd, ybd, nl, out);
        }
      }
      if (stage_y) stage(ys, kBlock, 1, y_ + b0 * ysd, yst, ysd, Ln, nb);
      // the block's state entries, after its windows were read
      if (shift) {  // [P, D, S] rows: the block's entries moved by sh, then x's into each channel's last
        const int64_t m = nb * p.S;
        XT* out = ht + dst[0] + b0 * tsd;
        std::memmove(static_cast<void*>(out), static_cast<const void*>(h0 + src[0] + b0 * hsd), size_t(m - sh) * sizeof(XT));
        for (int64_t t = 0; t < Ln; ++t) {
          const XT* xt = xb + t * xbt;
          XT* ot = out + (p.S - Ln + t);
          for (int64_t d = 0; d < nb; ++d) ot[d * p.S] = xt[d * xbd];
        }
        continue;
      }
      // ascending: final_states' order
      for (int64_t e = 0; e < E; ++e) {
        const XT* sp = from_x[e] ? xb + src[e] * xbt : src[e] >= 0 ? h0 + src[e] + b0 * hsd : nullptr;
        copy_lanes(sp, from_x[e] ? xbd : hsd, ht + dst[e] + b0 * tsd, tsd, nb);
      }
    }
  }
}
