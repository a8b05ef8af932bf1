// Timing for `shortconv bench`: repetition policy, medians, the copy
// bandwidth of the floor, CUDA-graph replays and the Clock that times one call
// on the run's backend (host: steady_clock; GPU: events on one stream).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#ifdef SHORTCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "harness/harness.hpp"

namespace shortconv::cli {

// How long and how often each measurement runs.
struct Timing {
  int min_reps;            // timed repetitions at least (after warm-up)
  int max_reps;            // ... and at most
  double budget_s;         // stop after min_reps once this much time was spent
  int64_t rotate_bytes;    // rotate buffer copies until the working set reaches this
  int max_copies;          // ... with at most this many copies
};
constexpr Timing kHostTiming = {5, 50, 0.5, int64_t(128) << 20, 8};
constexpr Timing kDeviceTiming = {30, 300, 0.5, int64_t(256) << 20, 16};
constexpr int kGraphCalls = 8;  // CUDA: calls per captured graph (at least; a multiple of the copies)
static_assert(kHostTiming.min_reps >= 1 && kDeviceTiming.min_reps >= 1, "at least one timed rep");

double median(std::vector<double> v);
// Median of timed(i) (i = rep index, for rotation; returns microseconds)
// after one warm-up call, repeated per the timing.
double measure(const Timing& pol, int min_reps, const std::function<double(int)>& timed, int* reps);
// Read + write bytes / s of a multi-threaded memcpy of `bytes` between two
// buffers (the fastest of `reps` after one warm-up: what the memory gives at
// best just then; a shared machine's bandwidth moves by 2x within seconds).
double host_copy_GBps(int threads, size_t bytes = size_t(512) << 20, int reps = 5);
#ifdef SHORTCONV_WITH_CUDA
double device_copy_GBps(cudaStream_t s);
// GPU time per call: `calls` calls of once(i) captured into one graph on s;
// the median replay time (after one warm-up replay) divided by calls.
// Returns NAN (message in *msg) when capture or replay fails.
double graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol, int min_reps,
                int calls, const std::function<void(int)>& once, int* reps, std::string* msg);
// The GPU time of one launch of an empty kernel (latency_kernels.cu), from `calls`
// launches captured into a graph, and of one eager launch between events.
double empty_kernel_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                             int min_reps, int calls, std::string* msg);
double empty_kernel_eager_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1);
// The same empty kernel launched to overlap its predecessor (sc_exec.overlap's
// attribute), waiting for it; NAN (message in *msg) where this build's code
// cannot wait (below sm_90).
double empty_kernel_overlap_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                                     int min_reps, int calls, std::string* msg);
// The index-then-load chain (one hop) launched to overlap its predecessor:
// waiting first (ahead false: SC_OVERLAP_LAUNCH's floor), or after the chain,
// then one more load and the store (ahead true: SC_OVERLAP_READS' floor).
double round_trips_overlap_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                                    int min_reps, int calls, bool ahead, std::string* msg);
// The argument block of the round-trip kernel: its own four arguments; padded
// to the size of the library's Args; as large, with the first address
// computed from values in 12 of its 64-byte lines (latency_kernels.cu).
enum class RefArgsKind { plain, padded, spread };
// The same (graph) for a block that follows `hops` dependent index loads (0 .. 4),
// then loads and stores 16 bytes per thread: 0 hops is one round trip, 1 the
// index-then-row chain of a step on a pool (latency_kernels.cu).
double round_trips_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                            int min_reps, int calls, int hops, RefArgsKind kind, std::string* msg);
// Host time of one eager launch of the index-then-load kernel (the API call
// alone, launches queued back to back), with the argument block `kind`: what
// the block's size costs the calling thread.
double launch_host_us(cudaStream_t s, RefArgsKind kind, std::string* msg);
// The same for one device-to-device copy of bytes / 2 (so `bytes` moved,
// read + written) per call, rotating over `copies` buffer pairs.
double copy_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol, int min_reps,
                     int calls, int64_t bytes, int copies, std::string* msg);
#endif

// Prepared copies of case c (seeds 1, 2, ...) on `stream`, as many as make
// their working set (`footprint` bytes each) reach rotate_bytes, at most
// max_copies: calls rotate over them so that small cases are not timed from
// the cache.  Empty, with *error set, when one cannot be prepared.
std::vector<std::unique_ptr<harness::Prepared>> rotating_copies(const harness::Case& c, int64_t footprint,
                                                                int64_t rotate_bytes, int max_copies,
                                                                sc_backend backend, void* stream,
                                                                std::string* error);

// Times calls on the run's backend and measures the copy bandwidth they are
// compared with: steady_clock and memcpy on the host; on a GPU, events on
// one stream and a device-to-device copy (and, in bench_one, graph replays).
class Clock {
 public:
  Clock(bool device, int threads, Timing* timing) : device_(device) {
#ifdef SHORTCONV_WITH_CUDA
    if (device_) {
      cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      copy_GBps = device_copy_GBps(cs);
      // rotate buffer copies until the working set is 4x the L2 (inputs never timed from L2)
      int dev = 0, l2 = 0;
      if (cudaGetDevice(&dev) == cudaSuccess &&
          cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0)
        timing->rotate_bytes = std::max<int64_t>(timing->rotate_bytes, 4 * int64_t(l2));
      return;
    }
#endif
    (void)timing;
    threads_ = threads;
    copy_GBps = host_copy_GBps(threads);
  }
  // Host backends: the copy bandwidth now (a shorter copy than the run's), for
  // the floor of the row timed next to it.  NAN on a GPU (its copy is stable).
  double copy_now_GBps() const { return device_ ? NAN : host_copy_GBps(threads_, kRowCopyBytes, 3); }
  static constexpr size_t kRowCopyBytes = size_t(256) << 20;  // 8x a 32 MiB L3
  ~Clock() {
#ifdef SHORTCONV_WITH_CUDA
    if (device_) {
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaStreamDestroy(cs);
    }
#endif
  }
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;

  double copy_GBps = NAN;  // read + write
  void* stream() const {
#ifdef SHORTCONV_WITH_CUDA
    return cs;
#else
    return nullptr;
#endif
  }
  // Microseconds f() takes: on a GPU, between events on the stream.
  double time(const std::function<void()>& f) const {
#ifdef SHORTCONV_WITH_CUDA
    if (device_) {
      cudaEventRecord(e0, cs);
      f();
      cudaEventRecord(e1, cs);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return double(ms) * 1e3;
    }
#endif
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
#ifdef SHORTCONV_WITH_CUDA
  cudaStream_t cs = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
#endif

 private:
  bool device_;
  int threads_ = 0;
};

}  // namespace shortconv::cli
