// CPU backend instruction-count probe (not a test, not a benchmark of time):
// `reps` forward + backward calls of one fixed small problem through the C
// ABI, one thread, for `valgrind --tool=callgrind`, whose instruction counts
// do not move with the load of a shared machine as wall clock does.  The
// cost of one forward + backward is (count at reps 3 - count at reps 1) / 2,
// which cancels the set-up; callgrind's per-function counts (fwd_piece,
// bwd_piece, ...) split it.  SHORTCONV_CPU_ISA picks the kernels.
//
//   cpu_probe [dtype(f32|bf16|f16) layout(tm|cm) reps B T D W]
//   defaults:  bf16 tm 1, dense 1x2048x512, W=4, SiLU, bias, initial state,
//              dx, dweight, dbias, dinitial_state
//
// It prints a checksum of every output (FNV-1a over the bytes), so two trees
// can also be compared bit for bit on the same problem.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shortconv/shortconv.h"

namespace {

sc_tensor act3(void* p, sc_dtype dt, int64_t B, int64_t T, int64_t D, bool cm) {
  sc_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = 3;
  t.shape[0] = B; t.shape[1] = T; t.shape[2] = D;
  if (cm) { t.stride[0] = D * T; t.stride[1] = 1; t.stride[2] = T; }
  else { t.stride[0] = T * D; t.stride[1] = D; t.stride[2] = 1; }
  return t;
}

sc_tensor dense(void* p, sc_dtype dt, std::vector<int64_t> shape) {
  sc_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = int(shape.size());
  int64_t s = 1;
  for (int i = t.ndim; i-- > 0;) {
    t.shape[i] = shape[size_t(i)];
    t.stride[i] = s;
    s *= shape[size_t(i)];
  }
  return t;
}

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Values of both signs around the activation's interesting range, as the raw
// bits of the dtype (deterministic, no zeros).
void fill(std::vector<unsigned char>& buf, sc_dtype dt, uint32_t seed) {
  const size_t n = buf.size() / (dt == SC_F32 ? 4 : 2);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = uint32_t(i * 2654435761u + seed * 40503u) >> 8;
    const float v = (float(r % 20001) - 10000.f) * 4e-4f + 1e-3f;  // [-4, 4]
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (dt == SC_F32) std::memcpy(&buf[i * 4], &u, 4);
    else {
      uint16_t h;
      if (dt == SC_BF16) h = uint16_t(u >> 16);
      else h = uint16_t(((r % 20001) < 10000 ? 0x8000 : 0) | (0x3000 + (r % 0x1000)));  // f16
      std::memcpy(&buf[i * 2], &h, 2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dts = argc > 1 ? argv[1] : "bf16", lay = argc > 2 ? argv[2] : "tm";
  const int reps = argc > 3 ? std::atoi(argv[3]) : 1;
  const int64_t B = argc > 4 ? std::atoll(argv[4]) : 1, T = argc > 5 ? std::atoll(argv[5]) : 2048,
                D = argc > 6 ? std::atoll(argv[6]) : 512;
  const int W = argc > 7 ? std::atoi(argv[7]) : 4;
  const sc_dtype dt = dts == "f32" ? SC_F32 : dts == "f16" ? SC_F16 : SC_BF16;
  const bool cm = lay == "cm";
  const size_t es = dt == SC_F32 ? 4 : 2, n = size_t(B * T * D);
  std::vector<unsigned char> x(n * es), y(n * es), dy(n * es), dx(n * es);
  fill(x, dt, 1);
  fill(dy, dt, 2);
  std::vector<float> w(size_t(D * W)), bias(static_cast<size_t>(D)), h0(size_t(B * D * (W - 1)) + 1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * float(int(i % 7) - 3) + 0.01f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.02f * float(int(i % 5) - 2);
  for (size_t i = 0; i < h0.size(); ++i) h0[i] = 0.1f * float(int(i % 9) - 4);
  std::vector<float> dw(w.size()), db(bias.size()), dh0(h0.size());

  sc_conv_args a;
  sc_conv_args_init(&a);
  a.width = W;
  a.activation = SC_ACT_SILU;
  a.x = act3(x.data(), dt, B, T, D, cm);
  a.weight = dense(w.data(), SC_F32, {D, W});
  a.bias = dense(bias.data(), SC_F32, {D});
  if (W > 1) a.initial_state = dense(h0.data(), SC_F32, {B, D, W - 1});
  a.exec.num_threads = 1;
  sc_conv_args g = a;
  a.y = act3(y.data(), dt, B, T, D, cm);
  g.dy = act3(dy.data(), dt, B, T, D, cm);
  g.dx = act3(dx.data(), dt, B, T, D, cm);
  g.dweight = dense(dw.data(), SC_F32, {D, W});
  g.dbias = dense(db.data(), SC_F32, {D});
  if (W > 1) g.dinitial_state = dense(dh0.data(), SC_F32, {B, D, W - 1});
  sc_error err;
  size_t wsf = 0, wsb = 0;
  if (sc_forward_workspace_size(&a, &wsf, &err) != SC_OK || sc_backward_workspace_size(&g, &wsb, &err) != SC_OK) {
    std::printf("workspace: %s\n", err.message);
    return 1;
  }
  std::vector<char> ws(std::max(wsf, wsb));
  a.exec.workspace = g.exec.workspace = ws.data();
  a.exec.workspace_bytes = g.exec.workspace_bytes = ws.size();
  for (int r = 0; r < reps; ++r) {
    if (sc_forward(&a, &err) != SC_OK || sc_backward(&g, &err) != SC_OK) {
      std::printf("call: %s\n", err.message);
      return 1;
    }
  }
  std::printf("%s %s %lldx%lldx%lld W=%d reps=%d  y %016llx dx %016llx dweight %016llx dbias %016llx dh0 %016llx\n",
              dts.c_str(), cm ? "cm" : "tm", (long long)B, (long long)T, (long long)D, W, reps,
              (unsigned long long)fnv(y.data(), y.size()), (unsigned long long)fnv(dx.data(), dx.size()),
              (unsigned long long)fnv(dw.data(), dw.size() * 4), (unsigned long long)fnv(db.data(), db.size() * 4),
              (unsigned long long)fnv(dh0.data(), dh0.size() * 4));
  return 0;
}
