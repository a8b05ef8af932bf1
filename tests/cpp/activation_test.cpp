// Activations over the whole range of every dtype, on every backend.
//
// W = 1, weight 1, no bias: pre = x exactly, so y = act(x) and
// dx = dy * act'(x) element by element.  x runs over both signs of zero,
// subnormals, the values where exp over- and underflows in float
// (|x| around 87-89 and 103), large magnitudes up to the dtype's largest
// finite value, infinities and NaN.  Each element must agree with the float64
// oracle: NaN where the oracle is NaN, the same infinity, and otherwise within
// rtol * |ref| + atol (atol: results below the smallest normal float, ~1e-37,
// may flush to zero; docs/semantics.md §4).  Infinite inputs follow the
// defining formulas in IEEE arithmetic: silu(+inf) = +inf, silu(-inf) =
// -inf * 0 = NaN (as torch.nn.functional.silu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/activation.hpp"
#include "core/dtype.hpp"
#include "backend_param.hpp"
#include "harness/harness.hpp"

namespace {

using namespace shortconv::harness;

class ActivationRange : public BackendTest {};

// Width 1, one token, D channels, no bias: y = act(weight * x) channel by
// channel, the activation alone over a list of inputs (x set by the caller).
Case pointwise(sc_dtype dt, sc_activation act, int64_t D) {
  Case c;
  c.W = 1;
  c.S = 0;
  c.act = act;
  c.act_dtype = c.param_dtype = c.state_dtype = dt;
  c.B = 1;
  c.T = 1;
  c.D = D;
  c.bias = false;
  return c;
}

// Two rows with initial states (and a residual when asked): the CPU bitwise tests' case.
Case two_rows(sc_dtype dt, int W, bool residual, int64_t T, int64_t D) {
  Case c;
  c.W = W;
  c.act_dtype = c.state_dtype = dt;
  c.B = 2;
  c.T = T;
  c.D = D;
  c.residual = residual;
  c.h0 = true;
  return c;
}

// Magnitudes worth testing for a dtype whose largest finite value is `max`.
std::vector<double> magnitudes(double max) {
  std::vector<double> m = {0.0, 1e-45, 1e-40, 1e-38, 1e-30, 1e-8, 1e-3, 0.25, 1.0, 2.0, 5.0,
                           9.0, 17.0, 30.0, 80.0, 86.5, 87.5, 88.5, 88.72, 88.8, 89.5, 95.0,
                           103.0, 104.5, 120.0, 700.0, 710.0, 1e3, 6e4, 65504.0, 1e5, 1e10,
                           1e30, 1e37, 1e38, 3e38, 1e300, max};
  std::vector<double> out;
  for (double v : m)
    if (v <= max) out.push_back(v);
  return out;
}

double max_finite(sc_dtype dt) {
  switch (dt) {
    case SC_F16: return 65504.0;
    case SC_BF16: return 3.3895313892515355e38;
    case SC_F32: return double(FLT_MAX);
    default: return DBL_MAX;
  }
}

std::string check_elementwise(const char* what, const std::vector<double>& got,
                              const std::vector<double>& ref, const std::vector<double>& x,
                              double rtol, double atol) {
  if (got.size() != ref.size()) return std::string(what) + ": size differs\n";
  std::string bad;
  int shown = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r)) ok = g == r;
    else ok = std::isfinite(g) && std::fabs(g - r) <= rtol * std::fabs(r) + atol;
    if (!ok && shown++ < 8)
      bad += std::string(what) + "[x=" + std::to_string(x[i]) + "]: got " + std::to_string(g) +
             " (" + std::to_string(std::signbit(g)) + "), oracle " + std::to_string(r) + "\n";
  }
  return bad;
}

TEST_P(ActivationRange, SiluAndIdentityOverEveryDtypesRange) {
  for (sc_dtype dt : {SC_F32, SC_F16, SC_BF16, SC_F64}) {
    std::vector<double> xs;
    for (double m : magnitudes(max_finite(dt))) {
      xs.push_back(m);
      xs.push_back(-m);
    }
    const double inf = std::numeric_limits<double>::infinity();
    xs.push_back(inf);
    xs.push_back(-inf);
    xs.push_back(std::nan(""));
    for (sc_activation act : {SC_ACT_SILU, SC_ACT_NONE}) {
      Case c = pointwise(dt, act, int64_t(xs.size()));
      c.want_dweight = c.want_dbias = false;  // sums over inf/NaN inputs: NaN, nothing to learn
      Inputs in = make_inputs(c);
      in.x = xs;
      in.weight.assign(in.weight.size(), 1.0);
      for (size_t i = 0; i < in.dy.size(); ++i) in.dy[i] = i % 2 ? 0.75 : -1.25;
      const Outputs ref = run(c, in, SC_BACKEND_REF);
      const Outputs got = run(c, in, GetParam());
      ASSERT_TRUE(ref.ok()) << ref.problems();
      ASSERT_TRUE(got.ok()) << got.problems();
      const double rtol = dt == SC_F64 ? 1e-13 : dt == SC_F32 ? 1e-5 : 1e-2;
      // Results below ~1e-35 may flush to zero (float's smallest normal is
      // 1.2e-38; exp(-z) overflows for z < -88.7, sigmoid(z) = 0 there);
      // fp16's subnormal step is 6e-8.
      const double atol = dt == SC_F64 ? 1e-300 : dt == SC_F16 ? 6e-8 : 1e-35;
      const std::string why = check_elementwise("y", got.y, ref.y, xs, rtol, atol) +
                              check_elementwise("dx", got.dx, ref.dx, xs, rtol, atol);
      EXPECT_EQ(why, "") << "dtype " << int(dt) << " activation " << int(act);
    }
  }
}

// Every bf16 and every fp16 value as x (65536 bit patterns each): y = silu(x)
// and dx = dy silu'(x) against the oracle, element by element.  On the CPU
// the stored result is the correctly rounded one or its neighbour (one ulp:
// the forward's cheaper exp for 16-bit outputs is within 2^-13.5 of the
// exact SiLU, below both half-ulps; src/cpu/cpu_simd.hpp, OpsFNarrow), NaN
// where the oracle is NaN, the same infinity, and results below the flush
// bound of the previous test may be zero.  Other backends: that test's
// tolerances (their SiLU approximations are documented in semantics §4).
uint16_t bits_of(double v, sc_dtype dt) {
  return dt == SC_BF16 ? shortconv::f32_to_bf16(float(v)) : shortconv::f32_to_f16(float(v));
}
// Position on the number line: adjacent finite values differ by one.
int32_t ordinal(uint16_t b) { return b & 0x8000 ? -int32_t(b & 0x7fff) : int32_t(b); }

std::string check_ulps(const char* what, const std::vector<double>& got,
                       const std::vector<double>& ref, const std::vector<double>& x, sc_dtype dt,
                       double flush) {
  std::string bad;
  int shown = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    bool ok;
    if (std::isnan(r) || std::isnan(g)) ok = std::isnan(r) && std::isnan(g);
    else if (std::isinf(r) || std::isinf(g)) ok = g == r;
    else if (std::fabs(r) < flush && std::fabs(g) < flush) ok = true;
    else ok = std::abs(ordinal(bits_of(g, dt)) - ordinal(bits_of(r, dt))) <= 1;
    if (!ok && shown++ < 8)
      bad += std::string(what) + "[x=" + std::to_string(x[i]) + "]: got " + std::to_string(g) +
             ", oracle " + std::to_string(r) + "\n";
  }
  return bad;
}

TEST_P(ActivationRange, SiluOfEveryHalfValue) {
  for (sc_dtype dt : {SC_BF16, SC_F16}) {
    std::vector<double> xs(65536);
    for (uint32_t b = 0; b < 65536; ++b) {
      xs[b] = dt == SC_BF16 ? shortconv::bf16_to_f32(uint16_t(b)) : shortconv::f16_to_f32(uint16_t(b));
      // every NaN as the default one: a payload passed through could be the
      // harness's poison, which marks an output element as never written
      if (std::isnan(xs[b])) xs[b] = std::nan("");
    }
    Case c = pointwise(dt, SC_ACT_SILU, int64_t(xs.size()));
    c.want_dweight = c.want_dbias = false;
    Inputs in = make_inputs(c);
    in.x = xs;
    in.weight.assign(in.weight.size(), 1.0);
    for (size_t i = 0; i < in.dy.size(); ++i) in.dy[i] = i % 2 ? 0.75 : -1.25;
    const Outputs ref = run(c, in, SC_BACKEND_REF);
    const Outputs got = run(c, in, GetParam());
    ASSERT_TRUE(ref.ok()) << ref.problems();
    ASSERT_TRUE(got.ok()) << got.problems();
    const double flush = dt == SC_F16 ? 6e-8 : 1e-35;  // as the previous test's atol
    std::string why;
    if (GetParam() == SC_BACKEND_CPU) {
      why = check_ulps("y", got.y, ref.y, xs, dt, flush) + check_ulps("dx", got.dx, ref.dx, xs, dt, flush);
    } else {
      why = check_elementwise("y", got.y, ref.y, xs, 1e-2, flush) +
            check_elementwise("dx", got.dx, ref.dx, xs, 1e-2, flush);
    }
    EXPECT_EQ(why, "") << "dtype " << int(dt);
  }
}

// Terms the formulas do not contain are never formed, and an absent dy
// contributes none (docs/semantics.md §1-2): with NaN and infinite weights in
// some channels, sequences shorter than the window, dy absent or present, every
// output element has the oracle's NaN / infinity class and, where finite, its
// value.  Layouts reach every CUDA path (token-major vector and scalar,
// channel-major, general for W > 16).
TEST_P(ActivationRange, NonFiniteWeightsMeetOnlyRealTerms) {
  const double inf = std::numeric_limits<double>::infinity();
  int cases = 0;
  for (int W : {2, 4, 5, 17})
    for (bool dy : {false, true})
      for (Layout layout : {Layout::token_major, Layout::channel_major})
        for (sc_dtype dt : {SC_F32, SC_BF16}) {
          Case c;
          c.W = W;
          c.S = W;
          c.act_dtype = c.param_dtype = c.state_dtype = dt;
          c.layout = layout;
          c.D = 8;
          c.dy = dy;
          c.h0 = c.ht = c.dht = c.want_dh0 = true;
          if (layout == Layout::token_major) {  // packed, sequences shorter than W
            c.packed = true;
            c.lengths = {1, int64_t(W - 1), 0, 3, int64_t(W + 2), 2};
          } else {  // dense, time axis contiguous (channel-major path: T % 8 == 0)
            c.B = 2;
            c.T = 16;
          }
          c.seed = uint64_t(100 + cases);
          Inputs in = make_inputs(c);
          // channel 1: an infinite oldest tap; channel 3: a NaN newest tap;
          // channel 6: an infinite middle tap and an infinite bias
          in.weight[size_t(1 * W + 0)] = inf;
          in.weight[size_t(3 * W + W - 1)] = std::nan("");
          in.weight[size_t(6 * W + W / 2)] = -inf;
          in.bias[6] = inf;
          const Outputs ref = run(c, in, SC_BACKEND_REF);
          const Outputs got = run(c, in, GetParam());
          ASSERT_TRUE(ref.ok()) << ref.problems();
          ASSERT_TRUE(got.ok()) << got.problems();
          const double rtol = dt == SC_F32 ? 1e-5 : 1e-2;
          auto check = [&](const char* what, const std::vector<double>& g,
                           const std::vector<double>& r) {
            std::vector<double> scale(r.size(), 0.0);
            double norm = 0;
            for (double v : r)
              if (std::isfinite(v)) norm = std::max(norm, std::fabs(v));
            return check_elementwise(what, g, r, scale, rtol, rtol * norm + 1e-30);
          };
          const std::string why = check("y", got.y, ref.y) + check("ht", got.ht, ref.ht) +
                                  check("dx", got.dx, ref.dx) +
                                  check("dweight", got.dweight, ref.dweight) +
                                  check("dbias", got.dbias, ref.dbias) +
                                  check("dh0", got.dh0, ref.dh0);
          EXPECT_EQ(why, "") << c.describe();
          ++cases;
        }
}

// The policies' tanh forms (core/activation.hpp: evaluated on h = pre / 2 by
// a math with kTanhForm) agree with the exp forms and the definition; host
// math in double, so only the algebra is tested.
struct HostMath {
  using V = double;
  static constexpr bool kTanhForm = false;
  static double one() { return 1.0; }
  static double exp(double x) { return std::exp(x); }
  static double div(double a, double b) { return a / b; }
  static double fma(double a, double b, double c) { return std::fma(a, b, c); }
  static double tanh(double h) { return std::tanh(h); }
};
struct HostTanhMath : HostMath {
  static constexpr bool kTanhForm = true;
};

TEST(ActivationPolicy, TanhFormsAgreeWithTheDefinition) {
  using shortconv::Activations;
  using shortconv::with_activation;
  for (int id = 0; id < Activations::kCount; ++id)
    with_activation(id, [&](auto a) {
      using P = decltype(a);
      const double s = P::template scale<HostTanhMath>();
      EXPECT_EQ(P::template scale<HostMath>(), 1.f) << P::kName;
      for (double z = -30; z <= 30; z += 0.37) {
        const double y = P::template value<HostMath>(z), yt = P::template value<HostTanhMath>(s * z);
        const double g = P::template dgrad<HostMath>(1.0, z);
        const double gt = s * P::template dgrad<HostTanhMath>(1.0, s * z);  // dgrad = dpre / scale
        EXPECT_NEAR(yt, y, 1e-12 * (1 + std::fabs(y))) << P::kName << " z=" << z;
        EXPECT_NEAR(gt, g, 1e-12 * (1 + std::fabs(g))) << P::kName << " z=" << z;
        if (id == SC_ACT_SILU) {  // the definition, written out
          EXPECT_NEAR(y, z / (1 + std::exp(-z)), 1e-14 * (1 + std::fabs(z)));
          const double sg = 1 / (1 + std::exp(-z));
          EXPECT_NEAR(g, sg * (1 + z * (1 - sg)), 1e-14);
        }
      }
    });
}

// The avx512bf16 table rounds the bf16 y and dx with vcvtneps2bf16, which
// flushes subnormals (src/cpu/cpu_simd.hpp, Bf16Cvt): its y and dx are
// bitwise the avx512 table's for every bf16 input (x, and dy permuted),
// scaled so that the fp32 results fall on ties, between neighbours
// and below the normal range.
TEST(ActivationCpuIsa, Bf16RoundsAlikeInEveryIsa) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "no AVX-512 BF16 on this processor";
#else
  GTEST_SKIP() << "x86-64 only";
#endif
  const char* outer = std::getenv("SHORTCONV_CPU_ISA");
  const std::string saved = outer ? outer : "";
  std::vector<double> xs(65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    xs[b] = shortconv::bf16_to_f32(uint16_t(b));
    if (std::isnan(xs[b])) xs[b] = std::nan("");  // (not the harness's poison payload)
  }
  // bitwise the same (NaN: both NaN), and how many of a's values are subnormal
  auto compare = [](const std::vector<double>& a, const std::vector<double>& b, int64_t* subnormal) {
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const bool same = std::isnan(a[i]) ? std::isnan(b[i]) : a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]);
      differ += !same;
      *subnormal += a[i] != 0 && !std::isnan(a[i]) && std::abs(a[i]) < FLT_MIN;
    }
    return differ;
  };
  for (sc_activation act : {SC_ACT_NONE, SC_ACT_SILU})
    for (double w : {1.0 + 1.0 / 256, 0.7500001, 0.1875}) {
      Case c = pointwise(SC_BF16, act, int64_t(xs.size()));
      c.param_dtype = SC_F32;
      Inputs in = make_inputs(c);
      ASSERT_EQ(in.x.size(), xs.size());
      ASSERT_EQ(in.dy.size(), xs.size());
      in.x = xs;
      for (size_t i = 0; i < xs.size(); ++i) in.dy[i] = xs[i ^ 0x4000];  // (x of dy's subnormals: 2..4)
      in.weight.assign(in.weight.size(), w);
      setenv("SHORTCONV_CPU_ISA", "avx512", 1);
      const Outputs a = run(c, in, SC_BACKEND_CPU);
      setenv("SHORTCONV_CPU_ISA", "avx512bf16", 1);
      const Outputs b = run(c, in, SC_BACKEND_CPU);
      ASSERT_TRUE(a.ok()) << a.problems();
      ASSERT_TRUE(b.ok()) << b.problems();
      int64_t sub_y = 0, sub_dx = 0;
      EXPECT_EQ(compare(a.y, b.y, &sub_y), 0) << "y, activation " << int(act) << ", weight " << w;
      EXPECT_EQ(compare(a.dx, b.dx, &sub_dx), 0) << "dx, activation " << int(act) << ", weight " << w;
      EXPECT_GT(sub_y, 0) << "the case reaches subnormal y";
      EXPECT_GT(sub_dx, 0) << "the case reaches subnormal dx";
    }
  if (outer) setenv("SHORTCONV_CPU_ISA", saved.c_str(), 1);
  else unsetenv("SHORTCONV_CPU_ISA");
}

// The CPU forward gives the same bits for every tiling (docs/semantics.md
// section 6): forced tiles of 1..9 rows and 64 (ring slots at every phase),
// channel tiles cutting vectors, residual and initial states, every
// register-window width.
TEST(CpuBits, ForwardDoesNotDependOnTheTiling) {
  for (sc_dtype dt : {SC_BF16, SC_F32, SC_F16})
    for (int W : {1, 2, 3, 4})
      for (bool res : {false, true}) {
        Case c = two_rows(dt, W, res, 67, 53);
        c.param_dtype = SC_F32;
        const Inputs in = make_inputs(c);
        const Outputs ref = run(c, in, SC_BACKEND_CPU, kForward);
        ASSERT_TRUE(ref.ok()) << ref.problems();
        for (int64_t tt : {1, 2, 3, 4, 5, 7, 9, 64})
          for (int64_t td : {0, 20}) {
            Case k = c;
            k.tile_t = tt;
            k.tile_d = td;
            const Outputs got = run(k, in, SC_BACKEND_CPU, kForward);
            ASSERT_TRUE(got.ok()) << got.problems();
            int64_t differ = 0;
            for (size_t i = 0; i < ref.y.size(); ++i) differ += !(got.y[i] == ref.y[i]);
            EXPECT_EQ(differ, 0) << "dtype " << int(dt) << " W " << W << " residual " << res
                                 << " tile_t " << tt << " tile_d " << td;
          }
      }
}

// The CPU runs a tile row's full vectors in passes (the sums, the
// activation, the rounding; backward the sums, dpre, then the partials and
// dx) where that measured faster, and in one loop otherwise: rows of more
// than 256 channels (forced wide tiles) in the forward, rows without weight
// gradients in the backward.  Both do the same operations in the same order:
// y and dx are bitwise the same either way.
TEST(CpuBits, RowsInPassesEqualOneLoop) {
  for (sc_dtype dt : {SC_BF16, SC_F32, SC_F16})
    for (int W : {2, 3, 4, 6})
      for (bool res : {false, true}) {
        const Case c = two_rows(dt, W, res, 37, 300);  // D: an automatic tile of 256 channels and one of 44
        const Inputs in = make_inputs(c);
        const Outputs passes = run(c, in, SC_BACKEND_CPU);
        ASSERT_TRUE(passes.ok()) << passes.problems();
        Case wide = c;  // one tile of 300 channels: the forward in one loop
        wide.tile_d = 320;
        Case dx_only = c;  // no weight gradients: the backward in one loop
        dx_only.want_dweight = dx_only.want_dbias = false;
        const Outputs one_fwd = run(wide, in, SC_BACKEND_CPU, kForward);
        const Outputs one_bwd = run(dx_only, in, SC_BACKEND_CPU);
        ASSERT_TRUE(one_fwd.ok()) << one_fwd.problems();
        ASSERT_TRUE(one_bwd.ok()) << one_bwd.problems();
        int64_t dy_ = 0, ddx = 0;
        for (size_t i = 0; i < passes.y.size(); ++i) dy_ += !(one_fwd.y[i] == passes.y[i]);
        for (size_t i = 0; i < passes.dx.size(); ++i) ddx += !(one_bwd.dx[i] == passes.dx[i]);
        EXPECT_EQ(dy_, 0) << "y: dtype " << int(dt) << " W " << W << " residual " << res;
        EXPECT_EQ(ddx, 0) << "dx: dtype " << int(dt) << " W " << W << " residual " << res;
        EXPECT_FALSE(passes.dx.empty());
      }
}

INSTANTIATE_TEST_SUITE_P(Backends, ActivationRange,
                         ::testing::Values(SC_BACKEND_CPU, SC_BACKEND_CUDA), backend_param_name);

}  // namespace
