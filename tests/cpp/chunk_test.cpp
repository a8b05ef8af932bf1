// Chunking invariants on every backend (ref, cpu; cuda when a device is present):
//  - whole vs head + tail at arbitrary split points (inside the first W-1
//    tokens too), the head's final state handed to the tail: forward and final
//    state bit-identical; with the loss on the tail only, the tail's dh0 equals
//    the whole gradient at the cut, and the full chain (head backward fed the
//    tail's dh0) reproduces dx, dh0, dweight, dbias;
//  - chains of decode steps (1 to 3 tokens) updating a state pool in place,
//    addressed by indices, equal one whole run;
//  - a packed batch equals the loop over its sequences run one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend_param.hpp"
#include "harness/harness.hpp"

namespace {

using namespace shortconv::harness;

class Chunk : public BackendTest {};

// fp32: chunked and whole differ only by accumulation order in sums over
// tokens (dweight, dbias); fp64 far below.
double tol_for(sc_dtype a) { return a == SC_F64 ? 1e-12 : 1e-5; }

TEST_P(Chunk, ArbitrarySplits) {
  std::mt19937_64 rng(2001);
  int bad = 0;
  for (int i = 0; i < 120 && bad < 5; ++i) {
    Case c;
    c.W = 1 + int(rng() % 16);
    const int sc = int(rng() % 3);
    c.S = sc == 0 ? c.W - 1 : sc == 1 ? c.W : c.W + 3;
    c.act = rng() % 4 ? SC_ACT_SILU : SC_ACT_NONE;
    c.act_dtype = c.param_dtype = c.state_dtype = i % 3 == 2 ? SC_F64 : SC_F32;
    c.D = 1 + int64_t(rng() % 12);
    c.h0 = rng() % 2;
    c.bias = rng() % 2;
    c.residual = rng() % 3 == 0;
    c.layout = Layout(rng() % 3);
    if (rng() % 3 == 0) c.tile_t = 1 + int64_t(rng() % uint64_t(c.W + 3));
    c.seed = rng();
    std::vector<int64_t> len;
    if (i % 2) {
      c.packed = true;
      const int n = 1 + int(rng() % 8);
      for (int k = 0; k < n; ++k) c.lengths.push_back(int64_t(rng() % uint64_t(2 * c.W + 10)));
      len = c.lengths;
    } else {
      c.B = 1 + int64_t(rng() % 3);
      c.T = int64_t(rng() % 60);
      len.assign(size_t(c.B), c.T);
    }
    std::vector<int64_t> split(len.size());
    for (size_t n = 0; n < len.size(); ++n) {
      // half the cuts inside the first W-1 tokens (the state still holds h0)
      const int64_t lim = rng() % 2 ? std::min<int64_t>(len[n], c.W - 1) : len[n];
      split[n] = int64_t(rng() % uint64_t(lim + 1));
    }
    if (!c.packed && !split.empty())  // a dense cut keeps both halves dense
      std::fill(split.begin(), split.end(), split[0]);
    const ChunkResult r = run_chunked(c, make_inputs(c), split, GetParam());
    const double tol = tol_for(c.act_dtype);
    const bool ok = r.error.empty() && r.forward_bitexact && r.state_bitexact &&
                    std::fabs(r.ratio - 1.0) <= tol && r.grad_err <= tol && r.dx_err <= tol &&
                    r.dweight_err <= tol && r.dbias_err <= tol && r.dh0_err <= tol;
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << c.describe() << "\n  error=" << r.error << " fwd=" << r.forward_bitexact
                    << " state=" << r.state_bitexact << " ratio=" << r.ratio
                    << " grad_err=" << r.grad_err << " dx=" << r.dx_err
                    << " dweight=" << r.dweight_err << " dbias=" << r.dbias_err
                    << " dh0=" << r.dh0_err;
  }
}

// Decode: steps of 1..3 tokens, N sequences in a pool of P rows updated in
// place (initial_state == final_state), some sequences starting fresh (-1).
TEST_P(Chunk, DecodeChainsInPlacePool) {
  std::mt19937_64 rng(2002);
  for (int trial = 0; trial < 12; ++trial) {
    const int W = 1 + int(rng() % 8);
    const int S = trial % 2 ? W : W - 1;
    const int64_t N = 1 + int64_t(rng() % 4), P = N + 3, T = 2 + int64_t(rng() % 12), D = 6;
    const sc_dtype dt = trial % 3 == 0 ? SC_BF16 : SC_F32;
    std::vector<int64_t> rows(static_cast<size_t>(P));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(size_t(N));
    std::vector<int64_t> first(static_cast<size_t>(N));  // -1: the sequence starts with a zero state
    for (int64_t n = 0; n < N; ++n) first[size_t(n)] = n % 2 ? -1 : rows[size_t(n)];

    // The whole run: dense [N, T, D] from the gathered initial rows.
    Case w;
    w.W = W;
    w.S = S;
    w.B = N;
    w.T = T;
    w.D = D;
    w.act_dtype = w.param_dtype = dt;
    w.state_dtype = SC_F32;
    w.h0 = w.ht = true;
    w.seed = rng();
    Inputs wi = make_inputs(w);
    Case pc = w;  // the pool, to draw its initial contents
    pc.pool = P;
    pc.h0_index = first;
    pc.ht_index = rows;
    std::vector<double> pool = make_inputs(pc).h0;
    const std::vector<double> pool0 = pool;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < D * S; ++e)
        wi.h0[size_t(n * D * S + e)] = first[size_t(n)] < 0 ? 0.0 : pool[size_t(first[size_t(n)] * D * S + e)];
    const Outputs whole = run(w, wi, GetParam(), kForward);
    ASSERT_TRUE(whole.ok()) << whole.problems();

    std::vector<double> y(whole.y.size(), NAN);
    for (int64_t t0 = 0; t0 < T;) {
      // even trials: pure 1-token decode steps; odd: steps of 1..3 tokens
      const int64_t k = trial % 2 ? std::min<int64_t>(T - t0, 1 + int64_t(rng() % 3)) : 1;
      Case s = pc;
      s.T = k;
      s.in_place = true;
      s.h0_index = t0 == 0 ? first : rows;
      s.tile_t = rng() % 2 ? 1 : 0;
      Inputs si;
      si.weight = wi.weight;
      si.bias = wi.bias;
      si.h0 = pool;
      si.x.resize(size_t(N * k * D));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < k; ++t)
          for (int64_t d = 0; d < D; ++d)
            si.x[size_t((n * k + t) * D + d)] = wi.x[size_t((n * T + t0 + t) * D + d)];
      const Outputs o = run(s, si, GetParam(), kForward);
      ASSERT_TRUE(o.ok()) << s.describe() << ": " << o.problems();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < k; ++t)
          for (int64_t d = 0; d < D; ++d)
            y[size_t((n * T + t0 + t) * D + d)] = o.y[size_t((n * k + t) * D + d)];
      pool = o.ht;
      t0 += k;
    }
    EXPECT_TRUE(bit_equal(y, whole.y)) << "decode chain y differs, W=" << W << " S=" << S
                                       << " rel err " << rel_err(y, whole.y);
    for (int64_t r = 0; r < P; ++r) {
      const auto it = std::find(rows.begin(), rows.end(), r);
      for (int64_t e = 0; e < D * S; ++e) {
        const double got = pool[size_t(r * D * S + e)];
        const double want = it == rows.end() ? pool0[size_t(r * D * S + e)]
                                             : whole.ht[size_t((it - rows.begin()) * D * S + e)];
        ASSERT_EQ(got, want) << "pool row " << r << " element " << e << " W=" << W;
      }
    }
  }
}

// A packed batch equals the loop over its sequences (forward bitwise).
TEST_P(Chunk, PackedEqualsLoop) {
  std::mt19937_64 rng(2003);
  for (int trial = 0; trial < 10; ++trial) {
    Case c;
    c.W = 1 + int(rng() % 10);
    c.S = c.W - 1 + int(rng() % 3);
    c.packed = true;
    for (int k = 0, n = 3 + int(rng() % 20); k < n; ++k)
      c.lengths.push_back(int64_t(rng() % uint64_t(c.W + 4)));
    c.lengths.push_back(40);
    c.D = 5;
    c.act_dtype = trial % 2 ? SC_F32 : SC_F16;
    c.state_dtype = SC_F32;
    c.h0 = c.ht = c.dht = c.want_dh0 = true;
    c.residual = true;
    c.layout = Layout(trial % 3);
    c.seed = rng();
    const Inputs in = make_inputs(c);
    const Outputs all = run(c, in, GetParam());
    ASSERT_TRUE(all.ok()) << all.problems();
    const int64_t N = c.num_seqs(), D = c.D, S = c.state_len();
    std::vector<double> y, ht, dx, dh0, dw(all.dweight.size(), 0.0), db(all.dbias.size(), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      // sequence n alone, as a dense [1, L_n, D] batch
      Inputs oi;
      Case one = c;
      one.packed = false;
      one.B = 1;
      one.T = c.lengths[size_t(n)];
      one.lengths.clear();
      oi.weight = in.weight;
      oi.bias = in.bias;
      const int64_t start = in.cu_seqlens[size_t(n)];
      oi.x.assign(in.x.begin() + start * D, in.x.begin() + (start + one.T) * D);
      oi.residual.assign(in.residual.begin() + start * D, in.residual.begin() + (start + one.T) * D);
      oi.dy.assign(in.dy.begin() + start * D, in.dy.begin() + (start + one.T) * D);
      oi.h0.assign(in.h0.begin() + n * D * S, in.h0.begin() + (n + 1) * D * S);
      oi.dht.assign(in.dht.begin() + n * D * S, in.dht.begin() + (n + 1) * D * S);
      const Outputs o = run(one, oi, GetParam());
      ASSERT_TRUE(o.ok()) << one.describe() << ": " << o.problems();
      y.insert(y.end(), o.y.begin(), o.y.end());
      ht.insert(ht.end(), o.ht.begin(), o.ht.end());
      dx.insert(dx.end(), o.dx.begin(), o.dx.end());
      dh0.insert(dh0.end(), o.dh0.begin(), o.dh0.end());
      for (size_t i = 0; i < dw.size(); ++i) dw[i] += o.dweight[i];
      for (size_t i = 0; i < db.size(); ++i) db[i] += o.dbias[i];
    }
    const double tol = tolerance(c.act_dtype, c.act_dtype);
    EXPECT_TRUE(bit_equal(y, all.y)) << c.describe() << " y rel err " << rel_err(y, all.y);
    EXPECT_TRUE(bit_equal(ht, all.ht)) << c.describe();
    EXPECT_LE(rel_err(dx, all.dx), tol) << c.describe();
    EXPECT_LE(rel_err(dh0, all.dh0), tolerance(c.state_dtype, c.act_dtype)) << c.describe();
    // per-sequence dweight/dbias are each rounded to the parameter dtype before summing
    EXPECT_LE(rel_err(dw, all.dweight), tolerance(c.param_dtype, c.act_dtype)) << c.describe();
    EXPECT_LE(rel_err(db, all.dbias), tolerance(c.param_dtype, c.act_dtype)) << c.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Chunk,
                         ::testing::Values(SC_BACKEND_REF, SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
