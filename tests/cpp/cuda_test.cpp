// GPU-specific tests of the CUDA backend (skipped without a device): the
// general path (W > 16), the vectorised token-major and channel-major paths at
// sizes that span many blocks and tiles, forced tilings, bitwise determinism,
// capture into a CUDA graph on a caller's stream, and 64-bit offsets on a
// tensor of more than 2^31 elements.  The cross-backend property sweep
// (sweep_test.cpp) covers the rest of the contract on small shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "harness/harness.hpp"
#include "shortconv/shortconv.hpp"

#ifdef SHORTCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace shortconv::harness;

bool have_gpu() { return sc_has_backend(SC_BACKEND_CUDA) && cuda_device_present(); }

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA backend compiled in or no CUDA device present"

std::string check_case(const Case& c) {
  const Inputs in = make_inputs(c);
  const Outputs ref = run(c, in, SC_BACKEND_REF);
  const Outputs got = run(c, in, SC_BACKEND_CUDA);
  std::string why = compare(c, got, ref);
  if (!ref.ok()) why += "oracle: " + ref.problems();
  return why;
}

#define EXPECT_CASE(c)                                   \
  do {                                                   \
    const Case cc_ = (c);                                \
    const std::string why_ = check_case(cc_);            \
    EXPECT_TRUE(why_.empty()) << cc_.describe() << "\n  " << why_; \
  } while (0)

Case base(sc_dtype dt, int W, int64_t B, int64_t T, int64_t D) {
  Case c;
  c.act_dtype = c.param_dtype = c.state_dtype = dt;
  c.W = W;
  c.B = B;
  c.T = T;
  c.D = D;
  c.h0 = c.ht = c.dht = true;
  c.want_dh0 = true;
  c.residual = true;
  return c;
}

// A forward-only decode step of B sequences of T tokens (bf16, D channels,
// width W) updating rows of S entries of a pool of P rows in place (vLLM's
// channel-contiguous rows or [P, D, S] ones), pad_index marking padded slots.
Case decode_case(int W, int64_t B, int64_t T, int64_t D, int S, int64_t P, bool vllm_rows,
                 int64_t pad_index) {
  Case c = base(SC_BF16, W, B, T, D);
  c.S = S;
  c.residual = c.dht = c.want_dh0 = false;
  c.want_dx = c.want_dweight = c.want_dbias = false;
  c.state_transposed = vllm_rows;
  c.pool = P;
  c.in_place = true;
  c.pad_index = pad_index;
  return c;
}

// seq_idx on the device (docs/semantics.md section 3): ids past the state
// tensors' rows are not checked on the host; the kernels treat them as no row
// (a zero initial state, no final-state row, no dht term, no dinitial_state
// row).  Against the oracle on the same batch with zero rows appended for
// those ids: every output equal, the real rows equal.
TEST(Cuda, SeqIdxIdsPastTheRowsAreNoRow) {
  REQUIRE_GPU();
  for (int W : {4, 19}) {  // the token-major paths and the general path
    Case c = base(SC_F32, W, 2, 40, 12);
    c.S = W;
    c.seq_idx.clear();
    const int64_t ids[8] = {0, 4, -1, 1, 5, 2, -1, 3};  // 3, 4 and 5: past 3 rows
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 40; ++t) c.seq_idx.push_back(ids[b * 4 + t / 10]);
    c.id_rows = 3;
    Case e = c;  // the oracle's batch: rows 3..5 exist and are zero
    e.id_rows = 6;
    const Inputs in = make_inputs(c);
    Inputs ie = in;
    const size_t row = size_t(c.D * c.S);
    ie.h0.resize(6 * row, 0.0);
    ie.dht.resize(6 * row, 0.0);
    const Outputs got = run(c, in, SC_BACKEND_CUDA), ref = run(e, ie, SC_BACKEND_REF);
    ASSERT_TRUE(got.ok() && ref.ok()) << got.problems() << ref.problems();
    Outputs cut = ref;  // the oracle's real rows
    cut.ht.resize(3 * row);
    cut.dh0.resize(3 * row);
    EXPECT_EQ(compare(c, got, cut), "") << c.describe();
  }
}

// W > 16: the general path, dense and packed, with states and odd S.
TEST(Cuda, GeneralPathWide) {
  REQUIRE_GPU();
  for (int W : {17, 24, 33})
    for (sc_dtype dt : {SC_F32, SC_F64, SC_BF16}) {
      Case c = base(dt, W, 2, 3 * W + 5, 5);
      c.S = W + 2;
      EXPECT_CASE(c);
      Case p = c;
      p.packed = true;
      p.lengths = {0, W - 2, 1, 2 * W + 3, 0, W};
      p.tile_t = 7;
      EXPECT_CASE(p);
    }
}

// Vector token-major path over many blocks: D a multiple of every vector
// width, long rows, automatic and forced tiles, all widths of the fast paths,
// with and without a residual.
TEST(Cuda, TokenMajorVectorSizes) {
  REQUIRE_GPU();
  for (sc_dtype dt : {SC_BF16, SC_F16, SC_F32})
    for (int W : {1, 2, 3, 4, 5, 8, 12, 16})
      for (int64_t tile : {0, 1, 3, 16, 20, 64})
        for (bool residual : {true, false}) {
          Case c = base(dt, W, 3, 203, 64);
          // SiLU where a full-window instance exists (16-bit W = 2, 3, 4, 8, 16;
          // tiles of 16 tokens and more take the backward's: its staged loop
          // then ends inside, on and off a whole stage), no activation on the
          // padded widths
          c.act = (W == 1 || W == 5 || W == 12) ? SC_ACT_NONE : SC_ACT_SILU;
          c.tile_t = tile;
          c.residual = residual;
          EXPECT_CASE(c);
        }
}

// Packed batches on the vector path: zero-length sequences, sequences
// shorter than W and than S, tiles spanning several sequences.
TEST(Cuda, PackedVector) {
  REQUIRE_GPU();
  for (int W : {2, 4, 7, 16})  // (16: the 16-tap instances, sequences shorter than the window)
    for (int64_t tile : {0, 2, 5, 100}) {
      Case c = base(SC_BF16, W, 1, 0, 32);
      c.packed = true;
      c.lengths = {0, 0, 1, W - 1, 37, 0, W, 130, 2, 0};
      c.S = W + 1;
      c.tile_t = tile;
      EXPECT_CASE(c);
      c.pool = 12;
      c.h0_index = {3, -1, 0, 5, 7, 11, 1, 2, -1, 4};
      c.ht_index = {6, 8, -1, 9, 10, 3, 0, 1, 2, 5};
      EXPECT_CASE(c);
    }
}

// In-place decode on a pool: one token (and a few) per sequence.
TEST(Cuda, InPlaceDecode) {
  REQUIRE_GPU();
  for (int64_t T : {1, 3}) {
    Case c = base(SC_BF16, 4, 33, T, 64);
    c.S = 4;
    c.pool = 40;
    c.h0_index.resize(33);
    c.ht_index.resize(33);
    for (int n = 0; n < 33; ++n) c.h0_index[size_t(n)] = c.ht_index[size_t(n)] = (n * 7) % 40;
    c.in_place = true;
    EXPECT_CASE(c);
  }
}

// Channel-major path ([B, D, T] storage, T a multiple of the vector width).
TEST(Cuda, ChannelMajor) {
  REQUIRE_GPU();
  for (sc_dtype dt : {SC_BF16, SC_F32, SC_F16})
    for (int W : {1, 3, 4, 6, 16})
      for (int64_t T : {8, 256, 1032})
        for (int64_t tile : {0, 1, 300}) {
          Case c = base(dt, W, 2, T, 6);
          c.layout = Layout::channel_major;
          c.tile_t = tile;
          c.S = W + (T % 3);
          EXPECT_CASE(c);
        }
}

// The channel-major full-window instances (W = 2, 3, 4 with SiLU) and the
// generic ones beside them (the same W with the identity): with and without
// states, residual and bias, dx alone, and tiles ending inside a chunk, at a
// chunk's end and within W-1 tokens of the row's end.
TEST(Cuda, ChannelMajorFullWindow) {
  REQUIRE_GPU();
  for (sc_dtype dt : {SC_BF16, SC_F16, SC_F32})
    for (int W : {2, 3, 4})
      for (sc_activation act : {SC_ACT_SILU, SC_ACT_NONE})
        for (int64_t T : {255, 257, 2051})
          for (int64_t tile : {0, 254, 256, 512}) {
            Case c = base(dt, W, 2, T, 3);
            c.layout = Layout::channel_major;
            c.act = act;
            c.tile_t = tile;
            EXPECT_CASE(c);
            c.h0 = c.ht = c.dht = c.want_dh0 = c.residual = c.bias = false;
            EXPECT_CASE(c);
            c.want_dweight = false;  // dx only: no partials
            EXPECT_CASE(c);
          }
}

// Strided views (a q slice of a fused qkv), stride-0 dy, transposed states.
TEST(Cuda, StridedViews) {
  REQUIRE_GPU();
  for (sc_dtype dt : {SC_BF16, SC_F64})
    for (int W : {3, 4, 9}) {
      Case c = base(dt, W, 2, 77, 24);
      c.layout = Layout::strided;
      c.state_transposed = true;
      EXPECT_CASE(c);
      c.dy_broadcast = true;
      c.tile_d = 5;
      EXPECT_CASE(c);
    }
}

// Mixed dtype groups on the fast path.
TEST(Cuda, DtypePairs) {
  REQUIRE_GPU();
  const sc_dtype all[] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  for (sc_dtype a : all)
    for (sc_dtype p : all) {
      Case c = base(a, 4, 2, 50, 16);
      c.param_dtype = p;
      c.state_dtype = all[(int(a) + int(p) + 1) % 4];
      EXPECT_CASE(c);
    }
}

// Bitwise identical outputs (dweight/dbias included) across repeated runs.
TEST(Cuda, Deterministic) {
  REQUIRE_GPU();
  Case c = base(SC_BF16, 4, 4, 1000, 256);
  c.param_dtype = SC_F32;
  const Inputs in = make_inputs(c);
  const Outputs a = run(c, in, SC_BACKEND_CUDA), b = run(c, in, SC_BACKEND_CUDA);
  ASSERT_TRUE(a.ok()) << a.problems();
  EXPECT_TRUE(bit_equal(a.y, b.y));
  EXPECT_TRUE(bit_equal(a.dx, b.dx));
  EXPECT_TRUE(bit_equal(a.dweight, b.dweight));
  EXPECT_TRUE(bit_equal(a.dbias, b.dbias));
  EXPECT_TRUE(bit_equal(a.dh0, b.dh0));
}

// The workspace size depends on shapes, dtypes and tiles, not on strides
// or pointers (the caller may size it before the buffers exist).
TEST(Cuda, WorkspaceIndependentOfLayout) {
  REQUIRE_GPU();
  Case c = base(SC_BF16, 4, 2, 300, 64);
  Prepared tm(c, nullptr, SC_BACKEND_CUDA);
  c.layout = Layout::channel_major;
  Prepared cm(c, nullptr, SC_BACKEND_CUDA);
  c.layout = Layout::strided;
  Prepared st(c, nullptr, SC_BACKEND_CUDA);
  EXPECT_EQ(tm.bwd_workspace_bytes(), cm.bwd_workspace_bytes());
  EXPECT_EQ(tm.bwd_workspace_bytes(), st.bwd_workspace_bytes());
  EXPECT_GT(tm.bwd_workspace_bytes(), 0u);
  EXPECT_EQ(tm.fwd_workspace_bytes(), 0u);
}

#ifdef SHORTCONV_WITH_CUDA

#define CU(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

// A non-blocking stream of the test's own and what was captured on it, released
// on every way out of the test (an ASSERT included): capture() starts recording
// the stream, instantiate() ends it and builds the graph, replay() launches it
// and waits.
struct CapturedStream {
  cudaStream_t s = nullptr;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  CapturedStream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  CapturedStream(const CapturedStream&) = delete;
  CapturedStream& operator=(const CapturedStream&) = delete;
  ~CapturedStream() {
    drop();
    if (s) cudaStreamDestroy(s);
  }
  void drop() {
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    ge = nullptr;
    g = nullptr;
  }
  cudaError_t capture() {
    drop();
    return s ? cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) : cudaErrorInvalidResourceHandle;
  }
  cudaError_t instantiate() {
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    return e != cudaSuccess ? e : cudaGraphInstantiate(&ge, g, 0);
  }
  cudaError_t replay() {
    const cudaError_t e = cudaGraphLaunch(ge, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
  }
};

// Forward + backward captured into a CUDA graph on a non-default stream,
// replayed twice: equal to the oracle and to a direct run, bitwise.
TEST(Cuda, GraphCapture) {
  REQUIRE_GPU();
  Case c = base(SC_BF16, 4, 2, 300, 64);
  c.packed = true;
  c.lengths = {0, 120, 3, 0, 177};
  const Inputs in = make_inputs(c);
  const Outputs ref = run(c, in, SC_BACKEND_REF);
  const Outputs direct = run(c, in, SC_BACKEND_CUDA);
  CapturedStream cs;
  Prepared p(c, &in, SC_BACKEND_CUDA);
  p.set_stream(cs.s);
  p.poison_outputs();
  CU(cudaDeviceSynchronize());
  CU(cs.capture());
  std::string e1, e2;
  const sc_status f = p.forward(&e1);
  const sc_status b = p.backward(&e2);
  CU(cs.instantiate());
  ASSERT_EQ(f, SC_OK) << e1;
  ASSERT_EQ(b, SC_OK) << e2;
  for (int rep = 0; rep < 2; ++rep) {
    CU(cs.replay());
    const Outputs got = p.fetch(kBoth);
    const std::string why = compare(c, got, ref);
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_TRUE(bit_equal(got.y, direct.y));
    EXPECT_TRUE(bit_equal(got.dx, direct.dx));
    EXPECT_TRUE(bit_equal(got.dweight, direct.dweight));
    EXPECT_TRUE(bit_equal(got.dh0, direct.dh0));
  }
}

// Writes v into the device index tensor t (int32, contiguous, as the harness lays it out).
void upload_index(const sc_tensor& t, const std::vector<int64_t>& v) {
  ASSERT_EQ(t.dtype, SC_I32);
  std::vector<int32_t> w(v.begin(), v.end());
  CU(cudaMemcpy(t.data, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
}

// A speculative decode step (one launch, Path::decode) captured once into a CUDA
// graph on a caller's stream and replayed with other pool rows, pad slots,
// accepted counts and tree parents written into the same device tensors between
// replays, as an engine replays its graph: every replay equals the oracle on
// the values it found.  Both pool layouts: [P, D, S] rows and vLLM's
// channel-contiguous rows ([P, S, D] storage).
TEST(Cuda, DecodeGraphReplaysWithNewRowsAndCounts) {
  REQUIRE_GPU();
  std::mt19937_64 rng(77);
  for (bool vllm_rows : {false, true}) {
    const int W = 4;
    const int64_t B = 16, T = 4, D = 512, P = 64;
    Case c = decode_case(W, B, T, D, W - 2 + int(T), P, vllm_rows, P + 5);
    auto draw = [&](Case& k) {
      std::vector<int64_t> rows(static_cast<size_t>(P));
      for (int64_t r = 0; r < P; ++r) rows[size_t(r)] = r;
      std::shuffle(rows.begin(), rows.end(), rng);
      k.h0_index.assign(rows.begin(), rows.begin() + B);
      for (int64_t n = 0; n < B; ++n)
        if (rng() % 5 == 0) k.h0_index[size_t(n)] = rng() % 2 ? -1 : k.pad_index;
      k.ht_index = k.h0_index;
      k.accepted.clear();
      for (int64_t n = 0; n < B; ++n) k.accepted.push_back(1 + int64_t(rng() % uint64_t(T)));
      if (vllm_rows) {  // a tree in the second layout
        k.parent_cols = T;
        k.parents.clear();
        for (int64_t n = 0; n < B; ++n)
          for (int64_t t = 0; t < T; ++t) k.parents.push_back(t ? int64_t(rng() % uint64_t(t)) : -1);
      }
    };
    draw(c);
    const Inputs in = make_inputs(c);
    CapturedStream cs;
    Prepared p(c, &in, SC_BACKEND_CUDA);
    p.set_stream(cs.s);
    p.poison_outputs();
    CU(cudaDeviceSynchronize());
    CU(cs.capture());
    std::string e;
    const sc_status f = p.forward(&e);
    CU(cs.instantiate());
    ASSERT_EQ(f, SC_OK) << e;
    for (int rep = 0; rep < 3; ++rep) {
      Case cr = c;
      if (rep > 0) draw(cr);
      upload_index(p.fwd_args().initial_state_indices, cr.h0_index);
      upload_index(p.fwd_args().final_state_indices, cr.ht_index);
      upload_index(p.fwd_args().num_accepted, cr.accepted);
      if (vllm_rows) upload_index(p.fwd_args().parent_tokens, cr.parents);
      p.restore_state();  // every replay starts from the same pool
      CU(cs.replay());
      const Outputs got = p.fetch(kForward);  // (its row bookkeeping is the captured case's)
      const Outputs ref = run(cr, in, SC_BACKEND_REF, kForward);
      ASSERT_TRUE(ref.ok()) << ref.problems();
      EXPECT_LE(rel_err(got.y, ref.y), tolerance(SC_BF16, SC_BF16)) << cr.describe();
      EXPECT_TRUE(bit_equal(got.ht, ref.ht)) << cr.describe();  // copies: exact
    }
  }
}

// Decode steps large enough for the wide instance (DecodeTraits::kWideBytes
// of x per thread: batch 256 at D = 8192), on vLLM's rows and on [P, D, S]
// rows: one token, and 1 + 3 speculative tokens with accepted counts, pad
// slots among the rows; against the oracle (the rows are copies: bitwise).
// The planner's choice is checked in cuda_plan_test: batch 8 takes the
// narrow instance.
TEST(Cuda, DecodeWideSteps) {
  REQUIRE_GPU();
  std::mt19937_64 rng(5);
  for (bool vllm_rows : {true, false})
  for (int64_t B : {256, 8})
    for (int64_t T : {1, 4}) {
      const int W = 4;
      const int64_t D = 8192, P = B + 40;
      Case c = decode_case(W, B, T, D, T == 1 ? W - 1 : W - 2 + int(T), P, vllm_rows, P + 3);
      std::vector<int64_t> rows(static_cast<size_t>(P));
      for (int64_t r = 0; r < P; ++r) rows[size_t(r)] = r;
      std::shuffle(rows.begin(), rows.end(), rng);
      c.h0_index.assign(rows.begin(), rows.begin() + B);
      for (int64_t n = 0; n < B; n += 9) c.h0_index[size_t(n)] = n % 2 ? -1 : c.pad_index;
      c.ht_index = c.h0_index;
      if (T > 1)
        for (int64_t n = 0; n < B; ++n) c.accepted.push_back(1 + int64_t(rng() % uint64_t(T)));
      EXPECT_CASE(c);
    }
}

// The wide instances of decode_linear.cu in each of their forms, batch 64 at
// D = 4096 (wide by the planner's rule).  vLLM rows: raw taps (bf16, fp16,
// fp32) and accumulator taps (fp32 weights, W = 3 with a padded tap), rows
// longer than the window (kept entries copied), a packed step of 0-4 tokens
// with accepted counts.  [P, D, S] rows held in registers: S = W-1 and W, one
// and three tokens, each dtype (and S = 5, W = 3: the staged instance);
// speculative steps of 1+K tokens on rows of (W-1) + K entries, K = 1..4
// (and the staged instance: a packed step of 0-4 tokens on rows of K = 3,
// and K = 5).  Each
// also without a bias with a residual and the identity, with separate read
// and write rows, with and without has_initial_state flags (the one-token
// vLLM forms without flags take the plain instance); against the oracle, the
// rows bitwise.  Then the same forms at batch 8, D = 1024, which
// the narrow instances take (4 bytes of x per thread; [P, D, S] rows held in
// registers as 4-byte words).
TEST(Cuda, DecodeWideForms) {
  REQUIRE_GPU();
  std::mt19937_64 rng(11);
  for (const auto& [B, D] : {std::pair<int64_t, int64_t>{64, 4096}, {8, 1024}}) {
    SCOPED_TRACE("batch " + std::to_string(B) + ", D = " + std::to_string(D));
    const int64_t P = B + 40;
    auto rows = [&](Case& c) {
      std::vector<int64_t> r(static_cast<size_t>(P));
      for (int64_t i = 0; i < P; ++i) r[size_t(i)] = i;
      std::shuffle(r.begin(), r.end(), rng);
      const int64_t N = c.num_seqs();
      c.h0_index.assign(r.begin(), r.begin() + N);
      for (int64_t n = 0; n < N; n += 7) c.h0_index[size_t(n)] = n % 2 ? -1 : c.pad_index;
      c.ht_index = c.h0_index;
    };
    struct Form {
      const char* what;
      sc_dtype dt, param;
      int W, S;
      int64_t T;  // 0: packed lengths 0..4 with accepted counts
      bool vllm = true;
      bool spec = false;  // accepted counts (the vLLM forms: whenever S = (W-2) + T)
    };
    const Form forms[] = {
        {"raw taps, bf16", SC_BF16, SC_BF16, 4, 3, 1},
        {"raw taps, fp16", SC_F16, SC_F16, 4, 3, 1},
        {"raw taps, fp32", SC_F32, SC_F32, 4, 3, 1},
        {"raw taps, rows of 7 entries", SC_BF16, SC_BF16, 4, 7, 1},
        {"raw taps, 1+3 tokens", SC_BF16, SC_BF16, 4, 5, 4},
        {"fp32 weights", SC_BF16, SC_F32, 4, 3, 1},
        {"W = 3", SC_BF16, SC_BF16, 3, 2, 1},
        {"W = 3, 1+3 tokens", SC_BF16, SC_BF16, 3, 5, 4},
        {"rows of 7 entries", SC_BF16, SC_BF16, 4, 7, 2},
        {"rows of 7 entries, W = 2", SC_F16, SC_F32, 2, 7, 1},
        {"packed, speculative", SC_BF16, SC_BF16, 4, 6, 0},
        {"[P, D, S] rows, S = 3", SC_BF16, SC_BF16, 4, 3, 1, false},
        {"[P, D, S] rows, S = 4", SC_BF16, SC_BF16, 4, 4, 1, false},
        {"[P, D, S] rows, S = 4, 3 tokens", SC_BF16, SC_BF16, 4, 4, 3, false},
        {"[P, D, S] rows, S = 3, 5 tokens", SC_F16, SC_F16, 4, 3, 5, false},
        {"[P, D, S] rows, fp32, S = 4", SC_F32, SC_F32, 4, 4, 1, false},
        {"[P, D, S] rows, fp32, S = 3, 2 tokens", SC_F32, SC_F32, 4, 3, 2, false},
        {"[P, D, S] rows, S = 5 (staged)", SC_BF16, SC_BF16, 4, 5, 1, false},
        {"[P, D, S] rows, W = 3 (staged)", SC_BF16, SC_BF16, 3, 2, 1, false},
        {"[P, D, S] rows, 1+1 tokens", SC_BF16, SC_BF16, 4, 4, 2, false, true},
        {"[P, D, S] rows, 1+2 tokens, fp16", SC_F16, SC_F16, 4, 5, 3, false, true},
        {"[P, D, S] rows, 1+3 tokens", SC_BF16, SC_BF16, 4, 6, 4, false, true},
        {"[P, D, S] rows, 1+3 tokens, fp32", SC_F32, SC_F32, 4, 6, 4, false, true},
        {"[P, D, S] rows, 1+4 tokens", SC_BF16, SC_BF16, 4, 7, 5, false, true},
        {"[P, D, S] rows, S = 6, packed speculative (staged)", SC_BF16, SC_BF16, 4, 6, 0, false, true},
        {"[P, D, S] rows, S = 8 (staged), speculative", SC_BF16, SC_BF16, 4, 8, 6, false, true},
    };
    for (const Form& f : forms)
      for (int variant = 0; variant < 4; ++variant) {
        Case c = decode_case(f.W, B, f.T > 0 ? f.T : 1, D, f.S, P, f.vllm, P + 3);
        c.act_dtype = c.state_dtype = f.dt;
        c.param_dtype = f.param;
        if (f.T == 0) {
          c.packed = true;
          for (int64_t n = 0; n < B; ++n) c.lengths.push_back(int64_t(rng() % 5));
        }
        rows(c);
        if (f.spec || (f.vllm && f.T != 1 && f.S == f.W - 2 + (f.T > 0 ? f.T : 4)))
          for (int64_t n = 0; n < c.num_seqs(); ++n)
            c.accepted.push_back(1 + int64_t(rng() % uint64_t(std::max<int64_t>(c.seq_len(n), 1))));
        if (variant == 1) {  // no bias, a residual, the identity
          c.bias = false;
          c.residual = true;
          c.act = SC_ACT_NONE;
        } else if (variant >= 2) {  // rows written elsewhere than read; 2: with flags
          if (variant == 2)
            for (int64_t n = 0; n < c.num_seqs(); ++n) c.has_h0.push_back(n % 3 != 0);
          c.in_place = false;
          for (auto& r : c.ht_index)
            if (r >= 0 && r != c.pad_index) r = (r + 1) % P;
        }
        SCOPED_TRACE(std::string(f.what) + ", variant " + std::to_string(variant));
        EXPECT_CASE(c);
      }
  }
}

// 64-bit offsets: x of [1, 2^19 + 64, 4096] bf16 (> 2^31 elements), forward
// and backward; rows around element 2^31 and at the end checked against a
// float64 computation on the host.
TEST(Cuda, Over2Pow31Elements) {
  REQUIRE_GPU();
  const int64_t T = (int64_t(1) << 19) + 64, D = 4096, W = 4;
  const int64_t numel = T * D;
  ASSERT_GT(numel, int64_t(1) << 31);
  size_t free_b = 0, total_b = 0;
  CU(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < size_t(numel) * 2 * 4 + (size_t(1) << 30)) GTEST_SKIP() << "not enough device memory";
  const int64_t P = 1000003;  // pattern period (prime: not aligned to rows)
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uni(0.25, 1.0);
  auto pattern = [&]() {
    std::vector<uint16_t> v(static_cast<size_t>(P));
    for (auto& e : v) e = shortconv::f32_to_bf16(float(uni(rng) * (rng() % 2 ? 1 : -1)));
    return v;
  };
  const std::vector<uint16_t> px = pattern(), pg = pattern();
  std::vector<float> w(static_cast<size_t>(D * W)), bias(static_cast<size_t>(D));
  for (auto& e : w) e = float(uni(rng) - 0.6);
  for (auto& e : bias) e = float(uni(rng) - 0.6);
  void *x, *y, *dy, *dx, *dw, *db, *dw_ws, *ws;
  const size_t bytes = size_t(numel) * 2;
  CU(cudaMalloc(&x, bytes));
  CU(cudaMalloc(&y, bytes));
  CU(cudaMalloc(&dw, size_t(D * W) * 4));
  CU(cudaMalloc(&db, size_t(D) * 4));
  CU(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  auto fill = [&](void* dst, const std::vector<uint16_t>& pat) {
    for (int64_t o = 0; o < numel; o += P)
      ASSERT_EQ(cudaMemcpy(static_cast<uint16_t*>(dst) + o, pat.data(),
                           size_t(std::min(P, numel - o)) * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
  };
  fill(x, px);
  sc_conv_args a = shortconv::conv_args();
  a.width = int(W);
  a.activation = SC_ACT_SILU;
  a.x = shortconv::tensor(x, SC_BF16, {1, T, D});
  a.weight = shortconv::tensor(dw, SC_F32, {D, W});
  a.bias = shortconv::tensor(db, SC_F32, {D});
  a.y = shortconv::tensor(y, SC_BF16, {1, T, D});
  a.exec.backend = SC_BACKEND_CUDA;
  ASSERT_NO_THROW(shortconv::forward(a));
  CU(cudaDeviceSynchronize());
  auto xv = [&](int64_t t, int64_t d) -> double {
    return t < 0 ? 0.0 : shortconv::bf16_to_f32(px[size_t((t * D + d) % P)]);
  };
  auto gv = [&](int64_t t, int64_t d) -> double {
    return shortconv::bf16_to_f32(pg[size_t((t * D + d) % P)]);
  };
  auto pre = [&](int64_t t, int64_t d) {
    double s = bias[size_t(d)];
    for (int64_t k = 0; k < W; ++k) s += w[size_t(d * W + k)] * xv(t - (W - 1) + k, d);
    return s;
  };
  const std::vector<int64_t> rows = {(int64_t(1) << 19) - 2, int64_t(1) << 19, T - 3, T - 1};
  auto check_rows = [&](void* buf, auto expect, const char* what) {
    double num = 0, den = 0;
    std::vector<uint16_t> got(static_cast<size_t>(D));
    for (int64_t t : rows) {
      ASSERT_EQ(cudaMemcpy(got.data(), static_cast<uint16_t*>(buf) + t * D, size_t(D) * 2,
                           cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t d = 0; d < D; ++d) {
        const double r = expect(t, d), g = shortconv::bf16_to_f32(got[size_t(d)]);
        num += (g - r) * (g - r);
        den += r * r;
      }
    }
    EXPECT_LE(std::sqrt(num / den), 1e-2) << what;
  };
  check_rows(y, [&](int64_t t, int64_t d) {
    const double z = pre(t, d);
    return z / (1 + std::exp(-z));
  }, "y");
  // backward: dx over the same buffers (y's memory reused as dy)
  fill(y, pg);
  dy = y;
  CU(cudaMalloc(&dx, bytes));
  a.y = sc_tensor{};
  a.dy = shortconv::tensor(dy, SC_BF16, {1, T, D});
  a.dx = shortconv::tensor(dx, SC_BF16, {1, T, D});
  CU(cudaMalloc(&dw_ws, size_t(D * W) * 4));
  a.dweight = shortconv::tensor(dw_ws, SC_F32, {D, W});
  const size_t wsb = shortconv::backward_workspace_size(a);
  CU(cudaMalloc(&ws, wsb ? wsb : 1));
  a.exec.workspace = ws;
  a.exec.workspace_bytes = wsb;
  ASSERT_NO_THROW(shortconv::backward(a));
  CU(cudaDeviceSynchronize());
  auto dpre = [&](int64_t t, int64_t d) {
    if (t >= T) return 0.0;
    const double z = pre(t, d), s = 1 / (1 + std::exp(-z));
    return gv(t, d) * s * (1 + z * (1 - s));
  };
  check_rows(dx, [&](int64_t t, int64_t d) {
    double v = 0;
    for (int64_t k = 0; k < W; ++k) v += w[size_t(d * W + k)] * dpre(t + (W - 1) - k, d);
    return v;
  }, "dx");
  for (void* p : {x, y, dx, dw, db, dw_ws, ws}) cudaFree(p);
}

// The run-time forms of the common decode steps' kernels (PlainStepForms,
// SpecStepForms): 0 in place; 1 rows written elsewhere than read, in another
// pool; 2 no initial state; 3 no final state; 4 no pool (row n); 5 a residual,
// no bias, the identity; 6 fp32.  Applied to a case whose rows are indexed in
// place; returns the form's name.
const char* apply_step_form(Case* c, int form) {
  const int64_t P = c->pool;
  switch (form) {
    case 1:
      c->in_place = false;
      for (auto& v : c->ht_index)
        if (v >= 0 && v != c->pad_index) v = (v + 5) % P;
      return "another pool";
    case 2:
      c->in_place = false;
      c->h0 = false;
      c->h0_index.clear();
      return "no initial state";
    case 3:
      c->in_place = false;
      c->ht = false;
      c->ht_index.clear();
      return "no final state";
    case 4:
      c->pool = 0;
      c->in_place = false;
      c->h0_index.clear();
      c->ht_index.clear();
      return "no pool (row n)";
    case 5:
      c->residual = true;
      c->bias = false;
      c->act = SC_ACT_NONE;
      return "a residual, no bias, the identity";
    case 6:
      c->act_dtype = c->param_dtype = c->state_dtype = SC_F32;
      return "fp32";
    default:
      return "in place";
  }
}

// The plain step's kernel (fwd_decode_plain: one token per sequence, raw
// taps, on vLLM rows of W-1 entries or [P, D, S] rows of W-1 or W entries),
// whose instances are per row layout, row-index dtype and overlap mode, over
// the options it reads at run time: int32 and int64 row indices, contiguous
// and strided (poison between the entries), pad slots and -1 rows; rows
// written elsewhere than read, another pool, no initial state, no final
// state, no pool (row n); a residual, no bias, the identity; batch 1 and 8
// (narrow) and 64 at D = 4096 (wide); each overlap mode.  Against the oracle
// (the rows are copies: bitwise).
TEST(Cuda, PlainStepForms) {
  REQUIRE_GPU();
  std::mt19937_64 rng(41);
  const int W = 4;
  for (const auto& [B, D] : {std::pair<int64_t, int64_t>{1, 1024}, {8, 1024}, {64, 4096}})
    for (const int S : {0, W - 1, W})  // 0: vLLM rows (of W-1 entries)
      for (const sc_dtype I : {SC_I32, SC_I64})
        for (int form = 0; form < 7; ++form) {
          const int64_t P = B + 24;
          Case c = decode_case(W, B, 1, D, S > 0 ? S : W - 1, P, S == 0, P + 2);
          c.index_dtype = I;
          c.index_stride = form % 2 ? 3 : 1;
          c.overlap = int(rng() % 3);
          std::vector<int64_t> r(static_cast<size_t>(P));
          for (int64_t i = 0; i < P; ++i) r[size_t(i)] = i;
          std::shuffle(r.begin(), r.end(), rng);
          c.h0_index.assign(r.begin(), r.begin() + B);
          for (int64_t n = 0; n < B; n += 3) c.h0_index[size_t(n)] = n % 2 ? -1 : c.pad_index;
          c.ht_index = c.h0_index;
          const char* what = apply_step_form(&c, form);
          SCOPED_TRACE(std::string(what) + ", batch " + std::to_string(B) + (I == SC_I32 ? ", int32" : ", int64") +
                       (S == 0 ? ", vLLM rows" : ", [P, D, S] rows, S = " + std::to_string(S)) +
                       ", overlap " + std::to_string(c.overlap));
          EXPECT_CASE(c);
        }
}

// The speculative step's kernels (fwd_decode_spec: vLLM rows, accepted counts,
// 1 .. kSpecMaxTokens tokens per sequence; fwd_decode_spec_rows: [P, D, S]
// rows of (W-1) + K entries, K + 1 tokens), whose instances are per row
// layout, index dtype and overlap mode, over what they read at run time: 1,
// 2, 4 and 5 tokens on vLLM rows of exactly (W-2) + T entries, and on rows 2
// longer (entries past the new ones kept); [P, D, S] rows for K = 1, 3, 4;
// every accepted count the rows allow; int32 and
// int64 indices and counts, contiguous and strided (poison between the
// entries); pad slots and -1 rows; rows written elsewhere than read, another
// pool, no initial state, no final state, no pool (row n); a residual, no
// bias, the identity; fp32; batch 1 and 8 (narrow) and 64 at D = 4096
// (wide); each overlap mode at random.  Against the oracle (the rows are
// copies: bitwise).
TEST(Cuda, SpecStepForms) {
  REQUIRE_GPU();
  std::mt19937_64 rng(43);
  const int W = 4;
  for (const auto& [B, D] : {std::pair<int64_t, int64_t>{1, 1024}, {8, 1024}, {64, 4096}})
    for (const int64_t T : {1, 2, 4, 5})
      for (bool vllm : {true, false})
      for (const sc_dtype I : {SC_I32, SC_I64})
        for (int form = 0; form < 7; ++form) {
          if (!vllm && T == 1) continue;  // (a plain step on those rows)
          const int64_t P = B + 24;
          const int S = std::max(W - 1, W - 2 + int(T)) + (vllm && form % 2 ? 2 : 0);
          Case c = decode_case(W, B, T, D, S, P, vllm, P + 2);
          c.index_dtype = I;
          c.index_stride = form % 3 == 1 ? 3 : 1;
          c.overlap = int(rng() % 3);
          std::vector<int64_t> r(static_cast<size_t>(P));
          for (int64_t i = 0; i < P; ++i) r[size_t(i)] = i;
          std::shuffle(r.begin(), r.end(), rng);
          c.h0_index.assign(r.begin(), r.begin() + B);
          for (int64_t n = 0; n < B; n += 3) c.h0_index[size_t(n)] = n % 2 ? -1 : c.pad_index;
          c.ht_index = c.h0_index;
          const int64_t most = S - (W - 1) + 1;  // counts that keep the window in the row
          for (int64_t n = 0; n < B; ++n) c.accepted.push_back(1 + int64_t(rng() % uint64_t(most)));
          const char* what = apply_step_form(&c, form);
          SCOPED_TRACE(std::string(what) + ", batch " + std::to_string(B) + ", T = " + std::to_string(T) +
                       (vllm ? ", vLLM rows" : ", [P, D, S] rows") + ", S = " + std::to_string(S) +
                       (I == SC_I32 ? ", int32" : ", int64") + ", overlap " + std::to_string(c.overlap));
          EXPECT_CASE(c);
        }
}

// exec.overlap on the decode path, each form against the oracle: the plain
// step's reads-ahead instances (vLLM rows and [P, D, S] rows in registers, the
// narrow and the wide width, bf16 and fp32, with a residual), and the other
// decode kernels, which all wait first (speculative, staged rows, flags).
TEST(Cuda, DecodeOverlapForms) {
  REQUIRE_GPU();
  std::mt19937_64 rng(23);
  for (const int overlap : {int(SC_OVERLAP_LAUNCH), int(SC_OVERLAP_READS)})
    for (const auto& [B, D] : {std::pair<int64_t, int64_t>{64, 4096}, {8, 1024}})
      for (bool vllm : {true, false})
        for (int form = 0; form < 5; ++form) {
          const int W = 4;
          const int64_t P = B + 40;
          const int S = form == 2 ? W : form == 3 ? W - 2 + 4 : form == 4 ? W + 1 : W - 1;
          const int64_t T = form == 3 ? 4 : 1;
          Case c = decode_case(W, B, T, D, S, P, vllm, P + 3);
          if (form == 1) {  // fp32, a residual, no bias
            c.act_dtype = c.param_dtype = c.state_dtype = SC_F32;
            c.residual = true;
            c.bias = false;
          }
          std::vector<int64_t> r(static_cast<size_t>(P));
          for (int64_t i = 0; i < P; ++i) r[size_t(i)] = i;
          std::shuffle(r.begin(), r.end(), rng);
          c.h0_index.assign(r.begin(), r.begin() + B);
          for (int64_t n = 0; n < B; n += 7) c.h0_index[size_t(n)] = n % 2 ? -1 : c.pad_index;
          c.ht_index = c.h0_index;
          if (form == 3)
            for (int64_t n = 0; n < B; ++n) c.accepted.push_back(1 + int64_t(rng() % uint64_t(T)));
          if (form == 4)
            for (int64_t n = 0; n < B; ++n) c.has_h0.push_back(n % 3 != 0);
          c.overlap = overlap;
          SCOPED_TRACE("form " + std::to_string(form));
          EXPECT_CASE(c);
        }
}

// The contract of exec.overlap under a race: a chain of decode steps in one
// stream where each step's x and residual are the previous step's y (written
// by the kernel right before it), and consecutive steps update two pools in
// turn (SC_OVERLAP_READS: the previous kernel does not write this step's
// rows).  Every y and both pools are bitwise those of the chain run without
// overlap, eagerly and replayed from a CUDA graph; one token and 1+3
// speculative tokens with accepted counts; batch 1, 64 and 256 (the wide
// instance), both row layouts.  A step that read x or its residual
// before the previous kernel's end would see a stale y.
TEST(Cuda, DecodeOverlapChain) {
  REQUIRE_GPU();
  const int W = 4, kSteps = 48;
  const int64_t D = 4096, P = 300;
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (const int64_t T : {1, 4})  // one token; 1+3 speculative tokens with accepted counts
  for (const int64_t N : {1, 64, 256})
    for (bool vllm : {true, false}) {
      SCOPED_TRACE("batch " + std::to_string(N) + ", T = " + std::to_string(T) +
                   (vllm ? ", vLLM rows" : ", [P, D, S] rows"));
      const int S = T == 1 ? W - 1 : W - 2 + int(T);
      auto bf16 = [&](size_t n, float scale) {
        std::vector<uint16_t> v(n);
        for (auto& e : v) e = shortconv::f32_to_bf16(scale * uni(rng));
        return v;
      };
      const size_t xs = size_t(N * T * D), ps = size_t(P * D * S);
      const std::vector<uint16_t> x0 = bf16(xs, 1.f), w = bf16(size_t(D * W), 0.3f),
                                  bias = bf16(size_t(D), 0.1f), pool0 = bf16(2 * ps, 1.f);
      std::vector<int32_t> idx(size_t(3 * N));  // pool k's rows: idx[k * N + n]; accepted: idx[2N + n]
      for (int64_t n = 0; n < N; ++n) idx[2 * size_t(N) + size_t(n)] = int32_t(1 + n % T);
      for (size_t k = 0; k < 2; ++k) {
        std::vector<int32_t> r(static_cast<size_t>(P));
        for (int i = 0; i < int(P); ++i) r[size_t(i)] = i;
        std::shuffle(r.begin(), r.end(), rng);
        for (int64_t n = 0; n < N; ++n) idx[k * size_t(N) + size_t(n)] = n % 8 == 7 ? -1 : r[size_t(n)];
      }
      void *xb, *wb, *bb, *pb, *ib;
      CU(cudaMalloc(&xb, xs * 2 * (kSteps + 1)));  // buf[i] = x of step i = y of step i - 1
      CU(cudaMalloc(&wb, w.size() * 2));
      CU(cudaMalloc(&bb, bias.size() * 2));
      CU(cudaMalloc(&pb, pool0.size() * 2));
      CU(cudaMalloc(&ib, idx.size() * 4));
      CU(cudaMemcpy(wb, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(bb, bias.data(), bias.size() * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(ib, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
      CapturedStream cs;
      const cudaStream_t s = cs.s;
      auto buf = [&](int i) { return static_cast<uint16_t*>(xb) + size_t(i) * xs; };
      auto step_args = [&](int i, int overlap) {
        sc_conv_args a = shortconv::conv_args();
        a.width = W;
        a.activation = SC_ACT_SILU;
        a.x = shortconv::tensor(buf(i), SC_BF16, {N, T, D});
        a.residual = a.x;
        a.y = shortconv::tensor(buf(i + 1), SC_BF16, {N, T, D});
        a.weight = shortconv::tensor(wb, SC_BF16, {D, W});
        a.bias = shortconv::tensor(bb, SC_BF16, {D});
        uint16_t* pool = static_cast<uint16_t*>(pb) + size_t(i % 2) * ps;
        a.initial_state = vllm ? shortconv::tensor(pool, SC_BF16, {P, D, S}, {D * S, 1, D})
                               : shortconv::tensor(pool, SC_BF16, {P, D, S});
        a.final_state = a.initial_state;
        a.initial_state_indices = shortconv::tensor(static_cast<int32_t*>(ib) + (i % 2) * N, SC_I32, {N});
        a.final_state_indices = a.initial_state_indices;
        if (T > 1) a.num_accepted = shortconv::tensor(static_cast<int32_t*>(ib) + 2 * N, SC_I32, {N});
        a.exec.backend = SC_BACKEND_CUDA;
        a.exec.stream = s;
        a.exec.overlap = overlap;
        return a;
      };
      // The chain's every y and both pools after it.
      auto chain = [&](int overlap, bool graph) {
        std::vector<uint16_t> out(xs * (kSteps + 1) + pool0.size());
        EXPECT_EQ(cudaMemcpy(xb, x0.data(), xs * 2, cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemset(buf(1), 0, xs * 2 * kSteps), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(pb, pool0.data(), pool0.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        if (graph) EXPECT_EQ(cs.capture(), cudaSuccess);
        for (int i = 0; i < kSteps; ++i) {
          const sc_conv_args a = step_args(i, overlap);
          sc_error err{};
          const sc_status st = sc_forward(&a, &err);
          EXPECT_EQ(st, SC_OK) << err.message;
          if (st != SC_OK) break;
        }
        if (graph) {
          EXPECT_EQ(cs.instantiate(), cudaSuccess);
          EXPECT_EQ(cs.replay(), cudaSuccess);
        }
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(out.data(), xb, xs * 2 * (kSteps + 1), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(out.data() + xs * (kSteps + 1), pb, pool0.size() * 2, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        return out;
      };
      const std::vector<uint16_t> want = chain(SC_OVERLAP_NONE, false);
      EXPECT_NE(std::vector<uint16_t>(want.begin() + std::ptrdiff_t(xs * kSteps),
                                      want.begin() + std::ptrdiff_t(xs * (kSteps + 1))),
                std::vector<uint16_t>(xs, 0))
          << "the last step wrote its y";
      for (const int overlap : {int(SC_OVERLAP_LAUNCH), int(SC_OVERLAP_READS)})
        for (bool graph : {false, true})
          for (int rep = 0; rep < 3; ++rep)
            EXPECT_TRUE(chain(overlap, graph) == want)
                << "overlap " << overlap << (graph ? ", graph" : ", eager") << ", repetition " << rep;
      cudaFree(xb);
      cudaFree(wb);
      cudaFree(bb);
      cudaFree(pb);
      cudaFree(ib);
    }
}

#endif  // SHORTCONV_WITH_CUDA

}  // namespace
