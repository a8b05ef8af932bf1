// The float64 oracle: docs/semantics.md transcribed, nothing else.
//
// For each sequence n and channel d it builds u = h0 ++ x in double, applies
// the definition term by term, and rounds once when storing.  Sequences are
// the dense rows, the packed sequences or the runs of seq_idx (section 3).  It is never
// optimised: every other backend is checked against it, so it must be obvious.
// (Being a test oracle, it uses std::vector scratch instead of the workspace.)
#include <cmath>
#include <vector>

#include "core/activation.hpp"
#include "core/backend.hpp"
#include "core/dtype.hpp"

namespace shortconv::ref {

namespace {

// The activations' math in plain double arithmetic (core/activation.hpp).
struct RefMath {
  using V = double;
  static constexpr bool kTanhForm = false;
  static double one() { return 1.0; }
  static double exp(double x) { return std::exp(x); }
  static double div(double a, double b) { return a / b; }
  static double fma(double a, double b, double c) { return a * b + c; }
  static double tanh(double h) { return std::tanh(h); }
};

double act(sc_activation a, double z) { return RuntimeAct<RefMath>{int(a)}.value(z); }

// act'(z): dgrad with dy = 1 (RefMath's scale is 1 for every activation).
double act_grad(sc_activation a, double z) { return RuntimeAct<RefMath>{int(a)}.dgrad(1.0, z); }

double get(const View& v, int64_t i0, int64_t i1 = 0, int64_t i2 = 0) {
  return load_f64(v.data, v.dtype, v.off(i0, i1, i2));
}

void put(const View& v, double value, int64_t i0, int64_t i1 = 0, int64_t i2 = 0) {
  store_f64(v.data, v.dtype, v.off(i0, i1, i2), value);
}

// One sequence of the call: batch row b, tokens [t0, t0 + L) of x's [B, T, D]
// view, the state rows it reads and writes, the row of its dht / dh0.
struct Seq {
  int64_t n;               // its index for the per-sequence tensors (flags, rings, indices)
  int64_t b, t0, L;
  int64_t h0_row, ht_row;  // -1: a zero initial state / no final state written
  int64_t grad_row;        // row of dfinal_state and dinitial_state
  bool pad;                // seq_idx padding: outputs 0, feeds nothing
};

// Calls f(Seq) for every sequence in order: the dense rows or packed
// sequences n < N, or the runs of seq_idx row after row (section 3: id i
// reads and writes state row i, a negative id is padding).
template <class F>
void for_each_sequence(const Problem& p, F&& f) {
  if (!p.seq_idx) {
    for (int64_t n = 0; n < p.N; ++n)
      f(Seq{n, p.seq_batch(n), p.seq_begin(n), p.seq_len(n), p.h0_row(n), p.ht_row(n), n, false});
    return;
  }
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t t1 = 0;
    for (int64_t t0 = 0; t0 < p.T; t0 = t1) {
      const int64_t id = p.seq_id(b, t0);
      for (t1 = t0 + 1; t1 < p.T && p.seq_id(b, t1) == id; ++t1) {
      }
      const bool pad = id < 0;
      f(Seq{0, b, t0, t1 - t0, !pad && p.h0 ? id : -1, !pad && p.ht ? id : -1, id, pad});
    }
  }
}

// The extended sequence of sequence q for channel d and the number s of its
// entries before x_n: u_n = h0_n ++ x_n (s = S), or with num_accepted the
// window from accepted - 1: v_n = w_n ++ x_n (s = W-1; semantics section 5).
std::vector<double> extended(const Problem& p, const Seq& q, int64_t d, int64_t* s_out) {
  const int64_t s = p.accepted ? p.W - 1 : p.S;
  const int64_t first = p.accepted && q.h0_row >= 0 ? p.window_start(q.n) : 0;  // (a_n read only then)
  std::vector<double> u(size_t(s + q.L), 0.0);
  for (int64_t j = 0; j < s; ++j)
    u[size_t(j)] = q.h0_row >= 0 ? get(p.h0, q.h0_row, d, p.state_slot(q.n, first + j)) : 0.0;
  for (int64_t t = 0; t < q.L; ++t) u[size_t(s + t)] = get(p.x, q.b, q.t0 + t, d);
  *s_out = s;
  return u;
}

// The u positions token t reads, q[k] for tap k (oldest first): the W-1
// entries before it, or with parent_tokens its chain of parents, then the
// state from its newest entry backwards.
std::vector<int64_t> taps(const Problem& p, int64_t n, int64_t s, int64_t t) {
  std::vector<int64_t> q(size_t(p.W));
  int64_t pos = s + t;
  for (int k = p.W - 1; k >= 0; --k) {
    q[size_t(k)] = pos;
    pos = pos - s >= 1 ? s + p.parent(n, pos - s) : pos - 1;
  }
  return q;
}

// pre_n[t] = bias + sum_k weight[k] * u[q_t[k]]
std::vector<double> preactivation(const Problem& p, int64_t n, const std::vector<double>& u,
                                  int64_t s, int64_t L, int64_t d) {
  std::vector<double> pre(size_t(L), 0.0);
  for (int64_t t = 0; t < L; ++t) {
    const std::vector<int64_t> q = taps(p, n, s, t);
    double v = p.bias ? get(p.bias, d) : 0.0;
    for (int k = 0; k < p.W; ++k) v += get(p.weight, d, k) * u[size_t(q[size_t(k)])];
    pre[size_t(t)] = v;
  }
  return pre;
}

// Channels outside, sequences inside: an empty channel axis does no work even
// for 2^58 (broadcast) sequences.
void forward(const Problem& p) {
  for (int64_t d = 0; d < p.D; ++d) {
    for_each_sequence(p, [&](const Seq& q) {
      if (q.pad) {  // a padding run's outputs are 0 (no residual), and it has no state
        if (p.y)
          for (int64_t t = 0; t < q.L; ++t) put(p.y, 0.0, q.b, q.t0 + t, d);
        return;
      }
      // Every read of h0 (into u) happens before the write of ht below, so an
      // aliased in-place state update is correct.
      int64_t s = 0;
      const std::vector<double> u = extended(p, q, d, &s);
      const std::vector<double> pre = preactivation(p, q.n, u, s, q.L, d);
      if (p.y) {
        for (int64_t t = 0; t < q.L; ++t) {
          double v = act(p.act, pre[size_t(t)]);
          if (p.residual) v += get(p.residual, q.b, q.t0 + t, d);
          put(p.y, v, q.b, q.t0 + t, d);
        }
      }
      // The final state is the last E entries of u: E = S (entry j at its
      // slot), or (W-2) + L_n entries from the row's start (speculative).
      // (Serving arguments never come with seq_idx: q.n is the sequence.)
      const int64_t E = p.final_entries(q.n), from = s + q.L - E;
      if (q.ht_row >= 0)
        for (int64_t j = 0; j < E; ++j)
          put(p.ht, u[size_t(from + j)], q.ht_row, d, p.accepted ? j : p.final_slot(q.n, j));
      // Prefix caching: at block boundary k, after r tokens, the last S entries of u so far.
      for (int64_t k = 0; k < p.snapshots(q.n); ++k) {
        const int64_t r = p.snapshot_row(q.n, k), at = p.snapshot_tokens(q.n, k);
        if (r >= 0)
          for (int64_t j = 0; j < p.S; ++j) put(p.ht, u[size_t(at + j)], r, d, j);
      }
    });
  }
}

void backward(const Problem& p) {
  const int64_t off = p.S - (p.W - 1);
  std::vector<double> dweight(size_t(p.D * p.W), 0.0), dbias(size_t(p.D), 0.0);
  for (int64_t d = 0; d < p.D; ++d) {
    if (p.seq_idx && p.dh0)  // rows of ids that do not occur: the gradient of an unread state
      for (int64_t r = 0; r < p.dh0.shape[0]; ++r)
        for (int64_t j = 0; j < p.S; ++j) put(p.dh0, 0.0, r, d, j);
    for_each_sequence(p, [&](const Seq& q) {
      const int64_t L = q.L;
      if (q.pad) {  // padding: dx = 0, no term anywhere else
        if (p.dx)
          for (int64_t t = 0; t < L; ++t) put(p.dx, 0.0, q.b, q.t0 + t, d);
        return;
      }
      std::vector<double> du(size_t(p.S + L), 0.0);
      if (p.dy) {  // an absent dy contributes no term at all (semantics §2)
        int64_t s = 0;  // = S: the backward takes no serving arguments
        const std::vector<double> u = extended(p, q, d, &s);
        const std::vector<double> pre = preactivation(p, q.n, u, s, L, d);
        std::vector<double> dpre(size_t(L), 0.0);
        for (int64_t t = 0; t < L; ++t)
          dpre[size_t(t)] = get(p.dy, q.b, q.t0 + t, d) * act_grad(p.act, pre[size_t(t)]);
        for (int64_t t = 0; t < L; ++t)
          for (int k = 0; k < p.W; ++k) {
            du[size_t(off + t + k)] += get(p.weight, d, k) * dpre[size_t(t)];
            dweight[size_t(d * p.W + k)] += dpre[size_t(t)] * u[size_t(off + t + k)];
          }
        for (int64_t t = 0; t < L; ++t) dbias[size_t(d)] += dpre[size_t(t)];
      }
      if (p.dht)
        for (int64_t j = 0; j < p.S; ++j) du[size_t(L + j)] += get(p.dht, q.grad_row, d, j);
      if (p.dx)
        for (int64_t t = 0; t < L; ++t) put(p.dx, du[size_t(p.S + t)], q.b, q.t0 + t, d);
      if (p.dh0)
        for (int64_t j = 0; j < p.S; ++j) put(p.dh0, du[size_t(j)], q.grad_row, d, j);
    });
  }
  for (int64_t d = 0; d < p.D; ++d) {
    if (p.dweight)
      for (int k = 0; k < p.W; ++k) put(p.dweight, dweight[size_t(d * p.W + k)], d, k);
    if (p.dbias) put(p.dbias, dbias[size_t(d)], d);
  }
}

}  // namespace

sc_status workspace(const Problem&, size_t* bytes, sc_error*) {
  *bytes = 0;
  return SC_OK;
}

sc_status run(const Problem& p, sc_error*) {
  if (p.dir == Dir::fwd)
    forward(p);
  else
    backward(p);
  return SC_OK;
}

}  // namespace shortconv::ref
