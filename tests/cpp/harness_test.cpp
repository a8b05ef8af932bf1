// Self-tests of the harness (src/harness): the checks the sweeps rely on must
// be able to fail.  Poisoned outputs that are never written are counted,
// writes outside an output's view are counted, a wrong handed-over state is
// caught by the chunked comparison, and the comparison helpers behave.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.hpp"
#include "harness/harness.hpp"
#include "harness/sweep.hpp"

namespace {

using namespace shortconv::harness;

TEST(Harness, InputsNeverZeroAndRepresentable) {
  Case c;
  c.act_dtype = SC_BF16;
  c.param_dtype = SC_F16;
  c.state_dtype = SC_F64;
  c.h0 = c.dht = c.residual = true;
  c.B = 2;
  c.T = 50;
  const Inputs in = make_inputs(c);
  for (const std::vector<double>* v : {&in.x, &in.weight, &in.bias, &in.residual, &in.h0, &in.dy, &in.dht}) {
    ASSERT_FALSE(v->empty());
    for (double e : *v) ASSERT_NE(e, 0.0);
  }
  for (double e : in.x) EXPECT_EQ(double(shortconv::bf16_to_f32(shortconv::f32_to_bf16(float(e)))), e);
  for (double e : in.weight) EXPECT_EQ(double(shortconv::f16_to_f32(shortconv::f32_to_f16(float(e)))), e);
}

TEST(Harness, UnwrittenOutputsAreCounted) {
  Case c;
  c.B = 2;
  c.T = 9;
  c.D = 4;
  c.h0 = c.ht = c.want_dh0 = true;
  const Inputs in = make_inputs(c);
  Prepared p(c, &in, SC_BACKEND_REF);
  p.poison_outputs();
  const Outputs none = p.fetch(kBoth);  // nothing ran
  const int64_t expect = 2 * 9 * 4 /*y*/ + 2 * 4 * 3 /*ht*/ + 2 * 9 * 4 /*dx*/ + 4 * 4 /*dweight*/ +
                         4 /*dbias*/ + 2 * 4 * 3 /*dh0*/;
  EXPECT_EQ(none.unwritten, expect);
  ASSERT_EQ(p.forward(), SC_OK);
  ASSERT_EQ(p.backward(), SC_OK);
  const Outputs done = p.fetch(kBoth);
  EXPECT_EQ(done.unwritten, 0);
  EXPECT_EQ(done.stray, 0);
  EXPECT_TRUE(done.ok());
}

TEST(Harness, StrayWritesAreCounted) {
  Case c;
  c.B = 1;
  c.T = 5;
  c.D = 3;
  c.layout = Layout::strided;
  c.view_mult = 3;
  c.view_slot = 1;  // y is the middle third of [1, 5, 9]: element -1 is a gap
  const Inputs in = make_inputs(c);
  Prepared p(c, &in, SC_BACKEND_REF);
  p.poison_outputs();
  ASSERT_EQ(p.forward(), SC_OK);
  EXPECT_EQ(p.fetch(kForward).stray, 0);
  float* y = static_cast<float*>(p.fwd_args().y.data);
  y[-1] = 1.0f;  // a write into the gap before the view
  EXPECT_EQ(p.fetch(kForward).stray, 1);
}

TEST(Harness, WrongHandedOverStateIsCaught) {
  Case c;
  c.W = 4;
  c.B = 2;
  c.T = 20;
  c.D = 5;
  c.h0 = true;
  const Inputs in = make_inputs(c);
  const ChunkResult good = run_chunked(c, in, {7, 7}, SC_BACKEND_REF);
  ASSERT_EQ(good.error, "");
  EXPECT_TRUE(good.forward_bitexact);
  EXPECT_EQ(good.ratio, 1.0);
  EXPECT_EQ(good.grad_err, 0.0);
  // The tail run from a zero state instead of the head's final state differs.
  Case tc;
  Inputs ti;
  cut(c, in, {7, 7}, {20, 20}, std::vector<double>(size_t(2 * 5 * 3), 0.0), &tc, &ti);
  const Outputs bad_tail = run(tc, ti, SC_BACKEND_REF, kForward);
  EXPECT_FALSE(bit_equal(bad_tail.y, good.tail.y));
  EXPECT_GT(rel_err(bad_tail.y, good.tail.y), 1e-3);
}

TEST(Harness, CompareHelpers) {
  const double nan = std::nan("");
  EXPECT_EQ(rel_err({1, 2, 3}, {1, 2, 3}), 0.0);
  EXPECT_TRUE(std::isinf(rel_err({1, 2}, {1, 2, 3})));
  EXPECT_TRUE(std::isinf(rel_err({1, nan}, {1, 2})));
  EXPECT_EQ(rel_err({1, nan}, {1, nan}), 0.0);
  EXPECT_NEAR(rel_err({3, 4}, {0, 0}), 5.0, 1e-15);  // absolute when ||ref|| == 0
  EXPECT_NEAR(rel_err({1.1, 2}, {1, 2}), 0.1 / std::sqrt(5.0), 1e-12);
  EXPECT_TRUE(bit_equal({0.0, nan}, {0.0, nan}));
  EXPECT_FALSE(bit_equal({0.0}, {-0.0}));
  EXPECT_EQ(tolerance(SC_F64, SC_F64), 1e-12);
  EXPECT_EQ(tolerance(SC_F64, SC_F32), 1e-5);  // fp32 accumulation bounds an fp64 output
  EXPECT_EQ(tolerance(SC_F32, SC_F64), 1e-5);
  EXPECT_EQ(tolerance(SC_BF16, SC_F32), 1e-2);
  EXPECT_EQ(edge_lengths(1, 50), (std::vector<int64_t>{0, 1, 50}));
  EXPECT_EQ(edge_lengths(4, 50), (std::vector<int64_t>{0, 1, 2, 3, 4, 50}));
}

TEST(Harness, CudaPresenceIsConsistent) {
  if (!sc_has_backend(SC_BACKEND_CUDA)) EXPECT_FALSE(cuda_device_present());
  const std::vector<sc_backend> b = usable_backends();
  EXPECT_EQ(b.size(), cuda_device_present() ? 3u : 2u);
}

}  // namespace
