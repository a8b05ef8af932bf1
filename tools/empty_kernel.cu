// An empty kernel for `shortconv bench`'s decode section: the GPU time of one
// launch that does nothing, measured in the same run as the decode steps it is
// compared with (a decode step of a few hundred KB is bounded by launch
// latency, not bandwidth).
#include <cuda_runtime.h>

#include "bench_clock.hpp"

namespace shortconv::cli {

namespace {

__global__ void empty_kernel() {}

}  // namespace

double empty_kernel_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                             int min_reps, int calls, std::string* msg) {
  int reps = 0;
  return graph_us(s, e0, e1, pol, min_reps, calls,
                  [&](int) { empty_kernel<<<1, 1, 0, s>>>(); }, &reps, msg);
}

double empty_kernel_eager_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1) {
  std::vector<double> t;
  for (int i = 0; i < 51; ++i) {
    cudaEventRecord(e0, s);
    empty_kernel<<<1, 1, 0, s>>>();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) t.push_back(double(ms) * 1e3);  // the first is the warm-up
  }
  return median(t);
}

}  // namespace shortconv::cli
