// `shortconv bench`'s decode section (bench_decode.cpp): one decode step on a
// state pool per case, its time against the bandwidth floor and against an
// empty kernel's launch, both measured in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "shortconv/shortconv.h"

namespace shortconv::cli {

struct DecodeShape {
  int64_t D, batch, T;  // channels, sequences (slots) of the step, tokens per sequence
  bool vllm_rows;       // the pool's channel axis contiguous (vLLM), else [P, D, S] rows
};

struct DecodeSettings {
  sc_backend backend = SC_BACKEND_CPU;
  bool device = false;
  int threads = 0;
  int64_t reps = 0;
  sc_dtype dtype = SC_BF16;
  bool channel_first = false;  // x and y stored [B, D, T] (vLLM's (batch, dim, seqlen)), else [B, T, D]
  std::vector<DecodeShape> shapes;
};

struct DecodeResult {
  DecodeShape shape{};
  sc_dtype dtype = SC_BF16;
  int64_t bytes = 0;        // the floor's bytes of one step
  double us = NAN;          // per step: GPU time from graph replays, or the host's median
  double call_us = NAN;     // one eager call (host path included)
  double launch_us = NAN;   // GPU: graph-timed with exec.overlap = SC_OVERLAP_LAUNCH
  double reads_us = NAN;    // ... and SC_OVERLAP_READS (consecutive calls on other buffer copies)
  double copy_us = NAN;     // GPU: one copy moving `bytes` (half read, half written), graph-timed
  int copies = 0;           // buffer copies rotated (the copy reference rotates as many)
  int reps = 0;
  std::string error;
};

struct DecodeRun {
  bool channel_first = false;                  // the settings' x and y layout
  double empty_us = NAN, empty_call_us = NAN;  // an empty kernel: graph-timed, eager (GPU only)
  double trip_us = NAN, index_trip_us = NAN;   // graph-timed: one round trip; an index, then a load
  double index_trip_args_us = NAN;             // the same with an argument block of the library's size
  double index_trip_spread_us = NAN;           // ... whose first address adds values from 12 of its lines
  double launch_host_us = NAN, launch_host_args_us = NAN;  // host time of that launch, small / library-sized block
  // launched to overlap the kernel before (sc_exec.overlap), graph-timed: the
  // empty kernel waiting; the index-then-load chain waiting first; the chain
  // before the wait and one load after it
  double empty_overlap_us = NAN, index_trip_overlap_us = NAN, ahead_trip_overlap_us = NAN;
  std::vector<DecodeResult> results;
};

// D in {4096, 8192} x batch in {1, 8, 64, 256} x T in {1, 1+3} x both pool layouts.
std::vector<DecodeShape> default_decode_shapes();
// Runs every shape of st; each(run) after every case (for streaming output).
DecodeRun bench_decode(const DecodeSettings& st, const Timing& pol, const Clock& clock,
                       const std::function<void(const DecodeRun&)>& each);
void print_decode_header(const DecodeSettings& st, double copy_GBps, const DecodeRun& run);
void print_decode_row(const DecodeResult& r, const DecodeSettings& st, double copy_GBps,
                      const DecodeRun& run);
// The overlapped launches of a device run (launch_us, reads_us per case), one table.
void print_decode_overlap(const DecodeRun& run, double copy_GBps);
// The copy references of a device run (copy_us per case), one table.
void print_decode_copies(const DecodeRun& run, double copy_GBps);
// `"decode_x_layout": "token-major" | "channel-first", "empty_kernel_us": ..., "empty_kernel_call_us": ..., "round_trip_us": ...,
// "index_round_trip_us": ..., "index_round_trip_args_us": ..., "index_round_trip_spread_us": ...,
// "launch_host_us": ..., "launch_host_args_us": ..., "empty_kernel_overlap_us": ...,
// "index_round_trip_overlap_us": ..., "ahead_round_trip_overlap_us": ..., "decode": [...]`
// for the JSON object.
std::string decode_json(const DecodeRun& run, double copy_GBps);

}  // namespace shortconv::cli
