// `shortconv bench`: forward and forward+backward timings against the floor.
//
// The floor of a memory-bound op is the bytes that must move divided by the
// copy bandwidth measured in the same run: forward reads x and writes y
// (2 x-sized tensors); forward+backward also reads x again, reads dy and
// writes dx (5 x-sized tensors).  fraction = floor time / measured time
// (1.0 = at the copy bandwidth).  Copy bandwidth counts read + write bytes.
//
// Every buffer and the workspace are allocated once (harness::Prepared)
// before timing; the timed region holds only sc_forward / sc_backward calls.
// fwd+bwd is one forward plus one backward call (dx, dweight, dbias; dh0 when
// the case has states).  Small cases rotate over several copies of their
// buffers so they are not timed out of cache.
//   host backends: steady_clock per call, one warm-up, median; copy:
//                  multi-threaded memcpy, the fastest of a few; each row's
//                  floor from a copy measured beside it (a shared machine's
//                  bandwidth moves by 2x within seconds).
//   a GPU (CUDA):  GPU time per call: the calls (rotating over the copies, at
//                  least kGraphCalls of them) are captured once into a CUDA
//                  graph whose replays are timed with cudaEvents (median),
//                  divided by the number of calls — so host-side launch cost
//                  does not hide in small shapes (it is reported separately
//                  as *_call_us: one eager call between events).  Copy:
//                  cudaMemcpyAsync device-to-device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>

#include "bench_clock.hpp"
#include "bench_decode.hpp"
#include "cli.hpp"
#include "core/dtype.hpp"
#include "harness/harness.hpp"

#ifdef SHORTCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace shortconv::cli {

namespace {

using harness::Case;
using harness::Layout;
using harness::Prepared;

struct Shape {
  std::string name;
  int64_t B, T, D;
  int64_t seqs = 0;  // > 0: packed batch of `seqs` equal sequences (B must be 1)
  bool states = false;
  bool residual = false;  // the forward adds a residual (one more x-sized input)
  Layout layout = Layout::token_major;
  int W = 4;
  std::vector<sc_dtype> dtypes;
};

struct Result {
  std::string shape, dtype, layout;
  int W = 4;
  int64_t x_bytes = 0;
  int fwd_tensors = 2, fwdbwd_tensors = 5;  // x-sized tensors of each floor (+1 with a residual)
  double fwd_us = 0, fwdbwd_us = 0;
  double fwd_call_us = NAN, fwdbwd_call_us = NAN;  // CUDA: one eager call between events
  int fwd_reps = 0, fwdbwd_reps = 0;
  // Host backends: the copy bandwidth measured beside this row (the faster of
  // one copy before its forward timing and one before its f+b timing), its
  // floor; NAN: the run's (a GPU's).
  double copy_GBps = NAN;
  std::string error;
};

// The copy bandwidth of r's floor.
double row_copy(const Result& r, double run_copy_GBps) {
  return r.copy_GBps > 0 ? r.copy_GBps : run_copy_GBps;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: shortconv bench [--backend %s] [--json] [options]\n"
               "\n"
               "Times the forward and forward+backward (one forward plus one backward call with\n"
               "dx, dweight, dbias, and dh0 when the case has states) on default shapes, W=4,\n"
               "SiLU, bias, token-major, bf16 and fp32; measures the memory copy bandwidth in the\n"
               "same run and reports for each result microseconds, GB/s (bytes that must move /\n"
               "time: forward 2 x-sized tensors, forward+backward 5, one more each with a\n"
               "residual) and the fraction of the\n"
               "floor (floor time = those bytes / copy bandwidth; 1.0 = copy speed).  Then the\n"
               "decode section (see --decode).\n"
               "\n"
               "default shapes (B x T x D):\n"
               "  cpu:  dense 4x4096x2048; packed 1x16384x2048 in 16 sequences with initial and\n"
               "        final states; long 1x32768x1024; the dense shape channel-major and\n"
               "        with a residual (bf16)\n"
               "  cuda: dense 8x4096x4096; packed 1x32768x8192 in 16 sequences with states;\n"
               "        long 1x65536x4096; small 1x2048x2048; and on the dense shape\n"
               "        channel-major, W=8, with a residual, and fp32\n"
               "\n"
               "options:\n"
               "  --backend B     %s (default %s)\n"
               "  --json          one JSON object {backend, copy_GBps, results: [{shape, dtype,\n"
               "                  fwd_us, fwdbwd_us, fwd_frac, fwdbwd_frac, ...}]}\n"
               "  --shape BxTxD   bench this dense shape instead of the defaults\n"
               "  --seqs N        with --shape: a packed batch of N equal sequences (B must be 1)\n"
               "  --states        with --shape: initial and final states (and dh0)\n"
               "  --residual      with --shape: the forward adds a residual\n"
               "  --dtype D       bf16, fp16, fp32, fp64 or all (default: bf16 and fp32)\n"
               "  --width W       convolution width (default 4)\n"
               "  --layout L      token (default) or channel (channel-major [B, D, T]; with\n"
               "                  --decode: x and y of the steps [B, D, T], vLLM's speculative\n"
               "                  (batch, dim, seqlen) input)\n"
               "  --activation A  silu (default) or identity: identity leaves the activation's\n"
               "                  arithmetic out, to see how much of a row's time it takes\n"
               "  --reps N        timed repetitions at least (default %d on the host, %d on a GPU)\n"
               "  --threads N     CPU threads for the backend and the copy (default: all)\n"
               "  --decode        only the decode section: one decode step of a serving engine\n"
               "                  (bf16 or --dtype, W=4, a pool of 1024 rows updated in place, D\n"
               "                  4096 and 8192, batch 1, 8, 64, 256, 1 token or 1+3 speculative\n"
               "                  tokens, every 8th slot padded, [P, D, S] and vLLM's channel-\n"
               "                  contiguous rows): us per step (GPU: CUDA-graph replays), the\n"
               "                  floor of x, y and the state entries read and written, an\n"
               "                  empty kernel's time in the same run, the eager call; on a\n"
               "                  GPU also each step launched to overlap the step before\n"
               "                  (exec.overlap launch and reads) beside an empty kernel and\n"
               "                  index chains launched the same way, then a copy of each\n"
               "                  step's bytes in one launch (what a plain copy of that size\n"
               "                  reaches of the floor)\n"
               "  --no-decode     skip the decode section (--shape skips it too)\n",
               backend_names("|", "|").c_str(), backend_names(", ", " or ").c_str(),
               sc_backend_name(SC_BACKEND_CPU), kHostTiming.min_reps, kDeviceTiming.min_reps);
}

bool parse_shape(const std::string& s, int64_t* B, int64_t* T, int64_t* D) {
  int64_t v[3];
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t x = s.find('x', pos);
    const std::string part = s.substr(pos, i < 2 ? x - pos : std::string::npos);
    if ((i < 2 && x == std::string::npos) || !parse_int(part, &v[i]) || v[i] < 1) return false;
    pos = x + 1;
  }
  *B = v[0];
  *T = v[1];
  *D = v[2];
  return true;
}

bool parse_dtype(const std::string& s, std::vector<sc_dtype>* out) {
  if (s == "bf16" || s == "bfloat16") *out = {SC_BF16};
  else if (s == "fp16" || s == "f16" || s == "float16") *out = {SC_F16};
  else if (s == "fp32" || s == "f32" || s == "float32") *out = {SC_F32};
  else if (s == "fp64" || s == "f64" || s == "float64") *out = {SC_F64};
  else if (s == "all") *out = {SC_BF16, SC_F16, SC_F32, SC_F64};
  else return false;
  return true;
}

// The activations the library lists, "a, b".
std::string activation_names() {
  std::string s;
  for (int id = 0; sc_activation_name(id); ++id)
    s += std::string(id ? ", " : "") + sc_activation_name(id);
  return s;
}

const char* short_dtype(sc_dtype d) {
  switch (d) {
    case SC_BF16: return "bf16";
    case SC_F16: return "fp16";
    case SC_F32: return "fp32";
    case SC_F64: return "fp64";
    default: return "?";
  }
}

Case make_case(const Shape& s, sc_dtype dt, int threads, sc_activation act) {
  Case c;
  c.W = s.W;
  c.act = act;
  c.act_dtype = c.param_dtype = c.state_dtype = dt;
  c.D = s.D;
  c.layout = s.layout;
  c.bias = true;
  if (s.seqs > 0) {
    c.packed = true;
    c.lengths.assign(size_t(s.seqs), s.T / s.seqs);
    c.lengths.back() += s.T - (s.T / s.seqs) * s.seqs;
  } else {
    c.B = s.B;
    c.T = s.T;
  }
  c.h0 = c.ht = s.states;
  c.residual = s.residual;
  c.dy = true;
  c.want_dx = c.want_dweight = c.want_dbias = true;
  c.want_dh0 = s.states;
  c.num_threads = threads;
  return c;
}

// ---- the run's settings ---------------------------------------------------------

struct Settings {
  sc_backend backend = SC_BACKEND_CPU;
  std::string bname;
  bool device = false;  // the backend's tensors live on a GPU (harness::on_device)
  bool json = false;
  sc_activation act = SC_ACT_SILU;  // --activation
  int64_t reps = 0, threads = 0;
  Layout layout = Layout::token_major;  // --layout
  std::vector<Shape> shapes;
};

// The default shapes of a host or device backend; --layout, --width and
// --dtype override theirs.
std::vector<Shape> default_shapes(const Options& opt, bool device, int W, Layout layout,
                                  const std::vector<sc_dtype>& dtypes) {
  std::vector<Shape> shapes;
  const bool user_dtype = opt.has("--dtype");
  auto add = [&](const char* name, int64_t B, int64_t T, int64_t D, int64_t nseq, bool st,
                 Layout l, int w, std::vector<sc_dtype> dts) {
    Shape s{name, B, T, D, nseq, st, false, l, w, user_dtype ? dtypes : dts};
    if (opt.has("--layout")) s.layout = layout;
    if (opt.has("--width")) s.W = W;
    shapes.push_back(s);
  };
  if (device) {
    add("dense 8x4096x4096", 8, 4096, 4096, 0, false, Layout::token_major, W, {SC_BF16, SC_F32});
    add("packed 1x32768x8192 /16 +states", 1, 32768, 8192, 16, true, Layout::token_major, W, {SC_BF16});
    add("long 1x65536x4096", 1, 65536, 4096, 0, false, Layout::token_major, W, {SC_BF16});
    add("small 1x2048x2048", 1, 2048, 2048, 0, false, Layout::token_major, W, {SC_BF16});
    if (!opt.has("--layout"))
      add("dense 8x4096x4096 chan-major", 8, 4096, 4096, 0, false, Layout::channel_major, W, {SC_BF16});
    if (!opt.has("--width")) {
      add("dense 8x4096x4096 W=8", 8, 4096, 4096, 0, false, Layout::token_major, 8, {SC_BF16});
      add("dense 8x4096x4096 W=16", 8, 4096, 4096, 0, false, Layout::token_major, 16, {SC_BF16, SC_F32});
    }
    add("dense 8x4096x4096 +residual", 8, 4096, 4096, 0, false, Layout::token_major, W, {SC_BF16});
    shapes.back().residual = true;
  } else {
    add("dense 4x4096x2048", 4, 4096, 2048, 0, false, Layout::token_major, W, dtypes);
    add("packed 1x16384x2048 /16 +states", 1, 16384, 2048, 16, true, Layout::token_major, W, dtypes);
    add("long 1x32768x1024", 1, 32768, 1024, 0, false, Layout::token_major, W, dtypes);
    if (!opt.has("--layout"))
      add("dense 4x4096x2048 chan-major", 4, 4096, 2048, 0, false, Layout::channel_major, W, dtypes);
    add("dense 4x4096x2048 +residual", 4, 4096, 2048, 0, false, Layout::token_major, W, {SC_BF16});
    shapes.back().residual = true;
  }
  return shapes;
}

// Checks every option into *st: -1 to go on, or exit status 2 (message on stderr).
int parse_settings(const Options& opt, Settings* st) {
  auto fail_usage = [](const std::string& m) {
    std::fprintf(stderr, "shortconv bench: %s\n", m.c_str());
    return 2;
  };
  if (int rc = backend_option(opt, "bench", &st->backend, &st->bname); rc >= 0) return rc;
  st->device = harness::on_device(st->backend);
  st->json = opt.has("--json");
  std::vector<sc_dtype> dtypes = {SC_BF16, SC_F32};
  if (opt.has("--dtype") && !parse_dtype(opt.get("--dtype", ""), &dtypes))
    return fail_usage("--dtype: expected bf16, fp16, fp32, fp64 or all, got '" +
                      opt.get("--dtype", "") + "'");
  int64_t width = 4, seqs = 0;
  st->reps = st->device ? kDeviceTiming.min_reps : kHostTiming.min_reps;
  if (opt.has("--width") && (!parse_int(opt.get("--width", ""), &width) || width < 1 || width > 64))
    return fail_usage("--width: expected an integer in [1, 64], got '" + opt.get("--width", "") + "'");
  if (opt.has("--reps") && (!parse_int(opt.get("--reps", ""), &st->reps) || st->reps < 1))
    return fail_usage("--reps: expected a positive integer, got '" + opt.get("--reps", "") + "'");
  if (opt.has("--threads") && (!parse_int(opt.get("--threads", ""), &st->threads) || st->threads > 4096))
    return fail_usage("--threads: expected a non-negative integer, got '" + opt.get("--threads", "") + "'");
  if (opt.has("--seqs") && (!parse_int(opt.get("--seqs", ""), &seqs) || seqs < 1))
    return fail_usage("--seqs: expected a positive integer, got '" + opt.get("--seqs", "") + "'");
  if (opt.has("--activation")) {  // a name the library lists (sc_activation_name)
    const std::string aname = opt.get("--activation", ""), listed = activation_names();
    int id = 0;
    while (sc_activation_name(id) && aname != sc_activation_name(id)) ++id;
    if (!sc_activation_name(id))
      return fail_usage("--activation: expected one of " + listed + ", got '" + aname + "'");
    st->act = sc_activation(id);
  }
  Layout& layout = st->layout;
  const std::string lname = opt.get("--layout", "token");
  if (lname == "channel" || lname == "channel-major") layout = Layout::channel_major;
  else if (lname != "token" && lname != "token-major")
    return fail_usage("--layout: expected token or channel, got '" + lname + "'");
  if ((opt.has("--seqs") || opt.has("--states") || opt.has("--residual")) && !opt.has("--shape"))
    return fail_usage("--seqs, --states and --residual go with --shape");
  if (!opt.has("--shape")) {
    st->shapes = default_shapes(opt, st->device, int(width), layout, dtypes);
    return -1;
  }
  Shape s;
  if (!parse_shape(opt.get("--shape", ""), &s.B, &s.T, &s.D))
    return fail_usage("--shape: expected BxTxD with positive integers, got '" +
                      opt.get("--shape", "") + "'");
  if (seqs > 0 && s.B != 1) return fail_usage("--seqs: a packed batch needs B = 1");
  if (seqs > s.T) return fail_usage("--seqs: more sequences than tokens");
  s.seqs = seqs;
  s.states = opt.has("--states");
  s.residual = opt.has("--residual");
  s.name = std::string(seqs ? "packed " : "dense ") + opt.get("--shape", "") +
           (s.residual ? " +residual" : "");
  s.layout = layout;
  s.W = int(width);
  s.dtypes = dtypes;
  st->shapes.push_back(s);
  return -1;
}

// One shape and dtype: forward and forward+backward times (and, on a GPU,
// graph-replay GPU times with the eager ones kept as *_call_us).
Result bench_one(const Shape& s, sc_dtype dt, const Settings& st, const Timing& pol,
                 const Clock& clock) {
  Result r;
  r.shape = s.name;
  r.dtype = short_dtype(dt);
  r.layout = harness::layout_name(s.layout);
  r.W = s.W;
  r.x_bytes = s.B * s.T * s.D * dtype_size(dt);
  r.fwd_tensors += s.residual ? 1 : 0;
  r.fwdbwd_tensors += s.residual ? 1 : 0;
  const Case c = make_case(s, dt, int(st.threads), st.act);
  // Rotate over copies when the working set is small (cache effects).
  const int64_t footprint = 2 * r.x_bytes;
  const auto ps = rotating_copies(c, footprint, pol.rotate_bytes, pol.max_copies, st.backend,
                                  clock.stream(), &r.error);
  if (ps.empty()) return r;
  const int copies = int(ps.size());
  sc_status status = SC_OK;
  std::string msg;
  auto fwd_call = [&](Prepared& p) {
    const sc_status s1 = p.forward(&msg);
    if (s1 != SC_OK) status = s1;
  };
  auto fwdbwd_call = [&](Prepared& p) {
    sc_status s1 = p.forward(&msg);
    if (s1 == SC_OK) s1 = p.backward(&msg);
    if (s1 != SC_OK) status = s1;
  };
  auto fwd = [&](int i) {  // rep i on copy i % copies; only the call is timed
    Prepared& p = *ps[size_t(i % copies)];
    return clock.time([&] { fwd_call(p); });
  };
  auto fwdbwd = [&](int i) {
    Prepared& p = *ps[size_t(i % copies)];
    return clock.time([&] { fwdbwd_call(p); });
  };
  const double copy_before_fwd = clock.copy_now_GBps();
  r.fwd_us = measure(pol, int(st.reps), fwd, &r.fwd_reps);
  const double copy_before_fb = clock.copy_now_GBps();
  if (status == SC_OK) r.fwdbwd_us = measure(pol, int(st.reps), fwdbwd, &r.fwdbwd_reps);
  if (!st.device) r.copy_GBps = std::max(copy_before_fwd, copy_before_fb);
#ifdef SHORTCONV_WITH_CUDA
  if (st.device && status == SC_OK) {
    // The eager numbers above include the host path; the graph numbers are GPU time.
    r.fwd_call_us = r.fwd_us;
    r.fwdbwd_call_us = r.fwdbwd_us;
    const int calls = copies * ((kGraphCalls + copies - 1) / copies);
    auto fwd_once = [&](int i) { fwd_call(*ps[size_t(i % copies)]); };
    auto fwdbwd_once = [&](int i) { fwdbwd_call(*ps[size_t(i % copies)]); };
    r.fwd_us = graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps), calls, fwd_once,
                        &r.fwd_reps, &msg);
    r.fwdbwd_us = graph_us(clock.cs, clock.e0, clock.e1, pol, int(st.reps), calls, fwdbwd_once,
                           &r.fwdbwd_reps, &msg);
    if (!(r.fwd_us > 0) || !(r.fwdbwd_us > 0)) status = SC_ERR_BACKEND;
  }
#endif
  if (status != SC_OK) r.error = std::string(sc_status_string(status)) + ": " + msg;
  return r;
}

// ---- output -------------------------------------------------------------------------

void print_header(const Settings& st, double copy_GBps) {
  std::printf("shortconv bench — backend %s, %s, activation %s, copy bandwidth %.1f GB/s (read+write)\n",
              st.bname.c_str(),
              st.device ? "GPU time per call from CUDA-graph replays, median"
                        : "steady_clock, median",
              sc_activation_name(st.act), copy_GBps);
  std::printf("floor = bytes that must move / copy bandwidth: fwd 2 x-sized tensors, "
              "fwd+bwd 5 (+1 each with a residual); frac = floor / time%s\n\n",
              st.device ? "" : "; each row's copy bandwidth measured beside it (copy GB/s)");
  std::printf("%-34s %-5s %2s %-13s %11s %8s %6s %11s %8s %6s%s\n", "shape", "dtype", "W",
              "layout", "fwd_us", "GB/s", "frac", "fwdbwd_us", "GB/s", "frac",
              st.device ? "" : "  copy GB/s");
}

void print_row(const Result& r, const Settings& st, double copy_GBps) {
  if (!r.error.empty()) {
    std::printf("%-34s %-5s %2d %-13s ERROR %s\n", r.shape.c_str(), r.dtype.c_str(), r.W,
                r.layout.c_str(), r.error.c_str());
  } else {
    const double fb = r.fwd_tensors * double(r.x_bytes), bb = r.fwdbwd_tensors * double(r.x_bytes);
    const double copy = row_copy(r, copy_GBps);
    std::printf("%-34s %-5s %2d %-13s %11.1f %8.1f %6.3f %11.1f %8.1f %6.3f",
                r.shape.c_str(), r.dtype.c_str(), r.W, r.layout.c_str(), r.fwd_us,
                fb / r.fwd_us / 1e3, fb / (copy * 1e3) / r.fwd_us, r.fwdbwd_us,
                bb / r.fwdbwd_us / 1e3, bb / (copy * 1e3) / r.fwdbwd_us);
    if (st.device) std::printf("   eager call %.1f / %.1f us", r.fwd_call_us, r.fwdbwd_call_us);
    else std::printf("  %10.1f", copy);
    std::printf("\n");
  }
  std::fflush(stdout);
}

void print_json(const std::vector<Result>& results, const Settings& st, double run_copy_GBps,
                const DecodeRun* decode) {
  std::printf("{\"backend\": %s, \"threads\": %lld, \"activation\": %s, \"copy_GBps\": %s, \"results\": [",
              json_str(st.bname).c_str(), (long long)st.threads, json_str(sc_activation_name(st.act)).c_str(),
              json_num(run_copy_GBps).c_str());
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double fb = r.fwd_tensors * double(r.x_bytes), bb = r.fwdbwd_tensors * double(r.x_bytes);
    const bool ok = r.error.empty();
    const double copy_GBps = row_copy(r, run_copy_GBps);  // (the row's floor)
    std::printf("%s\n  {\"shape\": %s, \"dtype\": %s, \"W\": %d, \"layout\": %s, \"x_bytes\": %lld, "
                "\"fwd_us\": %s, \"fwdbwd_us\": %s, \"fwd_GBps\": %s, \"fwdbwd_GBps\": %s, "
                "\"fwd_frac\": %s, \"fwdbwd_frac\": %s, \"fwd_reps\": %d, \"fwdbwd_reps\": %d, "
                "\"fwd_call_us\": %s, \"fwdbwd_call_us\": %s, \"copy_GBps\": %s, "
                "\"fwd_tensors\": %d, \"fwdbwd_tensors\": %d, \"error\": %s}",
                i ? "," : "", json_str(r.shape).c_str(), json_str(r.dtype).c_str(), r.W,
                json_str(r.layout).c_str(), (long long)r.x_bytes,
                json_num(ok ? r.fwd_us : NAN).c_str(), json_num(ok ? r.fwdbwd_us : NAN).c_str(),
                json_num(ok ? fb / r.fwd_us / 1e3 : NAN).c_str(),
                json_num(ok ? bb / r.fwdbwd_us / 1e3 : NAN).c_str(),
                json_num(ok ? fb / (copy_GBps * 1e3) / r.fwd_us : NAN).c_str(),
                json_num(ok ? bb / (copy_GBps * 1e3) / r.fwdbwd_us : NAN).c_str(), r.fwd_reps,
                r.fwdbwd_reps, json_num(r.fwd_call_us).c_str(), json_num(r.fwdbwd_call_us).c_str(),
                json_num(copy_GBps).c_str(), r.fwd_tensors, r.fwdbwd_tensors, json_str(r.error).c_str());
  }
  std::printf("\n]%s%s}\n", decode ? ", " : "",
              decode ? decode_json(*decode, run_copy_GBps).c_str() : "");
}

// --decode / --no-decode / --shape: which sections run.
struct Sections {
  bool prefill = true, decode = true;
};
Sections sections(const Options& opt) {
  Sections s;
  if (opt.has("--decode")) s.prefill = false;
  if (opt.has("--no-decode") || opt.has("--shape")) s.decode = false;
  return s;
}

DecodeSettings decode_settings(const Options& opt, const Settings& st) {
  DecodeSettings d;
  d.backend = st.backend;
  d.device = st.device;
  d.threads = int(st.threads);
  d.reps = st.reps;
  std::vector<sc_dtype> dts;
  if (opt.has("--dtype") && parse_dtype(opt.get("--dtype", ""), &dts)) d.dtype = dts.front();
  d.channel_first = st.layout == Layout::channel_major;
  d.shapes = default_decode_shapes();
  return d;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options opt;
  opt.flags = {"--json", "--help", "-h", "--states", "--residual", "--decode", "--no-decode"};
  opt.valued = {"--backend", "--shape", "--seqs", "--dtype", "--width", "--layout", "--activation", "--reps",
                "--threads"};
  if (int rc = parse_command_line(opt, argc, argv, "bench", usage); rc >= 0) return rc;
  Settings st;
  if (int rc = parse_settings(opt, &st); rc >= 0) return rc;
  if (int rc = require_backend(st.backend, st.bname, "bench"); rc >= 0) return rc;
  if (st.threads > 0) omp_set_num_threads(int(st.threads));

  Timing pol = st.device ? kDeviceTiming : kHostTiming;
  const Clock clock(st.device, int(st.threads), &pol);
  const Sections sec = sections(opt);
  std::vector<Result> results;
  bool any_error = false;
  for (const Shape& s : sec.prefill ? st.shapes : std::vector<Shape>{})
    for (sc_dtype dt : s.dtypes) {
      results.push_back(bench_one(s, dt, st, pol, clock));
      any_error = any_error || !results.back().error.empty();
      if (st.json) continue;
      if (results.size() == 1) print_header(st, clock.copy_GBps);
      print_row(results.back(), st, clock.copy_GBps);
    }
  DecodeRun decode;
  if (sec.decode) {
    const DecodeSettings ds = decode_settings(opt, st);
    decode = bench_decode(ds, pol, clock, [&](const DecodeRun& run) {
      if (st.json) return;
      if (run.results.size() == 1) print_decode_header(ds, clock.copy_GBps, run);
      print_decode_row(run.results.back(), ds, clock.copy_GBps, run);
    });
    for (const DecodeResult& r : decode.results) any_error = any_error || !r.error.empty();
    if (!st.json && ds.device) {
      print_decode_overlap(decode, clock.copy_GBps);
      print_decode_copies(decode, clock.copy_GBps);
    }
  }
  if (st.json) print_json(results, st, clock.copy_GBps, sec.decode ? &decode : nullptr);
  return any_error ? 1 : 0;
}

}  // namespace shortconv::cli
