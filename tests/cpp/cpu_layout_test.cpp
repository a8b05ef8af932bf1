// The CPU backend's two kernel families agree: channel-major inputs (time
// axis contiguous) run the time-vectorised kernels, token-major ones the
// channel-vectorised kernels (src/cpu/cpu_kernels_time.hpp, cpu_kernels.hpp),
// and both compute every y, final-state, dx and dinitial_state element with
// the same lane operations, so those outputs are bitwise equal for the same
// logical inputs; dweight and dbias are summed in another order, so they
// agree within the accumulation tolerance (and both match the oracle, which
// the sweeps check).  Random small cases: W in 1..6 and 9 (generic kernels),
// every activation dtype, states with S >= W-1, dht, packed batches with
// empty and short sequences, residual, absent or broadcast dy, forced
// tile_t (pieces longer than the time kernels' 256-row blocks included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cpu/cpu_plan.hpp"
#include "harness/harness.hpp"

namespace {

using namespace shortconv::harness;

// Bitwise equality of two output vectors (values converted exactly from
// their storage dtype): NaN matches NaN, zeros match with their signs.
std::string bitwise(const char* what, const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ; ";
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(b[i])) ||
                      (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]));
    if (!same)
      return std::string(what) + "[" + std::to_string(i) + "]: " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]) + "; ";
  }
  return "";
}

std::string close(const char* what, const std::vector<double>& a, const std::vector<double>& b,
                  double tol) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ; ";
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e <= tol ? "" : std::string(what) + ": rel err " + std::to_string(e) + "; ";
}

Case random_case(std::mt19937_64& rng, int i) {
  Case c;
  const int widths[] = {1, 2, 3, 4, 5, 6, 9};
  c.W = widths[rng() % 7];
  const int sc = int(rng() % 3);
  c.S = sc == 0 ? c.W - 1 : sc == 1 ? c.W : c.W + 2;
  c.act = rng() % 4 ? SC_ACT_SILU : SC_ACT_NONE;
  const sc_dtype dts[] = {SC_F32, SC_BF16, SC_F16, SC_F64};
  c.act_dtype = dts[i % 4];
  c.param_dtype = rng() % 2 ? SC_F32 : c.act_dtype;
  c.state_dtype = rng() % 2 ? SC_F32 : c.act_dtype;
  c.D = 1 + int64_t(rng() % 40);
  c.bias = rng() % 2;
  c.residual = rng() % 3 == 0;
  c.h0 = rng() % 2;
  c.ht = rng() % 2;
  c.dht = rng() % 2;
  c.want_dh0 = rng() % 2;
  c.dy = rng() % 6 != 0;
  c.dy_broadcast = c.dy && rng() % 6 == 0;
  const int tt = int(rng() % 4);
  c.tile_t = tt == 0 ? 0 : tt == 1 ? 1 + int64_t(rng() % 7) : tt == 2 ? 600 : 37;
  if (rng() % 3 == 0) c.tile_d = 16;
  if (rng() % 2) {
    c.packed = true;
    const int n = 1 + int(rng() % 5);
    for (int k = 0; k < n; ++k) {
      const int kind = int(rng() % 4);  // empty, shorter than the window, short, long
      c.lengths.push_back(kind == 0 ? 0 : kind == 1 ? int64_t(rng() % uint64_t(c.W)) :
                          kind == 2 ? int64_t(rng() % 40) : 200 + int64_t(rng() % 400));
    }
  } else {
    c.B = 1 + int64_t(rng() % 2);
    c.T = rng() % 3 ? int64_t(rng() % 50) : 257 + int64_t(rng() % 400);
  }
  c.seed = rng();
  return c;
}

TEST(CpuLayouts, TimeVectorisedEqualsChannelVectorised) {
  std::mt19937_64 rng(4242);
  int bad = 0;
  for (int i = 0; i < 48 && bad < 5; ++i) {
    Case tm = random_case(rng, i);
    Case cm = tm;
    cm.layout = Layout::channel_major;
    const Inputs in = make_inputs(tm);
    const Outputs a = run(tm, in, SC_BACKEND_CPU), b = run(cm, in, SC_BACKEND_CPU);
    ASSERT_TRUE(a.ok()) << a.problems() << tm.describe();
    ASSERT_TRUE(b.ok()) << b.problems() << cm.describe();
    const double tol = tolerance(tm.param_dtype, tm.act_dtype);
    const std::string why = bitwise("y", a.y, b.y) + bitwise("ht", a.ht, b.ht) +
                            bitwise("dx", a.dx, b.dx) + bitwise("dh0", a.dh0, b.dh0) +
                            close("dweight", b.dweight, a.dweight, tol) +
                            close("dbias", b.dbias, a.dbias, tol);
    EXPECT_EQ(why, "") << tm.describe();
    bad += !why.empty();
  }
}

// A time-contiguous x runs tasks of several consecutive chunks of one d-tile
// (Plan::chunk_group, cpu_plan.hpp: each channel read in one long run) when
// the other activations are time-contiguous too; a token-major x keeps one
// chunk per task.  The plan first, then runs whose
// tasks span chunks (forced short tiles, dense and packed with sequences
// across chunk edges): y, ht, dx, dh0 bitwise the token-major's, dweight and
// dbias to rounding (summed along time there, as in the test above).
TEST(CpuLayouts, ForwardTasksSpanChunksOnTimeContiguousX) {
  static char buffer[64] alignas(64);
  auto problem = [&](bool channel_major, shortconv::Dir dir, int64_t tile_t) {
    shortconv::Problem p;
    p.dir = dir;
    p.W = 4;
    p.S = 3;
    p.act_dtype = SC_BF16;
    p.B = p.N = 4;
    p.T = 4096;
    p.D = 2048;
    p.exec.tile_t = tile_t;
    shortconv::View v;
    v.present = true;
    v.data = buffer;
    v.dtype = SC_BF16;
    v.shape[0] = p.B;
    v.shape[1] = p.T;
    v.shape[2] = p.D;
    v.stride[0] = p.T * p.D;
    v.stride[1] = channel_major ? 1 : p.D;
    v.stride[2] = channel_major ? p.T : 1;
    p.x = v;
    if (dir == shortconv::Dir::fwd) p.y = v;
    else p.dy = p.dx = v;
    return p;
  };
  using shortconv::Dir;
  using shortconv::cpu::make_plan;
  const auto cm = make_plan(problem(true, Dir::fwd, 0));
  EXPECT_EQ(cm.chunk_group, shortconv::cpu::Tiling::kTimeTaskRows / cm.tile_t);
  EXPECT_EQ(cm.n_tasks, (cm.n_chunks + cm.chunk_group - 1) / cm.chunk_group * cm.n_dtiles);
  EXPECT_GE(cm.n_tasks, shortconv::cpu::Tiling::kMinTasks);
  EXPECT_EQ(make_plan(problem(false, Dir::fwd, 0)).chunk_group, 1);
  EXPECT_EQ(make_plan(problem(false, Dir::bwd, 0)).chunk_group, 1);
  EXPECT_EQ(make_plan(problem(true, Dir::bwd, 0)).chunk_group, cm.chunk_group);
  EXPECT_EQ(make_plan(problem(true, Dir::bwd, 0)).n_tiles, cm.n_tiles);  // (partial rows: per tile)
  // an activation in the other layout (dy or a residual token-major): no groups
  auto mixed = problem(true, Dir::bwd, 0);
  mixed.dy = problem(false, Dir::bwd, 0).dy;
  EXPECT_EQ(make_plan(mixed).chunk_group, 1);
  mixed = problem(true, Dir::fwd, 0);
  mixed.residual = problem(false, Dir::fwd, 0).x;
  EXPECT_EQ(make_plan(mixed).chunk_group, 1);
  const auto few = make_plan(problem(true, Dir::fwd, 4096));  // 4 chunks x 8 d-tiles: < kMinTasks
  EXPECT_EQ(few.chunk_group, 1);
  EXPECT_EQ(few.n_tasks, few.n_tiles);

  for (bool packed : {false, true})
    for (int64_t tile : {8, 16, 0}) {
      Case tm;
      tm.act_dtype = tm.param_dtype = tm.state_dtype = SC_BF16;
      tm.W = 4;
      tm.S = 3;
      tm.D = 40;
      tm.h0 = tm.ht = tm.residual = tm.dht = tm.want_dh0 = true;
      tm.tile_t = tile;
      if (packed) {
        tm.packed = true;
        tm.lengths = {5, 0, 700, 3, 1300, 2};
      } else {
        tm.B = 2;
        tm.T = 1500;
      }
      Case cmc = tm;
      cmc.layout = Layout::channel_major;
      const Inputs in = make_inputs(tm);
      const Outputs a = run(tm, in, SC_BACKEND_CPU), b = run(cmc, in, SC_BACKEND_CPU);
      ASSERT_TRUE(a.ok()) << a.problems() << tm.describe();
      ASSERT_TRUE(b.ok()) << b.problems() << cmc.describe();
      const double tol = tolerance(tm.param_dtype, tm.act_dtype);
      EXPECT_EQ(bitwise("y", a.y, b.y) + bitwise("ht", a.ht, b.ht) + bitwise("dx", a.dx, b.dx) +
                    bitwise("dh0", a.dh0, b.dh0) + close("dweight", b.dweight, a.dweight, tol) +
                    close("dbias", b.dbias, a.dbias, tol),
                "")
          << cmc.describe();
    }
}

// vLLM's speculative step with its (batch, dim, seqlen) x: a channel-first x
// (and y, residual) whose channel stride is at most kDecodeMaxTokens runs the
// decode kernel, staged token-major per block (cpu_kernels_decode.hpp); one
// whose channels lie further apart keeps the time-vectorised tiles
// (decode_shaped).  The plan first; then every draft count K = 1..4 on vLLM
// and [P, D, S] rows, bf16 and fp32, pad slots, accepted counts 1..K+1, a
// residual, 300 channels (two blocks, a partial vector), dense (the kernel)
// and packed (the tiles): y and the pool bitwise the token-major step's, and
// the oracle agrees.
TEST(CpuLayouts, ChannelFirstDecodeStepsEqualTokenMajor) {
  static char buffer[64] alignas(64);
  auto problem = [&](int64_t channel_stride) {  // 0: token-major
    shortconv::Problem p;
    p.dir = shortconv::Dir::fwd;
    p.W = 4;
    p.S = 3;
    p.act_dtype = p.param_dtype = SC_BF16;
    p.B = p.N = 8;
    p.T = 4;
    p.D = 4096;
    shortconv::View v;
    v.present = true;
    v.data = buffer;
    v.dtype = SC_BF16;
    v.shape[0] = p.B;
    v.shape[1] = p.T;
    v.shape[2] = p.D;
    v.stride[0] = p.D * std::max<int64_t>(channel_stride, p.T);
    v.stride[1] = channel_stride ? 1 : p.D;
    v.stride[2] = channel_stride ? channel_stride : 1;
    p.x = p.y = v;
    return p;
  };
  using shortconv::cpu::make_run_plan;
  using shortconv::cpu::Tiling;
  EXPECT_TRUE(make_run_plan(problem(0)).decode);
  EXPECT_TRUE(make_run_plan(problem(4)).decode);  // (batch, dim, seqlen), contiguous
  EXPECT_TRUE(make_run_plan(problem(Tiling::kDecodeMaxTokens)).decode);
  EXPECT_FALSE(make_run_plan(problem(Tiling::kDecodeMaxTokens + 1)).decode);

  std::mt19937_64 rng(4244);
  for (int K = 1; K <= 4; ++K)
    for (bool vllm_rows : {true, false})
      for (sc_dtype dt : {SC_BF16, SC_F32})
        for (bool packed : {false, true}) {
          Case tm;
          tm.W = 4;
          tm.S = tm.W - 1 + K;
          tm.act_dtype = tm.param_dtype = tm.state_dtype = dt;
          tm.D = 300;
          tm.residual = K % 2 == 0;
          tm.state_transposed = vllm_rows;
          const int64_t B = 9, T = K + 1;
          if (packed) {
            tm.packed = true;
            tm.lengths.assign(size_t(B), T);
          } else {
            tm.B = B;
            tm.T = T;
          }
          tm.h0 = tm.ht = tm.in_place = true;
          tm.pool = B + 3;
          tm.pad_index = tm.pool + 1;
          for (int64_t n = 0; n < B; ++n) {
            tm.h0_index.push_back(n % 4 == 3 ? (n % 8 == 3 ? -1 : tm.pad_index) : (n * 5) % tm.pool);
            tm.accepted.push_back(1 + int64_t(rng() % uint64_t(T)));
          }
          tm.ht_index = tm.h0_index;
          tm.want_dx = tm.want_dweight = tm.want_dbias = tm.want_dh0 = false;
          tm.seed = rng();
          Case cm = tm;
          cm.layout = Layout::channel_major;
          const Inputs in = make_inputs(tm);
          const Outputs a = run(tm, in, SC_BACKEND_CPU, kForward), b = run(cm, in, SC_BACKEND_CPU, kForward);
          ASSERT_TRUE(a.ok()) << a.problems() << tm.describe();
          ASSERT_TRUE(b.ok()) << b.problems() << cm.describe();
          EXPECT_EQ(bitwise("y", a.y, b.y) + bitwise("ht", a.ht, b.ht), "") << cm.describe();
          EXPECT_EQ(compare(cm, b, run(cm, in, SC_BACKEND_REF, kForward)), "") << cm.describe();
        }
}

}  // namespace
