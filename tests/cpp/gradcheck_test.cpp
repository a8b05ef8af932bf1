// Gradients by finite differences in fp64, through the backend under test
// (ref, cpu; cuda when a device is present): the loss
//   L = sum dy * y + sum dht * final_state
// is evaluated by the backend's forward at x, weight, bias, h0 +- h, and the
// central differences are compared with the backend's backward (dx, dweight,
// dbias, dinitial_state).  Also determinism: bitwise identical outputs
// across repeated runs and thread counts.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "backend_param.hpp"
#include "harness/harness.hpp"

namespace {

using namespace shortconv::harness;

class Grad : public BackendTest {};

double loss(const Case& c, const Inputs& in, sc_backend b) {
  const Outputs o = run(c, in, b, kForward);
  EXPECT_TRUE(o.ok()) << o.problems();
  double l = 0;
  for (size_t i = 0; i < o.y.size(); ++i) l += in.dy[i] * o.y[i];
  for (size_t i = 0; i < o.ht.size() && i < in.dht.size(); ++i) l += in.dht[i] * o.ht[i];
  return l;
}

// Central differences of the loss w.r.t. every element of *param.
std::vector<double> fd(const Case& c, Inputs in, std::vector<double> Inputs::*param, sc_backend b) {
  const double h = 1e-6;
  std::vector<double> g((in.*param).size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double v = (in.*param)[i];
    (in.*param)[i] = v + h;
    const double lp = loss(c, in, b);
    (in.*param)[i] = v - h;
    const double lm = loss(c, in, b);
    (in.*param)[i] = v;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

TEST_P(Grad, FiniteDifferencesFp64) {
  struct Shape {
    int W, S;
    bool packed;
    Layout layout;
    sc_activation act;
  };
  const Shape shapes[] = {
      {1, 0, false, Layout::token_major, SC_ACT_SILU},
      {3, 3, false, Layout::channel_major, SC_ACT_SILU},
      {4, 6, true, Layout::token_major, SC_ACT_SILU},
      {5, 4, true, Layout::strided, SC_ACT_NONE},
      {2, 1, false, Layout::strided, SC_ACT_SILU},
  };
  uint64_t seed = 3001;
  for (const Shape& s : shapes) {
    Case c;
    c.W = s.W;
    c.S = s.S;
    c.act = s.act;
    c.act_dtype = c.param_dtype = c.state_dtype = SC_F64;
    c.D = 3;
    if (s.packed) {
      c.packed = true;
      c.lengths = {0, 1, 3, int64_t(s.W) + 1};
    } else {
      c.B = 2;
      c.T = 5;
    }
    c.layout = s.layout;
    c.bias = c.residual = c.h0 = c.ht = c.dht = c.want_dh0 = true;
    c.seed = ++seed;
    const Inputs in = make_inputs(c);
    const Outputs g = run(c, in, GetParam(), kBackward);
    ASSERT_TRUE(g.ok()) << g.problems();
    // Central differences with h = 1e-6 are accurate to ~1e-9 relative here
    // (truncation h^2, rounding eps/h): the bound is the FD's error, not the
    // backend's (which is checked against the oracle at 1e-12 elsewhere).
    const double tol = 1e-6;
    EXPECT_LE(rel_err(g.dx, fd(c, in, &Inputs::x, GetParam())), tol) << "dx " << c.describe();
    EXPECT_LE(rel_err(g.dweight, fd(c, in, &Inputs::weight, GetParam())), tol)
        << "dweight " << c.describe();
    EXPECT_LE(rel_err(g.dbias, fd(c, in, &Inputs::bias, GetParam())), tol) << "dbias " << c.describe();
    EXPECT_LE(rel_err(g.dh0, fd(c, in, &Inputs::h0, GetParam())), tol) << "dh0 " << c.describe();
  }
}

TEST_P(Grad, FiniteDifferencesSeqIdxFp64) {
  // Sequence ids: runs of 1, 2 and 4 tokens, padding at a row's start, end and
  // middle; every id occurs once (all final-state rows written), states by id.
  for (int W : {1, 3, 4}) {
    Case c;
    c.W = W;
    c.S = W;
    c.act_dtype = c.param_dtype = c.state_dtype = SC_F64;
    c.D = 2;
    c.B = 2;
    c.T = 7;
    c.seq_idx = {-1, 0, 0, 0, 0, 1, -2, 2, 3, 3, -1, 4, 4, -1};
    c.id_rows = 5;
    c.seq_idx_cm = W == 3;
    c.layout = W == 4 ? Layout::channel_major : Layout::token_major;
    c.bias = c.residual = c.h0 = c.ht = c.dht = c.want_dh0 = true;
    c.seed = 3100 + uint64_t(W);
    const Inputs in = make_inputs(c);
    const Outputs g = run(c, in, GetParam(), kBackward);
    ASSERT_TRUE(g.ok()) << g.problems();
    const double tol = 1e-6;  // the finite differences' own error (see FiniteDifferencesFp64)
    EXPECT_LE(rel_err(g.dx, fd(c, in, &Inputs::x, GetParam())), tol) << "dx " << c.describe();
    EXPECT_LE(rel_err(g.dweight, fd(c, in, &Inputs::weight, GetParam())), tol)
        << "dweight " << c.describe();
    EXPECT_LE(rel_err(g.dbias, fd(c, in, &Inputs::bias, GetParam())), tol) << "dbias " << c.describe();
    EXPECT_LE(rel_err(g.dh0, fd(c, in, &Inputs::h0, GetParam())), tol) << "dh0 " << c.describe();
  }
}

TEST_P(Grad, DeterministicAcrossRunsAndThreads) {
  std::mt19937_64 rng(3002);
  for (int trial = 0; trial < 4; ++trial) {
    Case c;
    c.W = trial % 2 ? 4 : 7;
    c.S = c.W;
    c.D = 67;
    c.act_dtype = trial < 2 ? SC_F32 : SC_BF16;
    c.param_dtype = SC_F32;
    if (trial % 2) {
      c.packed = true;
      c.lengths = {300, 1, 0, 129, 5, 64};
    } else {
      c.B = 3;
      c.T = 257;
    }
    c.h0 = c.ht = c.dht = c.want_dh0 = true;
    c.bias = c.residual = true;
    c.seed = rng();
    const Inputs in = make_inputs(c);
    Outputs first;
    for (int threads : {0, 1, 2, 3, 0}) {
      c.num_threads = threads;
      const Outputs o = run(c, in, GetParam());
      ASSERT_TRUE(o.ok()) << o.problems();
      if (first.y.empty()) {
        first = o;
        continue;
      }
      EXPECT_TRUE(bit_equal(o.y, first.y)) << "y, threads=" << threads << " " << c.describe();
      EXPECT_TRUE(bit_equal(o.ht, first.ht)) << "ht, threads=" << threads;
      EXPECT_TRUE(bit_equal(o.dx, first.dx)) << "dx, threads=" << threads;
      EXPECT_TRUE(bit_equal(o.dweight, first.dweight)) << "dweight, threads=" << threads;
      EXPECT_TRUE(bit_equal(o.dbias, first.dbias)) << "dbias, threads=" << threads;
      EXPECT_TRUE(bit_equal(o.dh0, first.dh0)) << "dh0, threads=" << threads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Grad,
                         ::testing::Values(SC_BACKEND_REF, SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
