// Random case generator for the property sweeps (see sweep.hpp).
#include "harness/sweep.hpp"

#include <algorithm>
#include <numeric>

namespace shortconv::harness {

std::vector<int64_t> edge_lengths(int W, int64_t long_len) {
  std::vector<int64_t> l = {0, 1, W - 2, W - 1, W, long_len};
  l.erase(std::remove_if(l.begin(), l.end(), [](int64_t v) { return v < 0; }), l.end());
  std::sort(l.begin(), l.end());
  l.erase(std::unique(l.begin(), l.end()), l.end());
  return l;
}

namespace {

// Uniform draws from one generator.
struct Draw {
  std::mt19937_64& rng;
  int64_t pick(int64_t lo, int64_t hi) {  // in [lo, hi]
    return lo + int64_t(rng() % uint64_t(hi - lo + 1));
  }
  bool coin(double p) { return double(rng() % 1000) < p * 1000.0; }
};

// h0 / ht / dht / dh0, transposed states, and pools addressed by indices with
// -1 entries, in place or not.
void draw_states(Draw& r, Case& c) {
  const int64_t N = c.num_seqs();
  c.h0 = r.coin(0.6);
  c.ht = r.coin(0.6);
  c.dht = r.coin(0.5);
  c.want_dh0 = r.coin(0.7);
  c.state_transposed = r.coin(0.2);
  if ((c.h0 || c.ht) && r.coin(0.4)) {  // a pool addressed by indices, with -1 entries
    c.pool = N + r.pick(0, 3);
    std::vector<int64_t> rows(static_cast<size_t>(c.pool));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), r.rng);
    c.in_place = c.h0 && c.ht && r.coin(0.5);
    for (int64_t n = 0; n < N; ++n) {
      // in place, a sequence reads and writes only its own row
      const int64_t own = rows[size_t(n)];
      c.h0_index.push_back(r.coin(0.25) ? -1 : c.in_place ? own : r.pick(0, c.pool - 1));
      c.ht_index.push_back(r.coin(0.25) ? -1 : own);
    }
  } else if (c.h0 && c.ht) {
    c.in_place = r.coin(0.3);
  }
  // State addressing (semantics section 5): initial-state flags, ring rows
  // (offsets past S too), and a pad index (outside the pool, or a real row
  // that then means "no row") replacing some pool indices.
  if (c.h0 && r.coin(0.3)) {
    const sc_dtype flag_dtypes[3] = {SC_BOOL, SC_I32, SC_I64};
    c.flag_dtype = flag_dtypes[r.pick(0, 2)];
    for (int64_t n = 0; n < N; ++n) c.has_h0.push_back(r.coin(0.5) ? 1 : 0);
  }
  if ((c.h0 || c.ht) && r.coin(0.3))
    for (int64_t n = 0; n < N; ++n) c.ring.push_back(r.pick(0, 3 * int64_t(c.state_len()) + 1));
  if (c.pool > 0 && r.coin(0.3)) {
    c.pad_index = r.coin(0.5) ? c.pool + r.pick(0, 3) : r.pick(-3, c.pool - 1);
    if (c.pad_index == -1) c.pad_index = c.pool;
    for (int64_t n = 0; n < N; ++n) {
      if (r.coin(0.3)) c.h0_index[size_t(n)] = c.pad_index;
      if (r.coin(0.3)) c.ht_index[size_t(n)] = c.pad_index;
    }
  }
  if (c.pool > 0 && r.coin(0.2)) c.index_stride = r.pick(2, 3);  // indices as a strided view
}

// Parents of an L-token step as tree drafts: a chain (t-1, the linear
// draft), a star (every draft a child of token 0) or a random tree.
void draw_tree(Draw& r, int64_t L, int64_t M, int shape, std::vector<int64_t>* out) {
  for (int64_t t = 0; t < M; ++t) {
    int64_t p = t == 0 ? -1 : shape == 0 ? t - 1 : shape == 1 ? 0 : r.pick(0, t - 1);
    if (t >= L) p = r.pick(-2, 2 * M);  // past the sequence: never read
    out->push_back(p);
  }
}

// Block tables (rows per sequence's blocks, vLLM's block indices from the
// computed tokens) and, with `snapshots`, prefix caching: a block size, the
// chunk's absolute start, snapshot rows.  Every row written is distinct; some
// table entries are -1 or the pad index; in place the row a chunk starts from
// is often the one its first snapshot rewrites.
void draw_block_table(Draw& r, Case& c, bool snapshots) {
  const int64_t N = c.num_seqs();
  const int64_t B = r.pick(1, 6);
  std::vector<int64_t> cn(static_cast<size_t>(N));
  int64_t M = 1;
  for (int64_t n = 0; n < N; ++n) {
    cn[size_t(n)] = r.pick(0, 3 * B);
    M = std::max(M, (cn[size_t(n)] + c.seq_len(n) + B - 1) / B + 1);
  }
  M += r.pick(0, 2);
  c.table_cols = M;
  c.pool = N * M + r.pick(0, 3);
  std::vector<int64_t> rows(static_cast<size_t>(c.pool));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), r.rng);
  if (c.pad_index == -1 && r.coin(0.3)) c.pad_index = c.pool + r.pick(0, 2);
  c.block_table.clear();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < M; ++j) {
      const int64_t v = rows[size_t(n * M + j)];
      c.block_table.push_back(r.coin(0.1) ? (r.coin(0.5) ? -1 : c.pad_index) : v);
    }
  for (int64_t n = 0; n < N; ++n) {  // vLLM's: the blocks of the last computed, first and last tokens
    const int64_t cc = cn[size_t(n)], L = c.seq_len(n);
    c.initial_block.push_back(r.coin(0.8) ? std::max<int64_t>((cc + B - 1) / B - 1, 0) : r.pick(0, M - 1));
    c.first_block.push_back(cc / B);
    c.final_block.push_back(L > 0 ? (cc + L - 1) / B : cc / B);
  }
  if (snapshots) {
    c.block_size = B;
    c.computed = cn;
  }
  if (c.h0 && c.ht) c.in_place = r.coin(0.7);
}

// Speculative decoding (rows long enough for the longest sequence, counts
// 1 .. S-(W-1)+1 and garbage where no row is read) and tree drafts.  Both are
// forward-only: the case requests no backward output.
void draw_serving(Draw& r, Case& c) {
  const int64_t N = c.num_seqs();
  int64_t longest = 0;
  for (int64_t n = 0; n < N; ++n) longest = std::max(longest, c.seq_len(n));
  bool any = false, snapshots = false;
  if ((c.h0 || c.ht) && c.ring.empty() && r.coin(0.3)) {
    snapshots = c.ht && r.coin(0.6);
    draw_block_table(r, c, snapshots);
    any = true;
  }
  if (!snapshots && (c.h0 || c.ht) && c.ring.empty() && longest <= 8 && r.coin(0.35)) {
    c.S = int(std::max<int64_t>(c.W - 2 + std::max<int64_t>(longest, 1), c.W - 1) + r.pick(0, 2));
    const int64_t hi = c.state_len() - (c.W - 1) + 1;
    for (int64_t n = 0; n < N; ++n)
      c.accepted.push_back(c.h0_row(n) >= 0 ? r.pick(1, hi) : r.pick(-3, hi + 3));
    any = true;
  }
  if (!snapshots && longest <= 12 && r.coin(0.3)) {
    c.parent_cols = longest + r.pick(0, 2);
    const int shape = int(r.pick(0, 2));
    for (int64_t n = 0; n < N; ++n) draw_tree(r, c.seq_len(n), c.parent_cols, shape, &c.parents);
    any = true;
  }
  if (any) {
    c.want_dx = c.want_dweight = c.want_dbias = c.want_dh0 = c.dht = false;
  }
}

// seq_idx for c's dense batch (semantics section 3): runs of 1, 2, W-1, W, W+1
// or long tokens, padding runs (ids -1 .. -3) anywhere, rows starting and
// ending with either; ids unique per run when the call writes or
// differentiates states (one run per id), else sometimes an earlier id again.
// The states become pools of id_rows rows (some ids never occur).
void draw_ids(Draw& r, Case& c, int64_t long_len) {
  c.pool = 0;
  c.in_place = c.in_place && c.h0 && c.ht;
  c.h0_index.clear();
  c.ht_index.clear();
  c.has_h0.clear();
  c.ring.clear();
  c.pad_index = -1;
  const bool unique = c.ht || c.dht || c.want_dh0;
  const int64_t lens[6] = {1, 2, c.W - 1, c.W, c.W + 1, long_len};
  int64_t next = 0;
  c.seq_idx.clear();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T;) {
      const int64_t len = std::max<int64_t>(1, lens[r.pick(0, 5)]);
      int64_t id = -r.pick(1, 3);
      if (!r.coin(0.25)) id = unique || next == 0 || r.coin(0.6) ? next++ : r.pick(0, next - 1);
      for (int64_t k = 0; k < len && t < c.T; ++k, ++t) c.seq_idx.push_back(id);
    }
  c.id_rows = next + r.pick(0, 2);
  if (c.id_rows == 0 && (c.h0 || c.ht)) c.id_rows = 1;
  c.seq_idx_cm = r.coin(0.3);
}

}  // namespace

Case random_case(std::mt19937_64& rng, const Space& sp) {
  Draw r{rng};
  Case c;
  c.seed = rng();
  c.W = int(r.pick(sp.W_min, sp.W_max));
  const int choice = int(r.pick(0, 2));
  c.S = choice == 0 ? c.W - 1 : choice == 1 ? c.W : c.W + 3;
  c.act = r.coin(0.7) ? SC_ACT_SILU : SC_ACT_NONE;
  c.D = r.pick(1, sp.D_max);
  c.act_dtype = c.param_dtype = c.state_dtype = SC_F32;
  if (sp.dtypes) {
    const std::vector<sc_dtype>& a = sp.act_dtypes;
    const sc_dtype all[4] = {SC_F32, SC_F16, SC_BF16, SC_F64};
    c.act_dtype = a[size_t(r.pick(0, int64_t(a.size()) - 1))];
    c.param_dtype = all[r.pick(0, 3)];
    c.state_dtype = r.coin(0.5) ? c.act_dtype : all[r.pick(0, 3)];
    c.index_dtype = r.coin(0.5) ? SC_I32 : SC_I64;
  }

  const std::vector<int64_t> edges = edge_lengths(c.W, sp.long_len + r.pick(0, 9));
  auto edge = [&]() { return edges[size_t(r.pick(0, int64_t(edges.size()) - 1))]; };
  if (sp.packed && r.coin(0.5)) {
    c.packed = true;
    const int64_t n = r.pick(0, 12);
    for (int64_t i = 0; i < n; ++i) c.lengths.push_back(r.coin(0.8) ? r.pick(0, c.W + 1) : edge());
    c.packed_2d = r.coin(0.3);
  } else {
    c.B = r.pick(1, 3);
    c.T = edge();
  }
  const bool ids = sp.seq_ids && !c.packed && r.coin(0.3);
  if (ids && r.coin(0.7)) c.T = r.pick(1, 3 * int64_t(c.W) + 12);

  if (sp.layouts) {
    const int l = int(r.pick(0, 2));
    c.layout = l == 0 ? Layout::token_major : l == 1 ? Layout::channel_major : Layout::strided;
    c.view_mult = r.pick(2, 3);
    c.view_slot = r.pick(0, c.view_mult - 1);
    c.dy_broadcast = r.coin(0.2);
  }
  if (sp.optionals) {
    c.bias = r.coin(0.6);
    c.residual = r.coin(0.4);
    c.dy = r.coin(0.9);
  }
  if (sp.states)
    draw_states(r, c);
  else
    c.want_dh0 = false;
  if (ids) draw_ids(r, c, sp.long_len);
  if (sp.tiles) {
    if (r.coin(0.5)) c.tile_t = r.pick(1, c.W + 3);
    if (r.coin(0.3)) c.tile_d = r.pick(1, 40);
    c.num_threads = int(r.pick(0, 3));
  }
  c.want_dx = r.coin(0.9);
  c.want_dweight = r.coin(0.8);
  c.want_dbias = r.coin(0.7);
  if (sp.serving && !ids) draw_serving(r, c);  // serving steps take no seq_idx
  // exec.overlap: the decode path's kernels wait for the previous one (the
  // reads-ahead instances read their rows first); every other path and backend
  // ignores it.  From the case's seed, not a draw: the sequence of cases every
  // sweep draws stays what it was.
  c.overlap = int((c.seed >> 7) % 3);
  return c;
}

}  // namespace shortconv::harness
