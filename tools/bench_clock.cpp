// Timing for `shortconv bench` (bench_clock.hpp).
#include "bench_clock.hpp"

#include <algorithm>
#include <cstring>

#include <omp.h>

namespace shortconv::cli {

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median of timed(i) (i = rep index, for rotation; returns microseconds)
// after one warm-up call, repeated per the timing.
double measure(const Timing& pol, int min_reps, const std::function<double(int)>& timed, int* reps) {
  timed(0);  // warm-up (first touch, lazy init, caches)
  std::vector<double> t;
  double spent = 0;
  for (int i = 0; i < pol.max_reps; ++i) {
    const double us = timed(i + 1);
    t.push_back(us);
    spent += us * 1e-6;
    if (int(t.size()) >= min_reps && spent >= pol.budget_s) break;
    if (spent >= 4 * pol.budget_s) break;  // a slow backend (the oracle): a few reps suffice
  }
  *reps = int(t.size());
  return median(t);
}

double host_copy_GBps(int threads, size_t bytes, int reps) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  auto once = [&]() {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int k = 0; k < nt; ++k) {
      const size_t lo = bytes * size_t(k) / size_t(nt), hi = bytes * size_t(k + 1) / size_t(nt);
      std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  once();
  double best = INFINITY;
  for (int i = 0; i < reps; ++i) best = std::min(best, once());
  return 2.0 * double(bytes) / best / 1e9;  // read + write
}

#ifdef SHORTCONV_WITH_CUDA
double device_copy_GBps(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return NAN;
  }
  cudaMemsetAsync(a, 1, bytes, s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0, s);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) t.push_back(ms * 1e-3);  // the first two are warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / median(t) / 1e9;  // read + write
}

// GPU time per call: `calls` calls of once(i) captured into one graph on s;
// the median replay time (after one warm-up replay) divided by calls.
// Returns NAN (message in *msg) when capture or replay fails.
double graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol, int min_reps,
                int calls, const std::function<void(int)>& once, int* reps, std::string* msg) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    *msg = "cudaStreamBeginCapture failed";
    return NAN;
  }
  for (int i = 0; i < calls; ++i) once(i);
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
  if (e != cudaSuccess) {
    *msg = std::string("graph capture: ") + cudaGetErrorString(e);
    if (g) cudaGraphDestroy(g);
    return NAN;
  }
  auto replay = [&](int) {
    cudaEventRecord(e0, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) * 1e3;
  };
  Timing p = pol;
  p.budget_s = pol.budget_s * calls;  // measure() counts replay time; keep the per-call budget
  const double us = measure(p, min_reps, replay, reps) / calls;
  e = cudaGetLastError();
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    *msg = std::string("graph replay: ") + cudaGetErrorString(e);
    return NAN;
  }
  return us;
}
#endif

std::vector<std::unique_ptr<harness::Prepared>> rotating_copies(const harness::Case& c, int64_t footprint,
                                                                int64_t rotate_bytes, int max_copies,
                                                                sc_backend backend, void* stream,
                                                                std::string* error) {
  const int copies = int(std::clamp<int64_t>(
      (rotate_bytes + footprint - 1) / std::max<int64_t>(footprint, 1), 1, max_copies));
  std::vector<std::unique_ptr<harness::Prepared>> ps;
  try {
    for (int i = 0; i < copies; ++i) {
      harness::Case ci = c;
      ci.seed = uint64_t(i + 1);
      ps.push_back(std::make_unique<harness::Prepared>(ci, nullptr, backend));
      ps.back()->set_stream(stream);
    }
  } catch (const std::exception& e) {
    *error = e.what();
    ps.clear();
  }
  return ps;
}

}  // namespace shortconv::cli
