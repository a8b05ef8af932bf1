// `shortconv bench`'s decode section: one decode step of a serving engine on
// a state pool, the shape that is bounded by launch latency rather than by
// bandwidth.
//
// Each case: bf16 (or --dtype), W = 4, SiLU, bias, a pool of 1024 rows updated
// in place, `batch` sequences in distinct rows of which every eighth slot is
// padded (-1: reads and writes nothing), 1 token per sequence (rows of W-1
// entries) or 1+3 speculative tokens (rows of (W-1) + 3 entries, accepted
// counts 1..4), rows stored [P, D, S] ("rows") or channel-contiguous like
// vLLM's pools ([P, S, D] storage, "vllm").
//
// floor = the bytes a step must move / the copy bandwidth of the same run:
// x and y, plus per real sequence the state entries read (S, or the W-1 of
// the window when speculative) and written (S, or (W-2) + T).
// GPU time per step: the steps (rotating over a few buffer copies) captured
// into one CUDA graph of kDecodeGraphCalls calls whose replays are timed; the
// eager time is one call between events (host path included); the empty
// kernel's graph and eager times, and the graph times of one round trip and
// of an index load followed by a dependent load (latency_kernels.cu: the
// latency floor of a step that finds its rows through device indices), come
// from the same run; and per case, after every step was timed (so that its
// load does not precede a step's timing), a device copy moving the step's
// bytes in one launch ("copy_us"; copy_frac = floor / copy_us: the fraction of
// the floor a plain copy of that size reaches, the bandwidth-side ceiling of
// a step of that size).  Each step is also graph-timed launched to overlap
// the step before it (exec.overlap: "launch", and "reads", whose contract
// the rotation keeps: consecutive calls update other copies' pools), beside
// the empty kernel and the index chains launched the same way, also after
// every plain step was timed.
// Host backends: steady_clock per call, median.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "bench_decode.hpp"
#include "cli.hpp"
#include "core/dtype.hpp"

namespace shortconv::cli {

namespace {

using harness::Case;
using harness::Prepared;

constexpr int kDecodeW = 4;
constexpr int64_t kDecodePool = 1024;
constexpr int kDecodeGraphCalls = 100;  // calls per captured graph (the measurement)
constexpr int kDecodeMaxCopies = 4;     // buffer copies rotated (each holds a whole pool)
constexpr int64_t kPadEvery = 8;        // slot n is padded when n % kPadEvery == kPadEvery - 1

Case decode_case(const DecodeShape& s, sc_dtype dt, bool channel_first, int threads) {
  Case c;
  if (channel_first) c.layout = harness::Layout::channel_major;
  c.W = kDecodeW;
  c.S = s.T == 1 ? kDecodeW - 1 : int(kDecodeW - 2 + s.T);
  c.act = SC_ACT_SILU;
  c.act_dtype = c.param_dtype = c.state_dtype = dt;
  c.D = s.D;
  c.B = s.batch;
  c.T = s.T;
  c.bias = true;
  c.h0 = c.ht = c.in_place = true;
  c.pool = kDecodePool;
  c.state_transposed = s.vllm_rows;
  std::vector<int64_t> rows(static_cast<size_t>(kDecodePool));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(uint64_t(s.batch * 131 + s.D)));
  for (int64_t n = 0; n < s.batch; ++n) {
    const bool pad = n % kPadEvery == kPadEvery - 1;
    c.h0_index.push_back(pad ? -1 : rows[size_t(n)]);
    if (s.T > 1) c.accepted.push_back(1 + n % s.T);
  }
  c.ht_index = c.h0_index;
  c.dy = false;
  c.want_dx = c.want_dweight = c.want_dbias = c.want_dh0 = false;
  c.num_threads = threads;
  return c;
}

// Bytes one step must move: x, y, and the rows of the real sequences.
int64_t floor_bytes(const Case& c) {
  const int64_t es = dtype_size(c.act_dtype), S = c.state_len();
  const int64_t real = c.B - c.B / kPadEvery;
  const int64_t read = c.accepted.empty() ? S : c.W - 1;
  const int64_t written = c.accepted.empty() ? S : c.W - 2 + c.T;
  return 2 * c.B * c.T * c.D * es + real * c.D * es * (read + written);
}

DecodeResult bench_case(const DecodeShape& s, const DecodeSettings& st, const Timing& pol,
                        const Clock& clock) {
  DecodeResult r;
  r.shape = s;
  r.dtype = st.dtype;
  const Case c = decode_case(s, st.dtype, st.channel_first, st.threads);
  r.bytes = floor_bytes(c);
  const auto ps = rotating_copies(c, r.bytes, pol.rotate_bytes, kDecodeMaxCopies, st.backend,
                                  clock.stream(), &r.error);
  if (ps.empty()) return r;
  const int copies = int(ps.size());
  r.copies = copies;
  sc_status status = SC_OK;
  std::string msg;
  auto call = [&](int i) {
    const sc_status s1 = ps[size_t(i % copies)]->forward(&msg);
    if (s1 != SC_OK) status = s1;
  };
  r.call_us = measure(pol, int(st.reps), [&](int i) { return clock.time([&] { call(i); }); },
                      &r.reps);
  r.us = r.call_us;
#ifdef SHORTCONV_WITH_CUDA
  if (st.device && status == SC_OK) {
    const int calls = copies * ((kDecodeGraphCalls + copies - 1) / copies);
    r.us = graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps), calls, call, &r.reps, &msg);
    if (!(r.us > 0)) status = SC_ERR_BACKEND;
  }
#endif
  if (status != SC_OK) r.error = std::string(sc_status_string(status)) + ": " + msg;
  return r;
}

#ifdef SHORTCONV_WITH_CUDA
// The case's steps launched to overlap the step before (exec.overlap launch,
// then reads), graph-timed on fresh copies as in bench_case.  READS needs the
// step before not to write this step's rows: consecutive calls run on other
// copies (each with its own pool), so it is timed with two or more.
void bench_overlap(DecodeResult* r, const DecodeSettings& st, const Timing& pol, const Clock& clock) {
  const Case c = decode_case(r->shape, st.dtype, st.channel_first, st.threads);
  std::string msg;
  const auto ps = rotating_copies(c, r->bytes, pol.rotate_bytes, kDecodeMaxCopies, st.backend,
                                  clock.stream(), &msg);
  if (ps.empty()) return;
  const int copies = int(ps.size());
  const int calls = copies * ((kDecodeGraphCalls + copies - 1) / copies);
  auto call = [&](int i) { (void)ps[size_t(i % copies)]->forward(&msg); };
  for (const int overlap : {int(SC_OVERLAP_LAUNCH), int(SC_OVERLAP_READS)}) {
    if (overlap == SC_OVERLAP_READS && copies < 2) break;
    for (const auto& p : ps) p->set_overlap(overlap);
    int reps = 0;
    const double us = graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps), calls, call, &reps, &msg);
    (overlap == SC_OVERLAP_LAUNCH ? r->launch_us : r->reads_us) = us > 0 ? us : NAN;
  }
}
#endif

const char* dtype_label(sc_dtype d) {
  switch (d) {
    case SC_BF16: return "bf16";
    case SC_F16: return "fp16";
    case SC_F32: return "fp32";
    default: return "fp64";
  }
}

}  // namespace

std::vector<DecodeShape> default_decode_shapes() {
  std::vector<DecodeShape> v;
  for (bool vllm_rows : {true, false})
    for (int64_t D : {4096, 8192})
      for (int64_t T : {1, 4})
        for (int64_t batch : {1, 8, 64, 256}) v.push_back({D, batch, T, vllm_rows});
  return v;
}

DecodeRun bench_decode(const DecodeSettings& st, const Timing& pol, const Clock& clock,
                       const std::function<void(const DecodeRun&)>& each) {
  DecodeRun run;
  run.channel_first = st.channel_first;
#ifdef SHORTCONV_WITH_CUDA
  if (st.device) {
    std::string msg;
    run.empty_us = empty_kernel_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                         kDecodeGraphCalls, &msg);
    run.empty_call_us = empty_kernel_eager_us(clock.cs, clock.e0, clock.e1);
    run.trip_us = round_trips_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                       kDecodeGraphCalls, 0, RefArgsKind::plain, &msg);
    run.index_trip_us = round_trips_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                             kDecodeGraphCalls, 1, RefArgsKind::plain, &msg);
    run.index_trip_args_us = round_trips_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                                  kDecodeGraphCalls, 1, RefArgsKind::padded, &msg);
    run.index_trip_spread_us = round_trips_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                                    kDecodeGraphCalls, 1, RefArgsKind::spread, &msg);
    run.launch_host_us = launch_host_us(clock.cs, RefArgsKind::plain, &msg);
    run.launch_host_args_us = launch_host_us(clock.cs, RefArgsKind::padded, &msg);
  }
#endif
  for (const DecodeShape& s : st.shapes) {
    run.results.push_back(bench_case(s, st, pol, clock));
    if (each) each(run);
  }
#ifdef SHORTCONV_WITH_CUDA
  // Overlapped launches after every plain timing of the run: in a run that
  // made them first, every plain step timed 3-9% slower than the same kernels
  // (the same SASS) in main's bench (H100, 2026-12-06), a cause not found.
  if (st.device) {
    std::string msg;
    run.empty_overlap_us = empty_kernel_overlap_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                                         kDecodeGraphCalls, &msg);
    run.index_trip_overlap_us = round_trips_overlap_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                                             kDecodeGraphCalls, false, &msg);
    run.ahead_trip_overlap_us = round_trips_overlap_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps),
                                                             kDecodeGraphCalls, true, &msg);
    for (DecodeResult& r : run.results)
      if (r.error.empty()) bench_overlap(&r, st, pol, clock);
  }
  if (st.device)
    for (DecodeResult& r : run.results) {
      if (!r.error.empty()) continue;
      const int calls = r.copies * ((kDecodeGraphCalls + r.copies - 1) / r.copies);
      std::string msg;  // (a failed reference leaves copy_us NAN; the step's figures stand)
      r.copy_us = copy_graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps), calls, r.bytes, r.copies, &msg);
    }
#endif
  return run;
}

void print_decode_header(const DecodeSettings& st, double copy_GBps, const DecodeRun& run) {
  std::printf("\ndecode steps — W=%d SiLU bias, pool of %lld rows updated in place, every %lldth "
              "slot padded, x and y %s; %s\n",
              kDecodeW, (long long)kDecodePool, (long long)kPadEvery,
              st.channel_first ? "channel-first [B, D, T]" : "token-major [B, T, D]",
              st.device ? "GPU time per step from CUDA-graph replays" : "steady_clock, median");
  std::printf("floor = (x + y + state entries read and written) / copy bandwidth %.1f GB/s",
              copy_GBps);
  if (st.device)
    std::printf("; empty kernel %.2f us (graph), %.2f us (eager); one round trip %.2f us, an index "
                "then a load %.2f us, the same with the library's argument block %.2f us, reading 12 of its "
                "lines first %.2f us (graph); host time of its launch %.2f us, %.2f us with that block",
                run.empty_us, run.empty_call_us, run.trip_us, run.index_trip_us, run.index_trip_args_us,
                run.index_trip_spread_us, run.launch_host_us, run.launch_host_args_us);
  std::printf("\n%-5s %-5s %5s %5s %2s %10s %9s %6s %8s %10s\n", "rows", "dtype", "D", "batch", "T",
              "us", "floor_us", "frac", "/empty", "eager_us");
}

void print_decode_row(const DecodeResult& r, const DecodeSettings& st, double copy_GBps,
                      const DecodeRun& run) {
  const DecodeShape& s = r.shape;
  std::printf("%-5s %-5s %5lld %5lld %2lld ", s.vllm_rows ? "vllm" : "rows", dtype_label(r.dtype),
              (long long)s.D, (long long)s.batch, (long long)s.T);
  if (!r.error.empty()) {
    std::printf("ERROR %s\n", r.error.c_str());
  } else {
    const double floor_us = double(r.bytes) / (copy_GBps * 1e3);
    std::printf("%10.2f %9.2f %6.3f %8.2f %10.1f\n", r.us, floor_us, floor_us / r.us,
                st.device ? r.us / run.empty_us : NAN, r.call_us);
  }
  std::fflush(stdout);
}

void print_decode_overlap(const DecodeRun& run, double copy_GBps) {
  std::printf("\nlaunched to overlap the kernel before (exec.overlap; graph-timed after every step above): "
              "empty kernel %.2f us, an index then a load waiting first %.2f us, the same with one load "
              "after the wait %.2f us; /empty: against the empty kernel's plain launch (%.2f us)\n",
              run.empty_overlap_us, run.index_trip_overlap_us, run.ahead_trip_overlap_us, run.empty_us);
  std::printf("%-5s %-5s %5s %5s %2s %10s %6s %10s %6s %8s\n", "rows", "dtype", "D", "batch", "T",
              "launch_us", "frac", "reads_us", "frac", "/empty");
  for (const DecodeResult& r : run.results) {
    if (!r.error.empty()) continue;
    const double floor_us = double(r.bytes) / (copy_GBps * 1e3);
    std::printf("%-5s %-5s %5lld %5lld %2lld %10.2f %6.3f %10.2f %6.3f %8.2f\n",
                r.shape.vllm_rows ? "vllm" : "rows", dtype_label(r.dtype), (long long)r.shape.D,
                (long long)r.shape.batch, (long long)r.shape.T, r.launch_us, floor_us / r.launch_us,
                r.reads_us, floor_us / r.reads_us, r.reads_us / run.empty_us);
  }
  std::fflush(stdout);
}

void print_decode_copies(const DecodeRun& run, double copy_GBps) {
  std::printf("\ncopy of each step's bytes in one launch (half read, half written; graph-timed after the "
              "steps): copy_frac = floor / copy_us, step/copy = the step's us / copy_us\n");
  std::printf("%-5s %-5s %5s %5s %2s %10s %9s %9s %9s\n", "rows", "dtype", "D", "batch", "T", "bytes",
              "copy_us", "copy_frac", "step/copy");
  for (const DecodeResult& r : run.results) {
    if (!r.error.empty()) continue;
    const double floor_us = double(r.bytes) / (copy_GBps * 1e3);
    std::printf("%-5s %-5s %5lld %5lld %2lld %10lld %9.2f %9.3f %9.2f\n", r.shape.vllm_rows ? "vllm" : "rows",
                dtype_label(r.dtype), (long long)r.shape.D, (long long)r.shape.batch, (long long)r.shape.T,
                (long long)r.bytes, r.copy_us, floor_us / r.copy_us, r.us / r.copy_us);
  }
  std::fflush(stdout);
}

std::string decode_json(const DecodeRun& run, double copy_GBps) {
  std::string s = "\"decode_x_layout\": " + json_str(run.channel_first ? "channel-first" : "token-major") +
                  ", \"empty_kernel_us\": " + json_num(run.empty_us) +
                  ", \"empty_kernel_call_us\": " + json_num(run.empty_call_us) +
                  ", \"round_trip_us\": " + json_num(run.trip_us) +
                  ", \"index_round_trip_us\": " + json_num(run.index_trip_us) +
                  ", \"index_round_trip_args_us\": " + json_num(run.index_trip_args_us) +
                  ", \"index_round_trip_spread_us\": " + json_num(run.index_trip_spread_us) +
                  ", \"launch_host_us\": " + json_num(run.launch_host_us) +
                  ", \"launch_host_args_us\": " + json_num(run.launch_host_args_us) +
                  ", \"empty_kernel_overlap_us\": " + json_num(run.empty_overlap_us) +
                  ", \"index_round_trip_overlap_us\": " + json_num(run.index_trip_overlap_us) +
                  ", \"ahead_round_trip_overlap_us\": " + json_num(run.ahead_trip_overlap_us) + ", \"decode\": [";
  for (size_t i = 0; i < run.results.size(); ++i) {
    const DecodeResult& r = run.results[i];
    const bool ok = r.error.empty();
    const double floor_us = double(r.bytes) / (copy_GBps * 1e3);
    s += std::string(i ? "," : "") + "\n  {\"rows\": " +
         json_str(r.shape.vllm_rows ? "vllm" : "rows") + ", \"dtype\": " +
         json_str(dtype_label(r.dtype)) + ", \"D\": " + std::to_string(r.shape.D) +
         ", \"batch\": " + std::to_string(r.shape.batch) + ", \"T\": " +
         std::to_string(r.shape.T) + ", \"bytes\": " + std::to_string(r.bytes) +
         ", \"us\": " + json_num(ok ? r.us : NAN) + ", \"floor_us\": " + json_num(floor_us) +
         ", \"frac\": " + json_num(ok ? floor_us / r.us : NAN) + ", \"per_empty\": " +
         json_num(ok ? r.us / run.empty_us : NAN) + ", \"call_us\": " +
         json_num(ok ? r.call_us : NAN) + ", \"launch_us\": " + json_num(ok ? r.launch_us : NAN) +
         ", \"reads_us\": " + json_num(ok ? r.reads_us : NAN) + ", \"reads_per_empty\": " +
         json_num(ok ? r.reads_us / run.empty_us : NAN) + ", \"copy_us\": " + json_num(r.copy_us) +
         ", \"copy_frac\": " + json_num(floor_us / r.copy_us) + ", \"reps\": " + std::to_string(r.reps) +
         ", \"error\": " + json_str(r.error) + "}";
  }
  return s + "\n]";
}

}  // namespace shortconv::cli
