// CPU backend micro-benchmark (not a test): times forward and forward+backward
// on a dense token-major problem and compares with a 2-thread memcpy measured
// in the same run.  floor = bytes that must move / copy bandwidth, where
// copy bandwidth = (read + written bytes) / memcpy time; forward moves 2
// x-sized tensors (x, y), forward+backward 5 (x, y, x, dy, dx).
//
//   cpu_bench [B T D W dtype(f32|bf16|f16) threads act(0|1) iters layout(tm|cm) clock(wall|cpu)
//              tile_t tile_d]   (0 = automatic)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shortconv/shortconv.h"

// On a shared machine wall time includes other processes' time slices, so
// every measurement also records process CPU time: cpu/threads is the time an
// unshared machine would take (an upper bound: OpenMP barrier spinning counts).
static double g_threads = 1;
static bool g_cpu_clock = false;
static double now() {
  if (g_cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec + ts.tv_nsec * 1e-9) / g_threads;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static sc_tensor t3(void* p, sc_dtype dt, int64_t B, int64_t T, int64_t D, bool cm) {
  sc_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = 3;
  t.shape[0] = B; t.shape[1] = T; t.shape[2] = D;
  if (cm) { t.stride[0] = D * T; t.stride[1] = 1; t.stride[2] = T; }
  else { t.stride[0] = T * D; t.stride[1] = D; t.stride[2] = 1; }
  return t;
}

// The fastest of `iters` copies of `bytes` from src to dst, `threads` threads
// each copying its slice.
static double copy_seconds(char* dst, const char* src, size_t bytes, int threads, int iters) {
  double tcopy = 1e9;
  for (int it = 0; it < iters; ++it) {
    double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      const int id = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t a = bytes * id / nt, b = bytes * (id + 1) / nt;
      std::memcpy(dst + a, src + a, b - a);
    }
    tcopy = std::min(tcopy, now() - t0);
  }
  return tcopy;
}

// The fastest forward (*tf) and backward (*tb) of `iters` calls each; false
// (message printed) when a call fails.
static bool time_calls(const sc_conv_args& fwd, const sc_conv_args& bwd, int iters, double* tf,
                       double* tb) {
  sc_error err;
  for (int it = 0; it < iters; ++it) {
    double t0 = now();
    if (sc_forward(&fwd, &err) != SC_OK) { std::printf("forward: %s\n", err.message); return false; }
    double t1 = now();
    if (sc_backward(&bwd, &err) != SC_OK) { std::printf("backward: %s\n", err.message); return false; }
    double t2 = now();
    *tf = std::min(*tf, t1 - t0);
    *tb = std::min(*tb, t2 - t1);
  }
  return true;
}

int main(int argc, char** argv) {
  int64_t B = 4, T = 4096, D = 2048;
  int W = 4, threads = 2, act = 1, iters = 10;
  std::string dts = "bf16", lay = "tm";
  if (argc > 1) B = atoll(argv[1]);
  if (argc > 2) T = atoll(argv[2]);
  if (argc > 3) D = atoll(argv[3]);
  if (argc > 4) W = atoi(argv[4]);
  if (argc > 5) dts = argv[5];
  if (argc > 6) threads = atoi(argv[6]);
  if (argc > 7) act = atoi(argv[7]);
  if (argc > 8) iters = atoi(argv[8]);
  if (argc > 9) lay = argv[9];
  const sc_dtype dt = dts == "f32" ? SC_F32 : dts == "f16" ? SC_F16 : SC_BF16;
  const size_t es = dt == SC_F32 ? 4 : 2, n = size_t(B * T * D), bytes = n * es;
  const bool cm = lay == "cm";
  if (argc > 10) g_cpu_clock = std::string(argv[10]) == "cpu";
  g_threads = threads;

  std::vector<uint16_t> init(bytes / 2);
  for (size_t i = 0; i < init.size(); ++i) init[i] = uint16_t(0x3c00 + (i * 2654435761u >> 20) % 512);
  char *x = (char*)aligned_alloc(64, bytes), *y = (char*)aligned_alloc(64, bytes),
       *dy = (char*)aligned_alloc(64, bytes), *dx = (char*)aligned_alloc(64, bytes);
  std::memcpy(x, init.data(), bytes);
  std::memcpy(dy, init.data(), bytes);
  std::memset(y, 0, bytes);
  std::memset(dx, 0, bytes);
  std::vector<float> w(static_cast<size_t>(D * W), 0.1f), bias(static_cast<size_t>(D), 0.01f);
  std::vector<float> dw(static_cast<size_t>(D * W)), db(static_cast<size_t>(D));

  const double tcopy = copy_seconds(y, x, bytes, threads, iters);
  const double bw = 2.0 * bytes / tcopy;

  sc_conv_args a;
  sc_conv_args_init(&a);
  a.width = W;
  a.activation = act;
  a.x = t3(x, dt, B, T, D, cm);
  a.weight = sc_tensor{w.data(), SC_F32, 2, {D, W}, {W, 1}};
  a.bias = sc_tensor{bias.data(), SC_F32, 1, {D}, {1}};
  a.y = t3(y, dt, B, T, D, cm);
  a.exec.num_threads = threads;
  if (argc > 11) a.exec.tile_t = atoll(argv[11]);
  if (argc > 12) a.exec.tile_d = atoll(argv[12]);
  sc_error err;
  size_t wsf = 0, wsb = 0;
  sc_forward_workspace_size(&a, &wsf, &err);
  sc_conv_args g = a;
  g.y = sc_tensor{};
  g.dy = t3(dy, dt, B, T, D, cm);
  g.dx = t3(dx, dt, B, T, D, cm);
  g.dweight = sc_tensor{dw.data(), SC_F32, 2, {D, W}, {W, 1}};
  g.dbias = sc_tensor{db.data(), SC_F32, 1, {D}, {1}};
  sc_backward_workspace_size(&g, &wsb, &err);
  std::vector<char> ws(std::max(wsf, wsb) + 64);
  a.exec.workspace = g.exec.workspace = ws.data();
  a.exec.workspace_bytes = g.exec.workspace_bytes = ws.size();

  double tf = 1e9, tb = 1e9;
  if (!time_calls(a, g, iters, &tf, &tb)) return 1;
  const double ff = 2.0 * bytes / bw, fb = 5.0 * bytes / bw;
  std::printf("clock: %s\n", g_cpu_clock ? "process CPU time / threads" : "wall");
  std::printf("shape %lldx%lldx%lld W=%d %s %s act=%d threads=%d  ws fwd %zu B, bwd %zu B\n",
              (long long)B, (long long)T, (long long)D, W, dts.c_str(), cm ? "channel-major" : "token-major",
              act, threads, wsf, wsb);
  std::printf("memcpy   %9.1f us  %6.2f GB/s (read+write)\n", tcopy * 1e6, bw / 1e9);
  std::printf("forward  %9.1f us  %6.2f GB/s  floor %9.1f us  fraction %.3f\n", tf * 1e6,
              2.0 * bytes / tf / 1e9, ff * 1e6, ff / tf);
  std::printf("backward %9.1f us  %6.2f GB/s\n", tb * 1e6, 3.0 * bytes / tb / 1e9);
  std::printf("fwd+bwd  %9.1f us  %6.2f GB/s  floor %9.1f us  fraction %.3f\n", (tf + tb) * 1e6,
              5.0 * bytes / (tf + tb) / 1e9, fb * 1e6, fb / (tf + tb));
  return 0;
}
