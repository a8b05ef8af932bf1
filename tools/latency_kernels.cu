// Reference kernels for `shortconv bench`'s decode section, measured in the
// same run as the decode steps they are compared with (a decode step of a few
// hundred KB is bounded by latency, not bandwidth):
// - an empty kernel: the GPU time of one launch that does nothing;
// - round trips: one block of kDecodeRefThreads threads that follows `hops`
//   dependent index loads, then loads 16 bytes per thread at the index found
//   and stores them.  hops = 0 is one round trip (load, store); hops = 1 is
//   the shape of a decode step on a pool (the row index, then the row) with
//   nothing else: the latency floor of any kernel that addresses its rows
//   through indices read on the device.  Its buffers are a few KB, so their
//   lines stay in L2 across replays, like a small step's rows.  The same
//   kernel taking an argument block the size of the library's (`Args`,
//   passed by value to every CUDA kernel): what the launch of a step pays
//   for its parameters alone, on the GPU and, timed by the host clock around
//   back-to-back eager launches, in the calling thread; and the same block
//   with the chain's first address computed from 12 of its lines: what
//   reading parameters spread over the block costs before the first load;
// - the same kernels launched to overlap the kernel before them (sc_exec.overlap,
//   programmatic dependent launch, sm_90 and newer), each a copy of itself:
//   the empty kernel waiting for its predecessor; the index-then-load chain
//   waiting first (SC_OVERLAP_LAUNCH's floor); and the chain issued before the
//   wait, then one more load (x) after it and the store (SC_OVERLAP_READS'
//   floor: a step whose rows were read ahead still loads x after the wait);
// - a copy of a step's bytes: half of them read and half written by one
//   device-to-device cudaMemcpyAsync (the copy that measures the bandwidth
//   floor), rotating over as many buffer pairs as the step rotates copies.
//   Its time is what a single launch moving those bytes takes at that size,
//   launch and ramp included: the floor's bandwidth is that of a 1 GB copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_clock.hpp"
#include "cuda/common.cuh"  // (sizeof(cuda::Args) only)

namespace shortconv::cli {

namespace {

constexpr int kRefThreads = 128;   // one decode block's threads
constexpr int kRefMaxHops = 4;     // chain length bound (the index buffer's entries)

__global__ void empty_kernel() {}

__global__ void empty_wait_kernel() { cuda::overlap_wait(); }

// idx: [kRefMaxHops + 1] int64, idx[i] = i + 1; src, dst: [(kRefMaxHops + 2) * kRefThreads] 16-byte vectors
__global__ void round_trips_kernel(const int64_t* idx, const uint4* src, uint4* dst, int hops) {
  int64_t i = 0;
  for (int h = 0; h < hops; ++h) i = idx[i];  // each load's address is the previous load's value
  dst[i * kRefThreads + threadIdx.x] = src[i * kRefThreads + threadIdx.x];
}

// round_trips_kernel waiting for the previous kernel: first (ahead = 0), or
// after the chain's loads, then loading one more vector (x) past the chain's
// (ahead = 1).
__global__ void round_trips_wait_kernel(const int64_t* idx, const uint4* src, uint4* dst, int hops,
                                        int ahead) {
  if (!ahead) cuda::overlap_wait();
  int64_t i = 0;
  for (int h = 0; h < hops; ++h) i = idx[i];
  uint4 v = src[i * kRefThreads + threadIdx.x];
  if (ahead) {
    cuda::overlap_wait();
    const uint4 x = src[(kRefMaxHops + 1) * kRefThreads + threadIdx.x];
    v.x ^= x.x;
    v.y ^= x.y;
    v.z ^= x.z;
    v.w ^= x.w;
  }
  dst[i * kRefThreads + threadIdx.x] = v;
}

// round_trips_kernel's arguments padded to the library's argument block.
struct RefArgs {
  const int64_t* idx;
  const uint4* src;
  uint4* dst;
  int hops;
};
struct RefArgsPadded : RefArgs {
  unsigned char pad[sizeof(cuda::Args) - sizeof(RefArgs)];
};
static_assert(sizeof(RefArgsPadded) >= sizeof(cuda::Args), "as large as the library's block");
// ... and with kSpreadLines zero offsets kSpreadBytes apart, each in a 64-byte
// line of its own, added to the chain's first address: a kernel that reads
// its parameters from that many lines of a fresh block before its first load
// (a decode step reads its sizes, indices and state tensors from 7 of Args'
// 22 lines before its row index's load; each first read of a line in a
// launch misses the constant cache).
constexpr int kSpreadLines = 12, kSpreadBytes = 112;
struct RefArgsSpread : RefArgs {
  struct Line {
    int64_t v;
    unsigned char pad[kSpreadBytes - sizeof(int64_t)];
  } line[kSpreadLines];
};
static_assert(sizeof(RefArgsSpread) <= sizeof(cuda::Args) + 64, "about the library's block");

__global__ void round_trips_padded_kernel(const RefArgsPadded a) {
  int64_t i = 0;
  for (int h = 0; h < a.hops; ++h) i = a.idx[i];
  a.dst[i * kRefThreads + threadIdx.x] = a.src[i * kRefThreads + threadIdx.x];
}

__global__ void round_trips_spread_kernel(const RefArgsSpread a) {
  int64_t i = 0;
#pragma unroll
  for (int j = 0; j < kSpreadLines; ++j) i += a.line[j].v;  // (zeros)
  for (int h = 0; h < a.hops; ++h) i = a.idx[i];
  a.dst[i * kRefThreads + threadIdx.x] = a.src[i * kRefThreads + threadIdx.x];
}

// A launch configuration carrying the programmatic-stream-serialization
// attribute (what the library attaches for sc_exec.overlap).
struct OverlappedConfig {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t c;
  const cudaLaunchConfig_t* cfg() {
    c.attrs = attr;
    return &c;
  }
};
OverlappedConfig overlapped_config(dim3 grid, dim3 block, cudaStream_t s) {
  OverlappedConfig o{};
  o.attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  o.attr[0].val.programmaticStreamSerializationAllowed = 1;
  o.c.gridDim = grid;
  o.c.blockDim = block;
  o.c.stream = s;
  o.c.numAttrs = 1;
  return o;
}

// Whether this build's kernels can wait for their predecessor on this device
// (code compiled for sm_90 or newer: what the library checks before it
// attaches the attribute).
bool overlap_supported() {
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, empty_wait_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.ptxVersion >= 90;
}

// The index chain's buffers (idx[i] = i + 1; src zeroed), freed on scope exit.
struct RefBuffers {
  int64_t* idx = nullptr;
  uint4 *src = nullptr, *dst = nullptr;
  bool ok = false;
  RefBuffers() {
    int64_t host_idx[kRefMaxHops + 1];
    for (int i = 0; i <= kRefMaxHops; ++i) host_idx[i] = i + 1;
    const size_t vec_bytes = size_t(kRefMaxHops + 2) * kRefThreads * sizeof(uint4);
    ok = cudaMalloc(&idx, sizeof(host_idx)) == cudaSuccess && cudaMalloc(&src, vec_bytes) == cudaSuccess &&
         cudaMalloc(&dst, vec_bytes) == cudaSuccess &&
         cudaMemcpy(idx, host_idx, sizeof(host_idx), cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(src, 0, vec_bytes) == cudaSuccess;
  }
  ~RefBuffers() {
    cudaFree(idx);
    cudaFree(src);
    cudaFree(dst);
  }
  RefBuffers(const RefBuffers&) = delete;
  RefBuffers& operator=(const RefBuffers&) = delete;
  // One launch of round_trips_wait_kernel on s with the overlap attribute.
  cudaError_t launch_overlapped(cudaStream_t s, int hops, int ahead) const {
    return cudaLaunchKernelEx(overlapped_config(dim3(1), dim3(kRefThreads), s).cfg(),
                              round_trips_wait_kernel, static_cast<const int64_t*>(idx),
                              static_cast<const uint4*>(src), dst, hops, ahead);
  }
  // One launch of the chain kernel on s, with the argument block `kind`.
  void launch(cudaStream_t s, int hops, RefArgsKind kind) const {
    const RefArgs r{idx, src, dst, hops};
    if (kind == RefArgsKind::padded) {
      RefArgsPadded a{};
      static_cast<RefArgs&>(a) = r;
      round_trips_padded_kernel<<<1, kRefThreads, 0, s>>>(a);
    } else if (kind == RefArgsKind::spread) {
      RefArgsSpread a{};
      static_cast<RefArgs&>(a) = r;
      round_trips_spread_kernel<<<1, kRefThreads, 0, s>>>(a);
    } else {
      round_trips_kernel<<<1, kRefThreads, 0, s>>>(idx, src, dst, hops);
    }
  }
};

}  // namespace

double empty_kernel_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                             int min_reps, int calls, std::string* msg) {
  int reps = 0;
  return graph_us(s, e0, e1, pol, min_reps, calls,
                  [&](int) { empty_kernel<<<1, 1, 0, s>>>(); }, &reps, msg);
}

double empty_kernel_overlap_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                                     int min_reps, int calls, std::string* msg) {
  if (!overlap_supported()) {
    *msg = "overlap: this build's kernels are not compiled for sm_90 or newer";
    return NAN;
  }
  int reps = 0;
  return graph_us(s, e0, e1, pol, min_reps, calls,
                  [&](int) { (void)cudaLaunchKernelEx(overlapped_config(dim3(1), dim3(1), s).cfg(), empty_wait_kernel); },
                  &reps, msg);
}

double round_trips_overlap_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                                    int min_reps, int calls, bool ahead, std::string* msg) {
  if (!overlap_supported()) {
    *msg = "overlap: this build's kernels are not compiled for sm_90 or newer";
    return NAN;
  }
  const RefBuffers buf;
  if (!buf.ok) {
    *msg = "round trips: buffers not allocated";
    return NAN;
  }
  int reps = 0;
  return graph_us(s, e0, e1, pol, min_reps, calls, [&](int) { (void)buf.launch_overlapped(s, 1, ahead ? 1 : 0); },
                  &reps, msg);
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

double round_trips_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol,
                            int min_reps, int calls, int hops, RefArgsKind kind, std::string* msg) {
  if (hops < 0 || hops > kRefMaxHops) {
    *msg = "round trips: hops out of range";
    return NAN;
  }
  const RefBuffers buf;
  if (!buf.ok) {
    *msg = "round trips: buffers not allocated";
    return NAN;
  }
  int reps = 0;
  return graph_us(s, e0, e1, pol, min_reps, calls, [&](int) { buf.launch(s, hops, kind); },
                  &reps, msg);
}

double launch_host_us(cudaStream_t s, RefArgsKind kind, std::string* msg) {
  const RefBuffers buf;
  if (!buf.ok) {
    *msg = "launch host time: buffers not allocated";
    return NAN;
  }
  constexpr int kBatch = 64, kBatches = 21;  // a batch fits the launch queue: the host never waits
  std::vector<double> t;
  for (int r = 0; r <= kBatches; ++r) {
    cudaStreamSynchronize(s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) buf.launch(s, 1, kind);
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kBatch);
  }
  cudaStreamSynchronize(s);
  return median(t);
}

double copy_graph_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const Timing& pol, int min_reps,
                     int calls, int64_t bytes, int copies, std::string* msg) {
  const size_t half = size_t((bytes / 2 + 15) / 16 * 16);  // read, and written
  std::vector<void*> buf(size_t(2 * std::max(copies, 1)), nullptr);
  bool ok = half > 0;
  for (void*& b : buf) ok = ok && cudaMalloc(&b, half) == cudaSuccess && cudaMemset(b, 1, half) == cudaSuccess;
  double us = NAN;
  if (ok) {
    int reps = 0;
    const int pairs = int(buf.size() / 2);
    us = graph_us(s, e0, e1, pol, min_reps, calls,
                  [&](int i) {
                    const int k = i % pairs;
                    cudaMemcpyAsync(buf[size_t(2 * k + 1)], buf[size_t(2 * k)], half, cudaMemcpyDeviceToDevice, s);
                  },
                  &reps, msg);
  } else {
    *msg = "copy: buffers not allocated";
  }
  for (void* b : buf) cudaFree(b);
  return us;
}

}  // namespace shortconv::cli
