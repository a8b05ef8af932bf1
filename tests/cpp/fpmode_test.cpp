// The CPU backend computes in the caller's floating-point modes on every
// thread (docs/semantics.md §6): with flush-to-zero / denormals-are-zero set
// on the calling thread after the OpenMP pool exists, results are bitwise the
// same for 1 and 2 threads, and the flushing actually happened.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/harness.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace {

using namespace shortconv::harness;

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR FTZ (bit 15) | DAZ (bit 6)

// Forward and backward with the calling thread's MXCSR |= FTZ|DAZ during the
// library calls only (the harness encodes and decodes in the normal mode).
Outputs run_flushed(const Case& c, const Inputs& in) {
  Prepared prep(c, &in, SC_BACKEND_CPU);
  prep.poison_outputs();
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kFtzDaz);
  const sc_status f = prep.forward();
  const sc_status b = prep.backward();
  _mm_setcsr(saved);
  EXPECT_EQ(f, SC_OK);
  EXPECT_EQ(b, SC_OK);
  return prep.fetch(kBoth);
}

TEST(FpMode, WorkersUseTheCallersDenormalMode) {
  Case c;
  c.W = 3;
  c.S = 2;
  c.act = SC_ACT_NONE;
  c.B = 2;
  c.T = 600;
  c.D = 96;  // (B*T + N*S) * D > 2^15 elements per thread: a team of 2 really runs
  c.bias = false;  // a normal bias would absorb the subnormal sums
  c.h0 = c.ht = c.dht = c.want_dh0 = true;
  Inputs in = make_inputs(c);
  for (double& v : in.x) v *= 1e-38;  // products with weights ~0.5 are subnormal floats
  for (double& v : in.dy) v *= 1e-38;
  for (double& v : in.h0) v *= 1e-38;

  // Start the pool in the default mode (workers keep the mode they were made with).
  c.num_threads = 2;
  ASSERT_TRUE(run(c, in, SC_BACKEND_CPU).ok());

  std::vector<Outputs> outs;
  for (int threads : {2, 1, 2}) {
    c.num_threads = threads;
    outs.push_back(run_flushed(c, in));
    ASSERT_TRUE(outs.back().ok()) << outs.back().problems();
  }
  for (size_t r = 1; r < outs.size(); ++r) {
    EXPECT_TRUE(bit_equal(outs[r].y, outs[0].y)) << "y, run " << r;
    EXPECT_TRUE(bit_equal(outs[r].dx, outs[0].dx)) << "dx, run " << r;
    EXPECT_TRUE(bit_equal(outs[r].dweight, outs[0].dweight)) << "dweight, run " << r;
    EXPECT_TRUE(bit_equal(outs[r].dh0, outs[0].dh0)) << "dinitial_state, run " << r;
  }
  // Flushed: every input reads as zero, so y is 0 (the default mode gives subnormals).
  const Outputs normal = run(c, in, SC_BACKEND_CPU);
  int64_t flushed = 0, subnormal = 0;
  for (size_t i = 0; i < outs[0].y.size(); ++i) {
    if (outs[0].y[i] == 0.0) ++flushed;
    if (normal.y[i] != 0.0) ++subnormal;
  }
  EXPECT_EQ(flushed, int64_t(outs[0].y.size()));
  EXPECT_GT(subnormal, 0);
}
#endif

}  // namespace
