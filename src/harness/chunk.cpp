// Chunked computations: a batch cut per sequence into head and tail, the
// head's final state handed to the tail as its initial state.
//
// Exactness (semantics section 1-2): with u = h0 ++ x, the tail's initial
// state is u[split, split+S), so
//   - forward: every y and the final state equal the whole run's bitwise
//     (each y is the same W-term sum of the same values);
//   - backward, loss on tail outputs only: the tail's dh0 equals the whole
//     run's du at u positions [split, split+S) (dh0 ++ dx of the whole run),
//     and the head's backward fed dht = that dh0 reproduces the whole run's dx
//     on head tokens and its dh0; dweight and dbias split into head + tail.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/harness.hpp"

namespace shortconv::harness {

namespace {

int64_t seq_len(const Case& c, int64_t n) { return c.packed ? c.lengths[size_t(n)] : c.T; }

// First logical x row (b * xt + token) of sequence n.
std::vector<int64_t> seq_starts(const Case& c) {
  std::vector<int64_t> s(size_t(c.num_seqs()));
  int64_t acc = 0;
  for (int64_t n = 0; n < c.num_seqs(); ++n) {
    s[size_t(n)] = c.packed ? acc : n * c.T;
    acc += seq_len(c, n);
  }
  return s;
}

}  // namespace

void cut(const Case& c, const Inputs& in, const std::vector<int64_t>& lo,
         const std::vector<int64_t>& hi, const std::vector<double>& h0, Case* oc, Inputs* oi) {
  const int64_t N = c.num_seqs(), D = c.D;
  std::vector<int64_t> len(size_t(N), 0);
  bool uniform = !c.packed;
  for (int64_t n = 0; n < N; ++n) {
    len[size_t(n)] = hi[size_t(n)] - lo[size_t(n)];
    if (len[size_t(n)] != len[0]) uniform = false;
  }
  Case o = c;
  o.pool = 0;
  o.h0_index.clear();
  o.ht_index.clear();
  o.has_h0.clear();
  o.ring.clear();
  o.pad_index = -1;
  o.in_place = false;
  o.h0 = !h0.empty();
  o.ht = true;
  o.dht = false;
  o.dy_broadcast = false;
  if (uniform) {
    o.packed = false;
    o.B = N;
    o.T = N > 0 ? len[0] : 0;
    o.lengths.clear();
  } else {
    o.packed = true;
    o.lengths = len;
  }
  const std::vector<int64_t> from = seq_starts(c), to = seq_starts(o);
  Inputs r;
  r.weight = in.weight;
  r.bias = in.bias;
  r.h0 = h0;
  const size_t act_n = size_t(o.xb() * o.xt() * D);
  auto copy = [&](const std::vector<double>& src, std::vector<double>& dst, bool broadcast) {
    if (src.empty()) return;
    dst.assign(act_n, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < len[size_t(n)]; ++t)
        for (int64_t d = 0; d < D; ++d)
          dst[size_t((to[size_t(n)] + t) * D + d)] =
              broadcast ? src[size_t(d)] : src[size_t((from[size_t(n)] + lo[size_t(n)] + t) * D + d)];
  };
  copy(in.x, r.x, false);
  copy(in.residual, r.residual, false);
  copy(in.dy, r.dy, c.dy_broadcast);
  if (o.packed) {
    r.cu_seqlens.assign(1, 0);
    for (int64_t l : len) r.cu_seqlens.push_back(r.cu_seqlens.back() + l);
  }
  *oc = o;
  *oi = r;
}

void packed_equivalent(const Case& c, const Inputs& in, Case* oc, Inputs* oi) {
  const std::vector<Case::Run> runs = c.runs();
  const int64_t D = c.D, S = c.state_len(), R = int64_t(runs.size());
  Case o = c;
  o.seq_idx.clear();
  o.id_rows = 0;
  o.seq_idx_cm = false;
  o.packed = true;
  o.packed_2d = false;
  o.dy_broadcast = false;
  o.lengths.clear();
  for (const Case::Run& r : runs) o.lengths.push_back(r.t1 - r.t0);
  const bool states = (c.h0 || c.ht) && c.id_rows > 0;
  o.h0 = c.h0 && states;
  o.ht = c.ht && states;
  o.in_place = c.in_place && states;
  if (states) {  // a pool whose rows are the ids; padding runs name no row
    o.pool = c.id_rows;
    for (const Case::Run& r : runs) {
      o.h0_index.push_back(r.id >= 0 ? r.id : -1);
      o.ht_index.push_back(r.id >= 0 ? r.id : -1);
    }
  }
  Inputs e = in;
  if (c.dy) {
    e.dy.assign(size_t(c.B * c.T * D), 0.0);
    for (const Case::Run& r : runs)
      for (int64_t t = r.t0; t < r.t1 && r.id >= 0; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const size_t i = size_t((r.b * c.T + t) * D + d);
          e.dy[i] = in.dy[c.dy_broadcast ? size_t(d) : i];
        }
  }
  if (c.dht) {  // dense [runs, D, S] from the rows by id
    e.dht.assign(size_t(R * D * S), 0.0);
    for (int64_t k = 0; k < R; ++k)
      if (const int64_t id = runs[size_t(k)].id; id >= 0)
        std::copy_n(in.dht.begin() + id * D * S, D * S, e.dht.begin() + k * D * S);
  }
  e.cu_seqlens.assign(1, 0);
  for (int64_t l : o.lengths) e.cu_seqlens.push_back(e.cu_seqlens.back() + l);
  *oc = o;
  *oi = e;
}

namespace {

// The whole run of c with the loss on tail outputs only: dy zero on every
// head token (dy = 1 where c has none), every gradient requested.
void whole_run(const Case& c, const Inputs& in, const std::vector<int64_t>& split, Case* cw,
               Inputs* iw) {
  const int64_t N = c.num_seqs(), D = c.D;
  *cw = c;
  cw->pool = 0;
  cw->h0_index.clear();
  cw->ht_index.clear();
  cw->has_h0.clear();
  cw->ring.clear();
  cw->pad_index = -1;
  cw->in_place = false;
  cw->ht = true;
  cw->dht = false;
  cw->dy = true;
  cw->dy_broadcast = false;
  cw->want_dx = cw->want_dweight = cw->want_dbias = cw->want_dh0 = true;
  *iw = in;
  iw->dht.clear();
  const std::vector<int64_t> st = seq_starts(c);
  std::vector<double> dy(size_t(c.xb() * c.xt() * D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < seq_len(c, n); ++t)
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = size_t((st[size_t(n)] + t) * D + d);
        const double g = in.dy.empty() ? 1.0 : in.dy[c.dy_broadcast ? size_t(d) : i];
        dy[i] = t < split[size_t(n)] ? 0.0 : g;
      }
  iw->dy = dy;
}

// Head and tail y against the whole run's, bitwise (forward_bitexact), and
// head ++ tail dx in the whole run's order (*dx).
void join_rows(ChunkResult& R, const Case& cw, const Case& hc, const Case& tc,
               const std::vector<int64_t>& split, std::vector<double>* dx) {
  const int64_t D = cw.D;
  const std::vector<int64_t> sw = seq_starts(cw), sh = seq_starts(hc), stl = seq_starts(tc);
  auto same = [](double a, double b) {
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
  };
  R.forward_bitexact = true;
  dx->assign(R.whole.dx.size(), 0.0);
  for (int64_t n = 0; n < cw.num_seqs(); ++n)
    for (int64_t t = 0; t < seq_len(cw, n); ++t) {
      const bool head = t < split[size_t(n)];
      const int64_t row = head ? sh[size_t(n)] + t : stl[size_t(n)] + t - split[size_t(n)];
      const std::vector<double>& y = head ? R.head.y : R.tail.y;
      const std::vector<double>& g = head ? R.head_bwd.dx : R.tail.dx;
      for (int64_t d = 0; d < D; ++d) {
        const size_t wi = size_t((sw[size_t(n)] + t) * D + d), ci = size_t(row * D + d);
        if (!same(R.whole.y[wi], y[ci])) R.forward_bitexact = false;
        (*dx)[wi] = g[ci];
      }
    }
}

// The gradient at the cut: the whole run's du at u positions [split, split+S)
// (u = h0 ++ x) against the tail's dh0; ratio over the last W-1 slots.
void cut_gradient(ChunkResult& R, const Case& cw, const std::vector<int64_t>& split) {
  const int64_t N = cw.num_seqs(), D = cw.D, S = cw.state_len(), W = cw.W;
  const std::vector<int64_t> sw = seq_starts(cw);
  R.grad_whole.assign(size_t(N * D * S), 0.0);
  R.grad_chunked = R.tail.dh0;
  double nw = 0, nc = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < S; ++j) {
        const int64_t p = split[size_t(n)] + j;
        const size_t gi = size_t((n * D + d) * S + j);
        R.grad_whole[gi] = p < S ? R.whole.dh0[size_t((n * D + d) * S + p)]
                                 : R.whole.dx[size_t((sw[size_t(n)] + p - S) * D + d)];
        if (j >= S - (W - 1)) {
          nw += R.grad_whole[gi] * R.grad_whole[gi];
          nc += R.grad_chunked[gi] * R.grad_chunked[gi];
        }
      }
  R.ratio = nw > 0 ? std::sqrt(nc / nw) : (nc > 0 ? INFINITY : 1.0);
  R.grad_err = rel_err(R.grad_chunked, R.grad_whole);
}

}  // namespace

ChunkResult run_chunked(const Case& c, const Inputs& in, const std::vector<int64_t>& split,
                        sc_backend backend) {
  ChunkResult R;
  const int64_t N = c.num_seqs();
  std::vector<int64_t> zero(size_t(N), 0);
  std::vector<int64_t> len(size_t(N), 0);
  for (int64_t n = 0; n < N; ++n) len[size_t(n)] = seq_len(c, n);

  Case cw;
  Inputs iw;
  whole_run(c, in, split, &cw, &iw);
  R.whole = run(cw, iw, backend, kBoth);

  Case hc, tc;
  Inputs hi, ti;
  cut(cw, iw, zero, split, c.h0 ? in.h0 : std::vector<double>(), &hc, &hi);
  R.head = run(hc, hi, backend, kForward);
  cut(cw, iw, split, len, R.head.ht, &tc, &ti);
  tc.h0 = true;
  ti.h0 = R.head.ht;
  R.tail = run(tc, ti, backend, kBoth);
  Case hb = hc;
  hb.dy = false;  // absent dy = zeros: the head carries no loss
  hb.dht = true;
  hb.want_dh0 = true;
  hi.dy.clear();
  hi.dht = R.tail.dh0;
  R.head_bwd = run(hb, hi, backend, kBackward);

  for (const Outputs* o : {&R.whole, &R.head, &R.tail, &R.head_bwd})
    if (!o->ok() && R.error.empty()) {
      R.status = o->status != SC_OK ? o->status : SC_ERR_BACKEND;
      R.error = o->problems();
    }
  if (!R.error.empty()) return R;

  std::vector<double> dx;
  join_rows(R, cw, hc, tc, split, &dx);
  R.state_bitexact = bit_equal(R.tail.ht, R.whole.ht);
  cut_gradient(R, cw, split);

  R.dx_err = rel_err(dx, R.whole.dx);
  auto sum = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> s(a.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) s[i] = a[i] + b[i];
    return s;
  };
  R.dweight_err = rel_err(sum(R.head_bwd.dweight, R.tail.dweight), R.whole.dweight);
  R.dbias_err = rel_err(sum(R.head_bwd.dbias, R.tail.dbias), R.whole.dbias);
  R.dh0_err = rel_err(R.head_bwd.dh0, R.whole.dh0);
  return R;
}

}  // namespace shortconv::harness
