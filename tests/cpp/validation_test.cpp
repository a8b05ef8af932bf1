// Validation of the C ABI (docs/semantics.md section 7), table-driven.
//
// Every row mutates a valid baseline (dense or packed, every optional tensor
// present, f32) into one bad input and is run through sc_validate, the
// workspace-size query and sc_forward / sc_backward, on the ref and cpu
// backends.  Each call must return the row's status, a message that names the
// argument (as a whole word), and leave every buffer -- inputs and the
// sentinel-poisoned outputs -- byte-for-byte unchanged.
//
// Also: NULL args; SC_ERR_WORKSPACE at one byte less than the query's answer;
// overlap decided per element (randomised, against brute force); no C++
// exception crossing the ABI (forked child).
//
// The second half checks that the valid edge cases (T = 0, D = 0, B = 0,
// N = 0, zero-length sequences, W = 1 with S = 0, absent optionals, in-place
// state update, broadcast inputs, NULL data of empty tensors) succeed and give
// the values docs/semantics.md defines.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "shortconv/shortconv.h"
#include "shortconv/shortconv.hpp"

namespace {

constexpr uint8_t kSentinel = 0xA5;  // every output byte before a call
constexpr int64_t kB = 2, kT = 5, kD = 3, kW = 3, kS = 3;  // dense baseline (S = W)
constexpr int64_t kTotal = 7, kN = 3, kP = 4;               // packed baseline: cu = [0, 3, 3, 7]
constexpr int64_t kBig = int64_t(1) << 62;

enum Kind { DENSE, PACKED };
enum Dirs { FWD = 1, BWD = 2, BOTH = 3 };

int64_t numel(const sc_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// One call's worth of tensors.  Buffers are over-allocated (8 bytes per
// element + slack) so a mutation that validation wrongly accepted still stays
// inside owned memory instead of corrupting the heap.
struct Case {
  sc_conv_args a;
  std::map<std::string, std::vector<uint8_t>> mem;  // map nodes keep data pointers stable

  void* alloc(const std::string& name, int64_t elems, bool output) {
    std::vector<uint8_t>& m = mem[name];
    m.assign(size_t(elems) * 8 + 64, output ? kSentinel : 0);
    if (!output) {  // deterministic small floats (as f32) in every input
      uint32_t s = uint32_t(std::hash<std::string>{}(name));
      for (size_t i = 0; i + 4 <= m.size(); i += 4) {
        s = s * 1664525u + 1013904223u;
        float f = float(int32_t(s >> 8) % 2001 - 1000) / 1000.0f;
        std::memcpy(&m[i], &f, 4);
      }
    }
    return m.data();
  }
  sc_tensor make(const std::string& name, sc_dtype dt, std::initializer_list<int64_t> shape,
                 bool output) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return shortconv::tensor(alloc(name, n, output), dt, shape);
  }
  template <class I>
  sc_tensor index(const std::string& name, sc_dtype dt, std::initializer_list<I> v) {
    void* p = alloc(name, int64_t(v.size()), false);
    std::memcpy(p, v.begin(), v.size() * sizeof(I));
    return shortconv::tensor(p, dt, {int64_t(v.size())});
  }
  uint8_t* ptr(const std::string& name) { return mem.at(name).data(); }
};

std::unique_ptr<Case> baseline(Kind kind, sc_backend backend) {
  auto c = std::make_unique<Case>();
  sc_conv_args& a = c->a;
  sc_conv_args_init(&a);
  a.width = int32_t(kW);
  a.activation = SC_ACT_SILU;
  a.exec.backend = backend;
  a.exec.num_threads = 1;  // a loaded 2-core CI box: thread teams cost more than these tiny calls
  const sc_dtype F = SC_F32;
  a.weight = c->make("weight", F, {kD, kW}, false);
  a.bias = c->make("bias", F, {kD}, false);
  a.dweight = c->make("dweight", F, {kD, kW}, true);
  a.dbias = c->make("dbias", F, {kD}, true);
  if (kind == DENSE) {
    a.x = c->make("x", F, {kB, kT, kD}, false);
    a.residual = c->make("residual", F, {kB, kT, kD}, false);
    a.dy = c->make("dy", F, {kB, kT, kD}, false);
    a.y = c->make("y", F, {kB, kT, kD}, true);
    a.dx = c->make("dx", F, {kB, kT, kD}, true);
    a.initial_state = c->make("initial_state", F, {kB, kD, kS}, false);
    a.dfinal_state = c->make("dfinal_state", F, {kB, kD, kS}, false);
    a.final_state = c->make("final_state", F, {kB, kD, kS}, true);
    a.dinitial_state = c->make("dinitial_state", F, {kB, kD, kS}, true);
  } else {
    a.x = c->make("x", F, {kTotal, kD}, false);
    a.residual = c->make("residual", F, {kTotal, kD}, false);
    a.dy = c->make("dy", F, {kTotal, kD}, false);
    a.y = c->make("y", F, {kTotal, kD}, true);
    a.dx = c->make("dx", F, {kTotal, kD}, true);
    a.cu_seqlens = c->index<int32_t>("cu_seqlens", SC_I32, {0, 3, 3, 7});
    a.initial_state = c->make("initial_state", F, {kP, kD, kS}, false);
    a.initial_state_indices = c->index<int64_t>("initial_state_indices", SC_I64, {2, -1, 0});
    a.final_state = c->make("final_state", F, {kP, kD, kS}, true);
    a.final_state_indices = c->index<int32_t>("final_state_indices", SC_I32, {1, 3, -1});
    a.dfinal_state = c->make("dfinal_state", F, {kN, kD, kS}, false);
    a.dinitial_state = c->make("dinitial_state", F, {kN, kD, kS}, true);
  }
  return c;
}

// Whole-word occurrence: "x" must not match inside "dx" or "x_", but
// "exec.backend" may be followed by ':'.
bool names(const std::string& msg, const std::string& name) {
  auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t p = msg.find(name); p != std::string::npos; p = msg.find(name, p + 1)) {
    bool left = p == 0 || !word(msg[p - 1]);
    bool right = p + name.size() >= msg.size() || !word(msg[p + name.size()]);
    if (left && right) return true;
  }
  return false;
}

enum Call { VALIDATE, WORKSPACE, RUN, RUN_NULL_ERR };
const char* call_name(Call c) {
  switch (c) {
    case VALIDATE: return "sc_validate";
    case WORKSPACE: return "workspace_size";
    case RUN: return "run";
    default: return "run(err=NULL)";
  }
}

sc_status invoke(Call call, bool fwd, const sc_conv_args* a, sc_error* err) {
  size_t bytes = 12345;
  switch (call) {
    case VALIDATE: return sc_validate(a, fwd ? 0 : 1, err);
    case WORKSPACE: {
      sc_status st = fwd ? sc_forward_workspace_size(a, &bytes, err)
                         : sc_backward_workspace_size(a, &bytes, err);
      if (st != SC_OK) EXPECT_EQ(bytes, 12345u) << "bytes written on error";
      return st;
    }
    case RUN: return fwd ? sc_forward(a, err) : sc_backward(a, err);
    case RUN_NULL_ERR: return fwd ? sc_forward(a, nullptr) : sc_backward(a, nullptr);
  }
  return SC_OK;
}

struct Row {
  const char* what;
  Kind kind;
  int dirs;
  std::function<void(Case&)> mutate;
  std::vector<std::string> names;  // each must appear in the message
  sc_status status = SC_ERR_INVALID_ARGUMENT;
};

// Runs one row on every (backend, direction, call) and checks status,
// message and that no byte of any buffer changed.
void check_row(const Row& r) {
  for (sc_backend be : {SC_BACKEND_REF, SC_BACKEND_CPU}) {
    for (bool fwd : {true, false}) {
      if (!(r.dirs & (fwd ? FWD : BWD))) continue;
      for (Call call : {VALIDATE, WORKSPACE, RUN, RUN_NULL_ERR}) {
        auto c = baseline(r.kind, be);
        r.mutate(*c);
        const auto before = c->mem;  // after the mutation: it may edit index contents
        sc_error err;
        std::memset(err.message, 'Z', sizeof(err.message));
        err.message[sizeof(err.message) - 1] = '\0';
        const sc_status st = invoke(call, fwd, &c->a, &err);
        SCOPED_TRACE(std::string(r.what) + " | " + (be == SC_BACKEND_REF ? "ref" : "cpu") + " | " +
                     (fwd ? "forward" : "backward") + " | " + call_name(call) +
                     " | message: " + err.message);
        EXPECT_EQ(st, r.status);
        if (call != RUN_NULL_ERR) {
          const std::string msg = err.message;
          EXPECT_LT(msg.size(), sizeof(err.message));
          for (const std::string& n : r.names) EXPECT_TRUE(names(msg, n)) << "should name " << n;
        }
        for (const auto& [name, bytes] : before)
          EXPECT_TRUE(bytes == c->mem.at(name)) << "buffer " << name << " was written";
      }
    }
  }
}

// Makes `moved` overlap `host`: moves `moved`'s contents into `host`'s buffer
// at `elem_off` (4-byte) elements and points `moved` there.  Moving into the
// host's own (over-allocated) buffer keeps every pointer inside owned memory
// and makes the overlap independent of how the heap placed the buffers.
void alias(sc_tensor& moved, const sc_tensor& host, int64_t elem_off = 0) {
  int64_t extent = 0;
  for (int i = 0; i < moved.ndim; ++i) extent += (moved.shape[i] - 1) * moved.stride[i];
  const size_t bytes = size_t(extent + 1) * (moved.dtype == SC_I64 || moved.dtype == SC_F64 ? 8 : 4);
  uint8_t* dst = static_cast<uint8_t*>(host.data) + elem_off * 4;
  std::memmove(dst, moved.data, bytes);
  moved.data = dst;
}

// The dense baseline described by sequence ids (docs/semantics.md section 3):
// seq_idx [kB, kT] int32 (row 0: ids 0, 0, 1, 1 and padding; row 1: padding,
// 2, 2, 3, 3), every state tensor a pool of kIdRows rows by id.
constexpr int64_t kIdRows = 4;
void use_ids(Case& c, std::initializer_list<int32_t> ids = {0, 0, 1, 1, -1, -2, 2, 2, 3, 3}) {
  sc_tensor& t = c.a.seq_idx;
  t = c.index<int32_t>("seq_idx", SC_I32, ids);
  t.ndim = 2;
  t.shape[0] = kB;
  t.shape[1] = kT;
  t.stride[0] = kT;
  t.stride[1] = 1;
  for (auto [field, name, out] : {std::tuple{&sc_conv_args::initial_state, "initial_state", false},
                                  std::tuple{&sc_conv_args::final_state, "final_state", true},
                                  std::tuple{&sc_conv_args::dfinal_state, "dfinal_state", false},
                                  std::tuple{&sc_conv_args::dinitial_state, "dinitial_state", true}})
    c.a.*field = c.make(name, SC_F32, {kIdRows, kD, kS}, out);
}

std::vector<Row> rows() {
  std::vector<Row> R;
  auto add = [&](const char* what, Kind k, int dirs, std::function<void(Case&)> m,
                 std::vector<std::string> n, sc_status st = SC_ERR_INVALID_ARGUMENT) {
    R.push_back(Row{what, k, dirs, std::move(m), std::move(n), st});
  };
  // ---- struct, scalars, exec ------------------------------------------------
  add("struct_size too small", DENSE, BOTH, [](Case& c) { c.a.struct_size -= 8; }, {"struct_size"});
  add("struct_size zero", DENSE, BOTH, [](Case& c) { c.a.struct_size = 0; }, {"struct_size"});
  add("struct_size too large", DENSE, BOTH, [](Case& c) { c.a.struct_size += 8; }, {"struct_size"});
  add("width 0", DENSE, BOTH, [](Case& c) { c.a.width = 0; }, {"width"});
  add("width -3", DENSE, BOTH, [](Case& c) { c.a.width = -3; }, {"width"});
  add("width above SC_MAX_WIDTH (weight broadcast)", DENSE, BOTH,
      [](Case& c) {
        c.a.width = SC_MAX_WIDTH + 1;
        c.a.weight.shape[1] = c.a.dweight.shape[1] = SC_MAX_WIDTH + 1;
        c.a.weight.stride[0] = c.a.weight.stride[1] = 0;
      },
      {"width"});
  add("width INT32_MAX, state_len = width (W + 1 overflows an int)", DENSE, BOTH,
      [](Case& c) {
        c.a.width = c.a.state_len = INT32_MAX;
        c.a.weight.shape[1] = c.a.dweight.shape[1] = INT32_MAX;
        c.a.weight.stride[0] = c.a.weight.stride[1] = 0;
      },
      {"width"});
  add("activation 2", DENSE, BOTH, [](Case& c) { c.a.activation = 2; }, {"activation"});
  add("activation -1", DENSE, BOTH, [](Case& c) { c.a.activation = -1; }, {"activation"});
  add("backend 3", DENSE, BOTH, [](Case& c) { c.a.exec.backend = 3; }, {"exec.backend"});
  add("backend -1", DENSE, BOTH, [](Case& c) { c.a.exec.backend = -1; }, {"exec.backend"});
  if (!sc_has_backend(SC_BACKEND_CUDA))
    add("cuda backend in a CPU-only build", DENSE, BOTH,
        [](Case& c) { c.a.exec.backend = SC_BACKEND_CUDA; }, {"exec.backend"}, SC_ERR_UNSUPPORTED);
  add("num_threads -1", DENSE, BOTH, [](Case& c) { c.a.exec.num_threads = -1; },
      {"exec.num_threads"});
  add("tile_t -1", DENSE, BOTH, [](Case& c) { c.a.exec.tile_t = -1; }, {"exec.tile_t"});
  add("tile_d -1", DENSE, BOTH, [](Case& c) { c.a.exec.tile_d = -1; }, {"tile_d"});
  add("overlap 3", DENSE, BOTH, [](Case& c) { c.a.exec.overlap = 3; }, {"exec.overlap"});
  add("overlap -1", DENSE, BOTH, [](Case& c) { c.a.exec.overlap = -1; }, {"exec.overlap"});

  // ---- x ----------------------------------------------------------------------
  add("x absent", DENSE, BOTH, [](Case& c) { c.a.x.ndim = 0; }, {"x"});
  add("x rank 2 without cu_seqlens", DENSE, BOTH,
      [](Case& c) { c.a.x = shortconv::tensor(c.ptr("x"), SC_F32, {kB * kT, kD}); }, {"x"});
  add("x rank 4", DENSE, BOTH, [](Case& c) { c.a.x.ndim = 4; c.a.x.shape[3] = 1; }, {"x"});
  add("x rank 5", DENSE, BOTH, [](Case& c) { c.a.x.ndim = 5; }, {"x"});
  add("x rank -1", DENSE, BOTH, [](Case& c) { c.a.x.ndim = -1; }, {"x"});
  add("x dtype int32", DENSE, BOTH, [](Case& c) { c.a.x.dtype = SC_I32; }, {"x"});
  add("x dtype 42", DENSE, BOTH, [](Case& c) { c.a.x.dtype = 42; }, {"x"});
  add("x dtype -1", DENSE, BOTH, [](Case& c) { c.a.x.dtype = -1; }, {"x"});
  add("x negative shape", DENSE, BOTH, [](Case& c) { c.a.x.shape[1] = -1; }, {"x"});
  add("negative T in every activation tensor", DENSE, BOTH,
      [](Case& c) {
        for (sc_tensor* t : {&c.a.x, &c.a.residual, &c.a.y, &c.a.dy, &c.a.dx}) t->shape[1] = -1;
      },
      {"x"});
  add("negative D everywhere", DENSE, BOTH,
      [](Case& c) {
        for (sc_tensor* t : {&c.a.x, &c.a.residual, &c.a.y, &c.a.dy, &c.a.dx}) t->shape[2] = -1;
        for (sc_tensor* t : {&c.a.initial_state, &c.a.final_state, &c.a.dfinal_state,
                             &c.a.dinitial_state})
          t->shape[1] = -1;
        c.a.weight.shape[0] = c.a.dweight.shape[0] = c.a.bias.shape[0] = c.a.dbias.shape[0] = -1;
      },
      {"x"});
  add("x negative stride", DENSE, BOTH, [](Case& c) { c.a.x.stride[1] = -kD; }, {"x"});
  add("x NULL data", DENSE, BOTH, [](Case& c) { c.a.x.data = nullptr; }, {"x"});
  add("x element count overflows", DENSE, BOTH,
      [](Case& c) { c.a.x.shape[0] = kBig; c.a.x.shape[1] = kBig; }, {"x"});
  add("x element count overflows, broadcast (offset fits)", DENSE, BOTH,
      [](Case& c) { c.a.x.shape[0] = kBig; c.a.x.shape[1] = kBig;
                    c.a.x.stride[0] = 0; c.a.x.stride[1] = 0; }, {"x"});
  add("x largest offset overflows", DENSE, BOTH,
      [](Case& c) { c.a.x.stride[0] = kBig; c.a.x.stride[1] = kBig; }, {"x"});
  add("x largest offset is INT64_MAX", DENSE, BOTH,
      [](Case& c) { c.a.x.stride[0] = INT64_MAX; c.a.x.shape[0] = 2; c.a.x.shape[1] = 1;
                    c.a.x.shape[2] = 1; }, {"x"});
  add("x byte extent overflows", DENSE, BOTH,
      [](Case& c) { c.a.x.shape[0] = 1; c.a.x.shape[1] = int64_t(1) << 61; c.a.x.shape[2] = 3;
                    c.a.x.stride[0] = 0; c.a.x.stride[1] = 3; c.a.x.stride[2] = 1; }, {"x"});
  add("packed x with B != 1", PACKED, BOTH,
      [](Case& c) { c.a.x = shortconv::tensor(c.ptr("x"), SC_F32, {2, kTotal, kD}); }, {"x"});
  add("packed x rank 4", PACKED, BOTH,
      [](Case& c) { c.a.x = shortconv::tensor(c.ptr("x"), SC_F32, {1, 1, kTotal, kD}); }, {"x"});

  // ---- weight, bias -----------------------------------------------------------
  add("weight absent", DENSE, BOTH, [](Case& c) { c.a.weight.ndim = 0; }, {"weight"});
  add("weight D mismatch", DENSE, BOTH, [](Case& c) { c.a.weight.shape[0] = kD + 1; }, {"weight"});
  add("weight W mismatch", DENSE, BOTH, [](Case& c) { c.a.weight.shape[1] = kW - 1; }, {"weight"});
  add("width mismatch vs weight", DENSE, BOTH, [](Case& c) { c.a.width = int32_t(kW + 1); },
      {"weight"});
  add("weight rank 1", DENSE, BOTH,
      [](Case& c) { c.a.weight = shortconv::tensor(c.ptr("weight"), SC_F32, {kD * kW}); },
      {"weight"});
  add("weight rank 3", DENSE, BOTH,
      [](Case& c) { c.a.weight = shortconv::tensor(c.ptr("weight"), SC_F32, {1, kD, kW}); },
      {"weight"});
  add("weight dtype int64", DENSE, BOTH, [](Case& c) { c.a.weight.dtype = SC_I64; }, {"weight"});
  add("weight NULL data", DENSE, BOTH, [](Case& c) { c.a.weight.data = nullptr; }, {"weight"});
  add("weight negative stride", DENSE, BOTH, [](Case& c) { c.a.weight.stride[0] = -1; },
      {"weight"});
  add("bias shape", DENSE, BOTH, [](Case& c) { c.a.bias.shape[0] = kD + 1; }, {"bias"});
  add("bias rank 2", DENSE, BOTH,
      [](Case& c) { c.a.bias = shortconv::tensor(c.ptr("bias"), SC_F32, {1, kD}); }, {"bias"});
  add("bias dtype != weight", DENSE, BOTH, [](Case& c) { c.a.bias.dtype = SC_F64; }, {"bias"});
  add("bias NULL data", DENSE, BOTH, [](Case& c) { c.a.bias.data = nullptr; }, {"bias"});

  // ---- activation-like tensors ----------------------------------------------------
  for (const char* nm : {"residual", "y", "dy", "dx"}) {
    const std::string s = nm;
    const int dirs = (s == "residual" || s == "y") ? FWD : BWD;
    auto get = [s](Case& c) -> sc_tensor& {
      return s == "residual" ? c.a.residual : s == "y" ? c.a.y : s == "dy" ? c.a.dy : c.a.dx;
    };
    add("act T mismatch", DENSE, dirs, [get](Case& c) { get(c).shape[1] = kT - 1; }, {s});
    add("act B mismatch", DENSE, dirs, [get](Case& c) { get(c).shape[0] = kB + 1; }, {s});
    add("act D mismatch", DENSE, dirs, [get](Case& c) { get(c).shape[2] = kD + 1; }, {s});
    add("act rank 2 vs dense x", DENSE, dirs,
        [get](Case& c) { sc_tensor& t = get(c); t = shortconv::tensor(t.data, SC_F32, {kB * kT, kD}); },
        {s});
    add("act rank 3 vs packed 2-D x", PACKED, dirs,
        [get](Case& c) { sc_tensor& t = get(c); t = shortconv::tensor(t.data, SC_F32, {1, kTotal, kD}); },
        {s});
    add("act packed total mismatch", PACKED, dirs, [get](Case& c) { get(c).shape[0] = kTotal - 1; },
        {s});
    add("act dtype f64 vs x f32", DENSE, dirs, [get](Case& c) { get(c).dtype = SC_F64; }, {s});
    add("act dtype bf16 vs x f32", DENSE, dirs, [get](Case& c) { get(c).dtype = SC_BF16; }, {s});
    add("act dtype int32", DENSE, dirs, [get](Case& c) { get(c).dtype = SC_I32; }, {s});
    add("act NULL data", DENSE, dirs, [get](Case& c) { get(c).data = nullptr; }, {s});
    add("act negative stride", DENSE, dirs, [get](Case& c) { get(c).stride[2] = -1; }, {s});
    add("act element count overflows", DENSE, dirs,
        [get](Case& c) { get(c).shape[0] = kBig; get(c).shape[1] = kBig; }, {s});
    add("act largest offset overflows", DENSE, dirs,
        [get](Case& c) { get(c).stride[0] = kBig; get(c).stride[1] = kBig; }, {s});
  }

  // ---- dweight, dbias -----------------------------------------------------------------
  add("dweight W mismatch", DENSE, BWD, [](Case& c) { c.a.dweight.shape[1] = kW - 1; }, {"dweight"});
  add("dweight D mismatch", DENSE, BWD, [](Case& c) { c.a.dweight.shape[0] = kD + 1; }, {"dweight"});
  add("dweight rank 3", DENSE, BWD,
      [](Case& c) { c.a.dweight = shortconv::tensor(c.ptr("dweight"), SC_F32, {1, kD, kW}); },
      {"dweight"});
  add("dweight dtype != weight", DENSE, BWD, [](Case& c) { c.a.dweight.dtype = SC_F16; },
      {"dweight"});
  add("dweight NULL data", DENSE, BWD, [](Case& c) { c.a.dweight.data = nullptr; }, {"dweight"});
  add("dbias shape", DENSE, BWD, [](Case& c) { c.a.dbias.shape[0] = kD - 1; }, {"dbias"});
  add("dbias dtype != weight", DENSE, BWD, [](Case& c) { c.a.dbias.dtype = SC_BF16; }, {"dbias"});
  add("dbias NULL data", DENSE, BWD, [](Case& c) { c.a.dbias.data = nullptr; }, {"dbias"});
  add("param dtype group: weight f64 with f32 bias", DENSE, BOTH,
      [](Case& c) { c.a.weight.dtype = SC_F64; }, {"bias"});

  // ---- state length and state tensors ---------------------------------------------
  add("state_len < W-1", DENSE, BOTH, [](Case& c) { c.a.state_len = int32_t(kW - 2); },
      {"state_len"});
  add("state_len -2", DENSE, BOTH, [](Case& c) { c.a.state_len = -2; }, {"state_len"});
  add("state_len != initial_state's S", DENSE, BOTH,
      [](Case& c) { c.a.state_len = int32_t(kS + 1); }, {"initial_state", "state_len"});
  add("state_len != pool's S", PACKED, BOTH, [](Case& c) { c.a.state_len = int32_t(kS + 1); },
      {"initial_state", "state_len"});
  add("S from initial_state < W-1", DENSE, BOTH,
      [](Case& c) { c.a.initial_state.shape[2] = kW - 2; }, {"initial_state"});
  add("state_len < W-1 without states", DENSE, BOTH,
      [](Case& c) {
        for (sc_tensor* t : {&c.a.initial_state, &c.a.final_state, &c.a.dfinal_state,
                             &c.a.dinitial_state})
          t->ndim = 0;
        c.a.state_len = int32_t(kW - 2);
      },
      {"state_len"});
  add("final_state S != initial_state S", DENSE, FWD,
      [](Case& c) { c.a.final_state.shape[2] = kS + 1; }, {"final_state"});
  add("dfinal_state S != initial_state S", DENSE, BWD,
      [](Case& c) { c.a.dfinal_state.shape[2] = kS + 1; }, {"dfinal_state"});
  add("dinitial_state S != initial_state S", DENSE, BWD,
      [](Case& c) { c.a.dinitial_state.shape[2] = kS - 1; }, {"dinitial_state"});
  for (const char* nm : {"initial_state", "final_state", "dfinal_state", "dinitial_state"}) {
    const std::string s = nm;
    const int dirs = s == "initial_state" ? BOTH : s == "final_state" ? FWD : BWD;
    auto get = [s](Case& c) -> sc_tensor& {
      return s == "initial_state" ? c.a.initial_state
             : s == "final_state" ? c.a.final_state
             : s == "dfinal_state" ? c.a.dfinal_state
                                   : c.a.dinitial_state;
    };
    add("state N mismatch", DENSE, dirs, [get](Case& c) { get(c).shape[0] = kB + 1; }, {s});
    add("state D mismatch", DENSE, dirs, [get](Case& c) { get(c).shape[1] = kD - 1; }, {s});
    add("state rank 2", DENSE, dirs,
        [get](Case& c) { sc_tensor& t = get(c); t = shortconv::tensor(t.data, SC_F32, {kB, kD * kS}); },
        {s});
    add("state rank 4", DENSE, dirs,
        [get](Case& c) { sc_tensor& t = get(c); t = shortconv::tensor(t.data, SC_F32, {1, kB, kD, kS}); },
        {s});
    add("state dtype int32", DENSE, dirs, [get](Case& c) { get(c).dtype = SC_I32; }, {s});
    add("state NULL data", DENSE, dirs, [get](Case& c) { get(c).data = nullptr; }, {s});
    add("state negative shape", DENSE, dirs, [get](Case& c) { get(c).shape[0] = -2; }, {s});
    add("state negative stride", DENSE, dirs, [get](Case& c) { get(c).stride[0] = -1; }, {s});
    add("state largest offset overflows", DENSE, dirs,
        [get](Case& c) { get(c).stride[0] = kBig; get(c).stride[1] = kBig; }, {s});
    add("packed state N mismatch", PACKED, dirs,
        [get, s](Case& c) {
          if (s == "initial_state" || s == "final_state") get(c).shape[1] = kD + 1;  // pool: D
          else get(c).shape[0] = kN + 1;
        },
        {s});
  }
  // the state dtype group: one dtype shared by all four (the first present sets it)
  add("state dtype group: final_state f64", DENSE, FWD,
      [](Case& c) { c.a.final_state.dtype = SC_F64; }, {"final_state"});
  add("state dtype group: dfinal_state f16", DENSE, BWD,
      [](Case& c) { c.a.dfinal_state.dtype = SC_F16; }, {"dfinal_state"});
  add("state dtype group: dinitial_state bf16", DENSE, BWD,
      [](Case& c) { c.a.dinitial_state.dtype = SC_BF16; }, {"dinitial_state"});
  // initial_state sets the group's dtype; the first other state tensor is named
  add("state dtype group: initial_state f64 (fwd)", DENSE, FWD,
      [](Case& c) { c.a.initial_state.dtype = SC_F64; }, {"final_state"});
  add("state dtype group: initial_state f64 (bwd)", DENSE, BWD,
      [](Case& c) { c.a.initial_state.dtype = SC_F64; }, {"dfinal_state"});
  add("state dtype group: pools bf16, dfinal_state f32", PACKED, BWD,
      [](Case& c) { c.a.initial_state.dtype = c.a.dinitial_state.dtype = SC_BF16; },
      {"dfinal_state"});
  add("dense state pool without indices", PACKED, BOTH,
      [](Case& c) { c.a.initial_state_indices.ndim = 0; }, {"initial_state"});
  add("final pool without indices", PACKED, FWD, [](Case& c) { c.a.final_state_indices.ndim = 0; },
      {"final_state"});

  // ---- cu_seqlens --------------------------------------------------------------------
  add("cu_seqlens [0] entries", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.shape[0] = 0; },
      {"cu_seqlens"});
  add("cu_seqlens rank 2", PACKED, BOTH,
      [](Case& c) { c.a.cu_seqlens = shortconv::tensor(c.ptr("cu_seqlens"), SC_I32, {1, kN + 1}); },
      {"cu_seqlens"});
  add("cu_seqlens dtype f32", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.dtype = SC_F32; },
      {"cu_seqlens"});
  add("cu_seqlens dtype f64", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.dtype = SC_F64; },
      {"cu_seqlens"});
  add("cu_seqlens NULL data", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.data = nullptr; },
      {"cu_seqlens"});
  add("cu_seqlens negative stride", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.stride[0] = -1; },
      {"cu_seqlens"});
  add("cu_seqlens not starting at 0", PACKED, BOTH,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("cu_seqlens"))[0] = 1; }, {"cu_seqlens"});
  add("cu_seqlens starting at -1", PACKED, BOTH,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("cu_seqlens"))[0] = -1; }, {"cu_seqlens"});
  add("cu_seqlens decreasing", PACKED, BOTH,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("cu_seqlens"))[2] = 2; }, {"cu_seqlens"});
  add("cu_seqlens ends before total", PACKED, BOTH,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("cu_seqlens"))[3] = 6; }, {"cu_seqlens"});
  add("cu_seqlens ends after total", PACKED, BOTH,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("cu_seqlens"))[3] = 8; }, {"cu_seqlens"});
  add("cu_seqlens int64 ends after total", PACKED, BOTH,
      [](Case& c) { c.a.cu_seqlens = c.index<int64_t>("cu_seqlens", SC_I64, {0, 3, 3, kBig}); },
      {"cu_seqlens"});
  add("cu_seqlens length vs final_state_indices", PACKED, FWD,
      [](Case& c) { c.a.cu_seqlens = c.index<int32_t>("cu_seqlens", SC_I32, {0, 7}); },
      {"initial_state_indices"});

  // ---- state indices ---------------------------------------------------------------------
  for (const char* nm : {"initial_state_indices", "final_state_indices"}) {
    const std::string s = nm;
    const bool init = s == "initial_state_indices";
    const int dirs = init ? BOTH : FWD;
    auto get = [init](Case& c) -> sc_tensor& {
      return init ? c.a.initial_state_indices : c.a.final_state_indices;
    };
    auto set = [init](Case& c, int64_t v) {  // entry 1 := v, in the index's own dtype
      if (init) reinterpret_cast<int64_t*>(c.ptr("initial_state_indices"))[1] = v;
      else reinterpret_cast<int32_t*>(c.ptr("final_state_indices"))[1] = int32_t(v);
    };
    add("index = P", PACKED, dirs, [set](Case& c) { set(c, kP); }, {s});
    add("index = -2", PACKED, dirs, [set](Case& c) { set(c, -2); }, {s});
    add("index huge", PACKED, dirs, [set](Case& c) { set(c, INT32_MAX); }, {s});
    add("index shape [N+1]", PACKED, dirs, [get](Case& c) { get(c).shape[0] = kN + 1; }, {s});
    add("index shape [N-1]", PACKED, dirs, [get](Case& c) { get(c).shape[0] = kN - 1; }, {s});
    add("index rank 2", PACKED, dirs,
        [get](Case& c) { sc_tensor& t = get(c); t = shortconv::tensor(t.data, sc_dtype(t.dtype), {1, kN}); },
        {s});
    add("index dtype f32", PACKED, dirs, [get](Case& c) { get(c).dtype = SC_F32; }, {s});
    add("index dtype f16", PACKED, dirs, [get](Case& c) { get(c).dtype = SC_F16; }, {s});
    add("index NULL data", PACKED, dirs, [get](Case& c) { get(c).data = nullptr; }, {s});
    add("index without its state", PACKED, dirs,
        [init](Case& c) { (init ? c.a.initial_state : c.a.final_state).ndim = 0; }, {s});
    add("index without its state (dense)", DENSE, dirs,
        [init](Case& c) {
          sc_tensor idx = c.index<int32_t>("idx", SC_I32, {0, 1});
          if (init) { c.a.initial_state.ndim = 0; c.a.initial_state_indices = idx; }
          else { c.a.final_state.ndim = 0; c.a.final_state_indices = idx; }
        },
        {s});
  }

  add("final_state_indices names a row twice", PACKED, FWD,
      [](Case& c) { reinterpret_cast<int32_t*>(c.ptr("final_state_indices"))[2] = 1; },
      {"final_state_indices"});
  add("final_state_indices names a row twice (int64, dense x)", DENSE, FWD,
      [](Case& c) {
        c.a.final_state = shortconv::tensor(c.ptr("final_state"), SC_F32, {kB, kD, kS});
        c.a.final_state_indices = c.index<int64_t>("fsi", SC_I64, {1, 1});
      },
      {"final_state_indices"});

  // ---- state addressing: flags, ring rows, the pad index (semantics section 5) ------
  auto flags = [](Case& c) {
    c.a.has_initial_state = c.index<uint8_t>("has_initial_state", SC_BOOL, {1, 0, 1});
  };
  auto rings = [](Case& c) { c.a.ring_offsets = c.index<int32_t>("ring_offsets", SC_I32, {0, 5, 2}); };
  add("has_initial_state shape [N+1]", PACKED, BOTH,
      [](Case& c) { c.a.has_initial_state = c.index<uint8_t>("f", SC_BOOL, {1, 0, 1, 1}); },
      {"has_initial_state"});
  add("has_initial_state dtype f32", PACKED, BOTH,
      [flags](Case& c) { flags(c); c.a.has_initial_state.dtype = SC_F32; }, {"has_initial_state"});
  add("has_initial_state rank 2", PACKED, BOTH,
      [flags](Case& c) {
        flags(c);
        c.a.has_initial_state = shortconv::tensor(c.ptr("has_initial_state"), SC_BOOL, {1, kN});
      },
      {"has_initial_state"});
  add("has_initial_state NULL data", PACKED, BOTH,
      [flags](Case& c) { flags(c); c.a.has_initial_state.data = nullptr; }, {"has_initial_state"});
  add("has_initial_state without initial_state", PACKED, BOTH,
      [flags](Case& c) { flags(c); c.a.initial_state.ndim = 0; c.a.initial_state_indices.ndim = 0; },
      {"has_initial_state", "initial_state"});
  add("ring_offsets negative", PACKED, BOTH,
      [rings](Case& c) { rings(c); reinterpret_cast<int32_t*>(c.ptr("ring_offsets"))[2] = -1; },
      {"ring_offsets[2]"});
  add("ring_offsets dtype bool", PACKED, BOTH,
      [rings](Case& c) { rings(c); c.a.ring_offsets.dtype = SC_BOOL; }, {"ring_offsets"});
  add("ring_offsets shape [N-1]", PACKED, BOTH,
      [rings](Case& c) { rings(c); c.a.ring_offsets.shape[0] = kN - 1; }, {"ring_offsets"});
  add("ring_offsets without a state tensor", PACKED, BOTH,
      [rings](Case& c) {
        rings(c);
        c.a.initial_state.ndim = c.a.initial_state_indices.ndim = 0;
        c.a.final_state.ndim = c.a.final_state_indices.ndim = 0;
      },
      {"ring_offsets"});
  add("bool cu_seqlens", PACKED, BOTH, [](Case& c) { c.a.cu_seqlens.dtype = SC_BOOL; },
      {"cu_seqlens"});
  add("bool state index", PACKED, BOTH, [](Case& c) { c.a.initial_state_indices.dtype = SC_BOOL; },
      {"initial_state_indices"});
  add("index = -2 with pad_index -3", PACKED, BOTH,
      [](Case& c) {
        c.a.pad_index = -3;
        reinterpret_cast<int64_t*>(c.ptr("initial_state_indices"))[1] = -2;
      },
      {"initial_state_indices", "pad_index"});
  add("final_state over ring_offsets", PACKED, FWD,
      [rings](Case& c) { rings(c); alias(c.a.ring_offsets, c.a.final_state); },
      {"final_state", "ring_offsets"});
  add("dinitial_state over has_initial_state", PACKED, BWD,
      [](Case& c) {
        c.a.has_initial_state = c.index<int32_t>("has_initial_state", SC_I32, {1, 0, 1});
        alias(c.a.has_initial_state, c.a.dinitial_state);
      },
      {"dinitial_state", "has_initial_state"});

  // ---- serving steps: speculative decoding, tree drafts (semantics section 5) -----------
  // Packed baseline with rows of S entries (lengths 3, 0, 4; W = 3): counts valid for
  // S = 6 (1 <= a <= S - (W-1) + 1 = 5); sequence 1 reads no row, so its count is not read.
  auto rows_of = [](Case& c, int64_t S) {
    c.a.initial_state = c.make("initial_state", SC_F32, {kP, kD, S}, false);
    c.a.final_state = c.make("final_state", SC_F32, {kP, kD, S}, true);
    c.a.dfinal_state = c.make("dfinal_state", SC_F32, {kN, kD, S}, false);
    c.a.dinitial_state = c.make("dinitial_state", SC_F32, {kN, kD, S}, true);
  };
  auto spec = [rows_of](Case& c) {
    rows_of(c, 6);
    c.a.num_accepted = c.index<int32_t>("num_accepted", SC_I32, {1, 9, 4});
  };
  auto tree = [](Case& c) {  // [N, M = 4]: parents of tokens >= L_n are not read
    c.a.parent_tokens = c.index<int32_t>("parent_tokens", SC_I32,
                                         {-1, 0, 1, 77, 5, 5, 5, 5, -9, 0, 0, 2});
    c.a.parent_tokens = shortconv::tensor(c.a.parent_tokens.data, SC_I32, {kN, 4});
  };
  auto parent = [](Case& c, int64_t n, int64_t t) -> int32_t& {
    return reinterpret_cast<int32_t*>(c.ptr("parent_tokens"))[n * 4 + t];
  };
  auto count = [](Case& c, int64_t n) -> int32_t& {
    return reinterpret_cast<int32_t*>(c.ptr("num_accepted"))[n];
  };
  add("num_accepted 0", PACKED, FWD, [spec, count](Case& c) { spec(c); count(c, 0) = 0; },
      {"num_accepted[0]"});
  add("num_accepted -1", PACKED, FWD, [spec, count](Case& c) { spec(c); count(c, 2) = -1; },
      {"num_accepted[2]"});
  add("num_accepted past the row (> S - (W-1) + 1)", PACKED, FWD,
      [spec, count](Case& c) { spec(c); count(c, 2) = 5 + 1; }, {"num_accepted[2]"});
  add("num_accepted: row too short for the step's tokens", PACKED, FWD,
      [spec, rows_of, count](Case& c) {
        spec(c);
        rows_of(c, 4);  // sequence 2 has 4 tokens: (W-2) + 4 = 5 entries > S = 4
        count(c, 2) = 1;
      },
      {"num_accepted"});
  add("num_accepted: dense steps longer than the row", DENSE, FWD,
      [](Case& c) { c.a.num_accepted = c.index<int64_t>("num_accepted", SC_I64, {1, 1}); },
      {"num_accepted"});
  add("num_accepted with ring_offsets", PACKED, FWD,
      [spec, rings](Case& c) { spec(c); rings(c); }, {"num_accepted", "ring_offsets"});
  add("num_accepted without a state tensor", PACKED, FWD,
      [spec](Case& c) {
        spec(c);
        c.a.initial_state.ndim = c.a.initial_state_indices.ndim = 0;
        c.a.final_state.ndim = c.a.final_state_indices.ndim = 0;
      },
      {"num_accepted"});
  add("num_accepted shape [N+1]", PACKED, FWD,
      [spec](Case& c) { spec(c); c.a.num_accepted.shape[0] = kN + 1; }, {"num_accepted"});
  add("num_accepted dtype f32", PACKED, FWD,
      [spec](Case& c) { spec(c); c.a.num_accepted.dtype = SC_F32; }, {"num_accepted"});
  add("num_accepted dtype bool", PACKED, FWD,
      [spec](Case& c) { spec(c); c.a.num_accepted.dtype = SC_BOOL; }, {"num_accepted"});
  add("num_accepted in the backward", PACKED, BWD, spec, {"num_accepted"}, SC_ERR_UNSUPPORTED);
  add("final_state over num_accepted", PACKED, FWD,
      [spec](Case& c) { spec(c); alias(c.a.num_accepted, c.a.final_state); },
      {"final_state", "num_accepted"});
  add("parent_tokens pointing forward", PACKED, FWD,
      [tree, parent](Case& c) { tree(c); parent(c, 2, 3) = 3; }, {"parent_tokens[2, 3]"});
  add("parent_tokens pointing past the step", PACKED, FWD,
      [tree, parent](Case& c) { tree(c); parent(c, 0, 2) = 7; }, {"parent_tokens[0, 2]"});
  add("parent_tokens negative", PACKED, FWD,
      [tree, parent](Case& c) { tree(c); parent(c, 0, 1) = -1; }, {"parent_tokens[0, 1]"});
  add("parent_tokens rows shorter than a sequence", PACKED, FWD,
      [tree](Case& c) {
        tree(c);
        c.a.parent_tokens = shortconv::tensor(c.a.parent_tokens.data, SC_I32, {kN, 3});
      },
      {"parent_tokens"});
  add("parent_tokens rows shorter than T (dense)", DENSE, FWD,
      [](Case& c) {
        c.a.parent_tokens = shortconv::tensor(c.make("parent_tokens", SC_I32, {kB, kT - 1}, false).data,
                                              SC_I32, {kB, kT - 1});
      },
      {"parent_tokens"});
  add("parent_tokens shape [N+1, M]", PACKED, FWD,
      [tree](Case& c) { tree(c); c.a.parent_tokens.shape[0] = kN + 1; }, {"parent_tokens"});
  add("parent_tokens rank 1", PACKED, FWD,
      [tree](Case& c) { tree(c); c.a.parent_tokens.ndim = 1; }, {"parent_tokens"});
  add("parent_tokens dtype f16", PACKED, FWD,
      [tree](Case& c) { tree(c); c.a.parent_tokens.dtype = SC_F16; }, {"parent_tokens"});
  add("parent_tokens NULL data", PACKED, FWD,
      [tree](Case& c) { tree(c); c.a.parent_tokens.data = nullptr; }, {"parent_tokens"});
  add("parent_tokens in the backward", PACKED, BWD, tree, {"parent_tokens"}, SC_ERR_UNSUPPORTED);
  // ---- block tables and prefix caching (semantics section 5) ------------------------
  // Packed baseline (lengths 3, 0, 4), pools of 12 rows, table row n = rows 4n .. 4n+3,
  // block size 2, computed {1, 0, 2}: sequence 0 snapshots its boundary at 2 into row 0
  // and ends in row 1; sequence 1 (no tokens) copies into row 4; sequence 2 snapshots 4
  // into row 9 and ends in row 10.
  auto apc = [](Case& c) {
    c.a.initial_state = c.make("initial_state", SC_F32, {12, kD, kS}, false);
    c.a.final_state = c.make("final_state", SC_F32, {12, kD, kS}, true);
    c.a.initial_state_indices.ndim = c.a.final_state_indices.ndim = 0;
    c.a.block_table = c.index<int32_t>("block_table", SC_I32, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    c.a.block_table = shortconv::tensor(c.a.block_table.data, SC_I32, {kN, 4});
    c.a.initial_block = c.index<int32_t>("initial_block", SC_I32, {0, 0, 1});
    c.a.final_block = c.index<int32_t>("final_block", SC_I32, {1, 0, 2});
    c.a.first_block = c.index<int64_t>("first_block", SC_I64, {0, 0, 1});
    c.a.computed_tokens = c.index<int64_t>("computed_tokens", SC_I64, {1, 0, 2});
    c.a.block_size = 2;
  };
  auto tab = [](Case& c, int64_t n, int64_t b) -> int32_t& {
    return reinterpret_cast<int32_t*>(c.ptr("block_table"))[n * 4 + b];
  };
  add("block_table without final_block", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.final_block.ndim = 0; }, {"final_block", "block_table"});
  add("initial_block without block_table", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.block_table.ndim = 0; c.a.block_size = 0;
                       c.a.first_block.ndim = c.a.computed_tokens.ndim = 0; },
      {"block_table", "initial_block"});
  add("block_size without computed_tokens", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.computed_tokens.ndim = 0; }, {"computed_tokens", "block_size"});
  add("first_block with block_size 0", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.block_size = 0; }, {"block_size", "first_block"});
  add("block_size negative", PACKED, FWD, [apc](Case& c) { apc(c); c.a.block_size = -2; },
      {"block_size"});
  add("prefix caching without a block table", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.block_table.ndim = c.a.initial_block.ndim = c.a.final_block.ndim = 0; },
      {"block_size", "block_table"});
  add("block_table with initial_state_indices", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.initial_state_indices.ndim = 1; },
      {"block_table", "initial_state_indices"});
  add("block_table with ring_offsets", PACKED, FWD, [apc, rings](Case& c) { apc(c); rings(c); },
      {"block_table", "ring_offsets"});
  add("prefix caching with num_accepted", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.num_accepted = c.index<int32_t>("num_accepted", SC_I32, {1, 1, 1}); },
      {"block_table", "num_accepted"});
  add("prefix caching without final_state", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.final_state.ndim = 0; }, {"block_table", "final_state"});
  add("block_table shape [N+1, M]", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.block_table.shape[0] = kN + 1; }, {"block_table"});
  add("block_table rank 1", PACKED, FWD, [apc](Case& c) { apc(c); c.a.block_table.ndim = 1; },
      {"block_table"});
  add("block_table dtype f32", PACKED, FWD, [apc](Case& c) { apc(c); c.a.block_table.dtype = SC_F32; },
      {"block_table"});
  add("final_block dtype bool", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.final_block.dtype = SC_BOOL; }, {"final_block"});
  add("computed_tokens shape [N-1]", PACKED, FWD,
      [apc](Case& c) { apc(c); c.a.computed_tokens.shape[0] = kN - 1; }, {"computed_tokens"});
  add("initial_block past the table", PACKED, FWD,
      [apc](Case& c) { apc(c); reinterpret_cast<int32_t*>(c.ptr("initial_block"))[0] = 4; },
      {"initial_block[0]"});
  add("final_block negative", PACKED, FWD,
      [apc](Case& c) { apc(c); reinterpret_cast<int32_t*>(c.ptr("final_block"))[2] = -1; },
      {"final_block[2]"});
  add("block_table entry past the pool", PACKED, FWD,
      [apc, tab](Case& c) { apc(c); tab(c, 2, 1) = 12; }, {"block_table[2, 1]"});
  add("first_block past the table", PACKED, FWD,
      [apc](Case& c) { apc(c); reinterpret_cast<int64_t*>(c.ptr("first_block"))[2] = 4; },
      {"first_block[2]"});
  add("computed_tokens negative", PACKED, FWD,
      [apc](Case& c) { apc(c); reinterpret_cast<int64_t*>(c.ptr("computed_tokens"))[1] = -1; },
      {"computed_tokens[1]"});
  add("a snapshot row is another sequence's final row", PACKED, FWD,
      [apc, tab](Case& c) { apc(c); tab(c, 2, 2) = 0; }, {"block_table"});
  add("in place: a snapshot row is another sequence's initial state", PACKED, FWD,
      [apc, tab](Case& c) {
        apc(c);
        c.a.final_state = c.a.initial_state;
        reinterpret_cast<int32_t*>(c.ptr("initial_block"))[1] = 1;  // sequence 1 reads row 5
        tab(c, 2, 1) = 5;                                            // which sequence 2 snapshots
      },
      {"block_table[1]"});
  add("block_table in the backward", PACKED, BWD, apc, {"block_table"}, SC_ERR_UNSUPPORTED);
  add("in place: a row written for one sequence is another's initial state", PACKED, FWD,
      [](Case& c) {
        c.a.final_state = c.a.initial_state;  // rows read {2, -1, 0}; sequence 1 now writes 2
        reinterpret_cast<int32_t*>(c.ptr("final_state_indices"))[1] = 2;
      },
      {"initial_state_indices[0]", "final_state_indices"});
  // ---- sequence ids (section 3) ----------------------------------------------------------
  add("seq_idx with cu_seqlens", PACKED, BOTH,
      [](Case& c) {
        c.a.seq_idx = c.index<int32_t>("seq_idx", SC_I32, {0, 0, 0, 1, 1, 1, 1});
        c.a.seq_idx.ndim = 2;
        c.a.seq_idx.shape[0] = 1;
        c.a.seq_idx.shape[1] = kTotal;
        c.a.seq_idx.stride[0] = kTotal;
        c.a.seq_idx.stride[1] = 1;
      },
      {"seq_idx", "cu_seqlens"});
  add("seq_idx with a packed [total, D] x", PACKED, BOTH,
      [](Case& c) {
        c.a.cu_seqlens.ndim = c.a.initial_state_indices.ndim = c.a.final_state_indices.ndim = 0;
        c.a.seq_idx = c.index<int32_t>("seq_idx", SC_I32, {0, 0, 0, 1, 1, 1, 1});
      },
      {"seq_idx", "x"});
  add("seq_idx shape [B, T+1]", DENSE, BOTH,
      [](Case& c) { use_ids(c); c.a.seq_idx.shape[1] = kT + 1; c.a.seq_idx.shape[0] = 1; },
      {"seq_idx"});
  add("seq_idx rank 1", DENSE, BOTH, [](Case& c) { use_ids(c); c.a.seq_idx.ndim = 1; },
      {"seq_idx"});
  add("seq_idx float dtype", DENSE, BOTH, [](Case& c) { use_ids(c); c.a.seq_idx.dtype = SC_F32; },
      {"seq_idx"});
  add("seq_idx negative stride", DENSE, BOTH,
      [](Case& c) { use_ids(c); c.a.seq_idx.stride[1] = -1; }, {"seq_idx"});
  add("seq_idx NULL", DENSE, BOTH, [](Case& c) { use_ids(c); c.a.seq_idx.data = nullptr; },
      {"seq_idx"});
  add("seq_idx with initial_state_indices", DENSE, BOTH,
      [](Case& c) {
        use_ids(c);
        c.a.initial_state_indices = c.index<int32_t>("isi", SC_I32, {0, 1});
      },
      {"initial_state_indices", "seq_idx"});
  add("seq_idx with final_state_indices", DENSE, FWD,
      [](Case& c) {
        use_ids(c);
        c.a.final_state_indices = c.index<int32_t>("fsi", SC_I32, {0, 1});
      },
      {"final_state_indices", "seq_idx"});
  add("seq_idx with has_initial_state", DENSE, BOTH,
      [](Case& c) {
        use_ids(c);
        c.a.has_initial_state = c.index<int32_t>("flags", SC_I32, {1, 0});
      },
      {"has_initial_state", "seq_idx"});
  add("seq_idx with ring_offsets", DENSE, BOTH,
      [](Case& c) {
        use_ids(c);
        c.a.ring_offsets = c.index<int32_t>("rings", SC_I32, {0, 1});
      },
      {"ring_offsets", "seq_idx"});
  add("seq_idx state of another D", DENSE, BOTH,
      [](Case& c) { use_ids(c); c.a.initial_state.shape[1] = kD + 1; }, {"initial_state"});
  add("seq_idx dinitial_state rows differ from initial_state's", DENSE, BWD,
      [](Case& c) { use_ids(c); c.a.dinitial_state.shape[0] = kIdRows - 1; }, {"dinitial_state"});
  add("seq_idx id past initial_state rows", DENSE, BOTH,
      [](Case& c) { use_ids(c, {0, 0, 1, 1, -1, -2, 2, 2, 4, 4}); },
      {"seq_idx", "initial_state"});
  add("seq_idx id past final_state rows", DENSE, FWD,
      [](Case& c) { use_ids(c); c.a.final_state.shape[0] = 3; }, {"seq_idx", "final_state"});
  add("seq_idx id past dfinal_state rows", DENSE, BWD,
      [](Case& c) { use_ids(c); c.a.dfinal_state.shape[0] = 2; }, {"seq_idx", "dfinal_state"});
  add("seq_idx id in two runs with final_state", DENSE, FWD,
      [](Case& c) { use_ids(c, {0, 0, 1, 1, -1, -2, 2, 2, 0, 0}); }, {"seq_idx", "final_state"});
  add("seq_idx id in two runs of a row with dinitial_state", DENSE, BWD,
      [](Case& c) {
        use_ids(c, {0, 1, 0, 2, 2, 3, 3, 3, 3, 3});
        c.a.dfinal_state.ndim = 0;
      },
      {"seq_idx", "dinitial_state"});
  add("seq_idx broadcast rows with final_state", DENSE, FWD,
      [](Case& c) { use_ids(c); c.a.seq_idx.stride[0] = 0; }, {"seq_idx", "final_state"});
  add("y over seq_idx", DENSE, FWD, [](Case& c) { use_ids(c); alias(c.a.seq_idx, c.a.y); },
      {"y", "seq_idx"});
  add("dx over seq_idx", DENSE, BWD, [](Case& c) { use_ids(c); alias(c.a.seq_idx, c.a.dx); },
      {"dx", "seq_idx"});
  add("seq_idx with num_accepted", DENSE, FWD,
      [](Case& c) { use_ids(c); c.a.num_accepted = c.index<int32_t>("num_accepted", SC_I32, {1, 1}); },
      {"num_accepted", "seq_idx"});
  add("seq_idx with parent_tokens", DENSE, FWD,
      [](Case& c) {
        use_ids(c);
        c.a.parent_tokens = c.index<int32_t>("parent_tokens", SC_I32, {-1, 0, 1, 2, 3, -1, 0, 1, 2, 3});
        c.a.parent_tokens = shortconv::tensor(c.a.parent_tokens.data, SC_I32, {kB, kT});
      },
      {"parent_tokens", "seq_idx"});
  add("seq_idx with block_table", DENSE, FWD,
      [](Case& c) {
        use_ids(c);
        c.a.block_table = c.index<int32_t>("block_table", SC_I32, {0, 1});
        c.a.block_table = shortconv::tensor(c.a.block_table.data, SC_I32, {kB, 1});
        c.a.initial_block = c.index<int32_t>("initial_block", SC_I32, {0, 0});
        c.a.final_block = c.index<int32_t>("final_block", SC_I32, {0, 0});
      },
      {"block_table", "seq_idx"});

  // ---- outputs overlapping inputs or each other ---------------------------------------
  add("y over x", DENSE, FWD, [](Case& c) { alias(c.a.x, c.a.y); }, {"y", "x"});
  add("y over x (+1 element)", DENSE, FWD, [](Case& c) { alias(c.a.x, c.a.y, 1); }, {"y", "x"});
  add("y ending inside x", DENSE, FWD,
      [](Case& c) { c.a.y.data = static_cast<uint8_t*>(c.a.x.data) - 4 * (kB * kT * kD - 1); },
      {"y", "x"});
  add("y over residual", DENSE, FWD, [](Case& c) { alias(c.a.residual, c.a.y); },
      {"y", "residual"});
  add("y over weight", DENSE, FWD, [](Case& c) { alias(c.a.weight, c.a.y, 2); }, {"y", "weight"});
  add("y over bias", DENSE, FWD, [](Case& c) { alias(c.a.bias, c.a.y); }, {"y", "bias"});
  add("y over initial_state", DENSE, FWD, [](Case& c) { alias(c.a.initial_state, c.a.y); },
      {"y", "initial_state"});
  add("y over cu_seqlens", PACKED, FWD, [](Case& c) { alias(c.a.cu_seqlens, c.a.y); },
      {"y", "cu_seqlens"});
  add("final_state partially over initial_state", DENSE, FWD,
      [](Case& c) { alias(c.a.initial_state, c.a.final_state, 1); },
      {"final_state", "initial_state"});
  add("final_state = initial_state with other strides", DENSE, FWD,
      [](Case& c) {
        c.a.final_state.data = c.a.initial_state.data;
        c.a.final_state.stride[0] = 1;
        c.a.final_state.stride[1] = kB;
        c.a.final_state.stride[2] = kB * kD;
      },
      {"final_state", "initial_state"});
  add("final pool over initial pool (+1 row)", PACKED, FWD,
      [](Case& c) { alias(c.a.initial_state, c.a.final_state, kD * kS); },
      {"final_state", "initial_state"});
  add("final_state over y", DENSE, FWD, [](Case& c) { alias(c.a.final_state, c.a.y, 3); },
      {"final_state", "y"});
  add("y over final_state", DENSE, FWD, [](Case& c) { alias(c.a.y, c.a.final_state); },
      {"final_state", "y"});
  add("final_state over final_state_indices", PACKED, FWD,
      [](Case& c) { alias(c.a.final_state_indices, c.a.final_state); },
      {"final_state", "final_state_indices"});
  add("final_state over initial_state_indices", PACKED, FWD,
      [](Case& c) { alias(c.a.initial_state_indices, c.a.final_state); },
      {"final_state", "initial_state_indices"});
  add("dx over dy", DENSE, BWD, [](Case& c) { alias(c.a.dy, c.a.dx); }, {"dx", "dy"});
  add("dx over x", DENSE, BWD, [](Case& c) { alias(c.a.x, c.a.dx, 4); }, {"dx", "x"});
  add("dx over cu_seqlens", PACKED, BWD, [](Case& c) { alias(c.a.cu_seqlens, c.a.dx); },
      {"dx", "cu_seqlens"});
  add("dweight over weight", DENSE, BWD, [](Case& c) { alias(c.a.weight, c.a.dweight); },
      {"dweight", "weight"});
  add("dbias over bias", DENSE, BWD, [](Case& c) { alias(c.a.bias, c.a.dbias); },
      {"dbias", "bias"});
  add("dbias over weight", DENSE, BWD, [](Case& c) { alias(c.a.weight, c.a.dbias, 1); },
      {"dbias", "weight"});
  add("dinitial_state over dfinal_state", DENSE, BWD,
      [](Case& c) { alias(c.a.dfinal_state, c.a.dinitial_state); },
      {"dinitial_state", "dfinal_state"});
  add("dinitial_state over initial_state", DENSE, BWD,
      [](Case& c) { alias(c.a.initial_state, c.a.dinitial_state); },
      {"dinitial_state", "initial_state"});
  add("dinitial_state over initial pool", PACKED, BWD,
      [](Case& c) { alias(c.a.initial_state, c.a.dinitial_state, 5); },
      {"dinitial_state", "initial_state"});
  add("dinitial_state over initial_state_indices", PACKED, BWD,
      [](Case& c) { alias(c.a.initial_state_indices, c.a.dinitial_state); },
      {"dinitial_state", "initial_state_indices"});
  add("dx over dinitial_state", DENSE, BWD, [](Case& c) { alias(c.a.dinitial_state, c.a.dx, 2); },
      {"dx", "dinitial_state"});
  add("dweight over dbias", DENSE, BWD, [](Case& c) { alias(c.a.dbias, c.a.dweight); },
      {"dweight", "dbias"});
  add("dbias over dx", DENSE, BWD, [](Case& c) { alias(c.a.dbias, c.a.dx, 7); }, {"dx", "dbias"});
  add("dinitial_state over dweight", DENSE, BWD,
      [](Case& c) { alias(c.a.dweight, c.a.dinitial_state, 1); }, {"dweight", "dinitial_state"});

  // ---- outputs whose layout writes an element twice ---------------------------------------
  add("y stride 0 over T", DENSE, FWD, [](Case& c) { c.a.y.stride[1] = 0; }, {"y"});
  add("y stride 0 over B", DENSE, FWD, [](Case& c) { c.a.y.stride[0] = 0; }, {"y"});
  add("y self-overlapping strides", DENSE, FWD, [](Case& c) { c.a.y.stride[1] = 1; }, {"y"});
  add("y self-overlapping strides (packed 2-D)", PACKED, FWD, [](Case& c) { c.a.y.stride[0] = 2; },
      {"y"});
  add("final_state stride 0", DENSE, FWD, [](Case& c) { c.a.final_state.stride[2] = 0; },
      {"final_state"});
  add("final pool self-overlap", PACKED, FWD,
      [](Case& c) { c.a.final_state.stride[0] = kS; }, {"final_state"});
  add("dx stride 0", DENSE, BWD, [](Case& c) { c.a.dx.stride[2] = 0; }, {"dx"});
  add("dx self-overlapping strides", DENSE, BWD, [](Case& c) { c.a.dx.stride[0] = kD; }, {"dx"});
  add("dweight stride 0", DENSE, BWD, [](Case& c) { c.a.dweight.stride[0] = 0; }, {"dweight"});
  add("dbias stride 0", DENSE, BWD, [](Case& c) { c.a.dbias.stride[0] = 0; }, {"dbias"});
  add("dinitial_state self-overlap", DENSE, BWD,
      [](Case& c) { c.a.dinitial_state.stride[1] = 1; }, {"dinitial_state"});
  return R;
}

TEST(Validation, EveryBadInputIsRejectedNamedAndWritesNothing) {
  const std::vector<Row> R = rows();
  EXPECT_GT(R.size(), 150u);
  for (const Row& r : R) check_row(r);
}

TEST(Validation, ExactMessagesForRepresentativeCases) {
  // Spot-check the "expected and given" part of the message, not only the name.
  auto c = baseline(DENSE, SC_BACKEND_REF);
  c->a.width = 0;
  sc_error err;
  ASSERT_EQ(sc_forward(&c->a, &err), SC_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(err.message, "width: expected 1 <= W <= 65536 (SC_MAX_WIDTH), got 0");
  c = baseline(PACKED, SC_BACKEND_REF);
  reinterpret_cast<int32_t*>(c->ptr("cu_seqlens"))[3] = 6;
  ASSERT_EQ(sc_backward(&c->a, &err), SC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("7"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("6"), std::string::npos) << err.message;
}

// Shapes that each fit in 64 bits but whose scratch does not (2^58 expanded
// sequences x 16 padded channels x 4 bytes of initial-state halo): the size
// query and the run report it, nothing is written, nothing wraps to a small
// size (it used to, and the kernel wrote past the workspace).
TEST(Validation, ScratchSizesThatOverflowAreRefused) {
  const int64_t N = int64_t(1) << 58;
  for (sc_backend be : {SC_BACKEND_CPU, SC_BACKEND_REF}) {
    std::vector<float> one(4, 0.5f), dw(2, -7.0f);
    sc_conv_args a;
    sc_conv_args_init(&a);
    a.width = 2;
    a.exec.backend = be;
    a.exec.num_threads = 1;
    const float* src = one.data();
    auto expanded = [&](std::initializer_list<int64_t> shape) {
      sc_tensor t = shortconv::tensor(const_cast<float*>(src), SC_F32, shape);
      for (int i = 0; i < t.ndim; ++i) t.stride[i] = 0;
      return t;
    };
    a.x = expanded({N, 1, 1});
    a.dy = expanded({N, 1, 1});
    a.initial_state = expanded({N, 1, 1});
    a.weight = shortconv::tensor(one.data(), SC_F32, {1, 2});
    a.dweight = shortconv::tensor(dw.data(), SC_F32, {1, 2});
    sc_error err;
    size_t bytes = 12345;
    const sc_status q = sc_backward_workspace_size(&a, &bytes, &err);
    if (be == SC_BACKEND_REF) {  // the oracle needs no scratch: only the size path is at stake
      EXPECT_EQ(q, SC_OK) << err.message;
      continue;
    }
    EXPECT_EQ(q, SC_ERR_UNSUPPORTED) << "got " << bytes << " bytes: " << err.message;
    EXPECT_TRUE(names(err.message, "exec.workspace")) << err.message;
    EXPECT_EQ(bytes, 12345u);
    std::vector<uint8_t> ws(1 << 16, 0);
    a.exec.workspace = ws.data();
    a.exec.workspace_bytes = ws.size();
    EXPECT_EQ(sc_backward(&a, &err), SC_ERR_UNSUPPORTED) << err.message;
    EXPECT_EQ(dw[0], -7.0f);
    EXPECT_EQ(dw[1], -7.0f);
    for (uint8_t b : ws) ASSERT_EQ(b, 0) << "workspace written";
    // With no token the same sequences need no halo: a valid, empty call.
    a.x = expanded({N, 0, 1});
    a.dy = expanded({N, 0, 1});
    a.dweight = shortconv::tensor(dw.data(), SC_F32, {1, 2});
    ASSERT_EQ(sc_backward_workspace_size(&a, &bytes, &err), SC_OK) << err.message;
    EXPECT_LT(bytes, size_t(1) << 16);
    EXPECT_EQ(sc_backward(&a, &err), SC_OK) << err.message;
    EXPECT_EQ(dw[0], 0.0f);  // no token: zero gradient
  }
}

TEST(Validation, NullArguments) {
  sc_error err;
  for (bool fwd : {true, false})
    for (Call call : {VALIDATE, WORKSPACE, RUN, RUN_NULL_ERR}) {
      std::strcpy(err.message, "untouched");
      EXPECT_EQ(invoke(call, fwd, nullptr, &err), SC_ERR_INVALID_ARGUMENT);
      if (call != RUN_NULL_ERR) EXPECT_TRUE(names(err.message, "args")) << err.message;
    }
  auto c = baseline(DENSE, SC_BACKEND_REF);
  EXPECT_EQ(sc_forward_workspace_size(&c->a, nullptr, &err), SC_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(err.message, "bytes")) << err.message;
  EXPECT_EQ(sc_backward_workspace_size(&c->a, nullptr, &err), SC_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(err.message, "bytes")) << err.message;
  EXPECT_EQ(sc_backward_workspace_size(&c->a, nullptr, nullptr), SC_ERR_INVALID_ARGUMENT);
  sc_conv_args_init(nullptr);  // documented as harmless
}

// Overlap is decided per element, not per byte range: random x / y views of
// one buffer, checked against brute force.  Never accept a shared element
// (any layouts); with equal strides in a padded (non-self-overlapping)
// layout, also never reject disjoint views such as column slices of a fused
// buffer.
TEST(Validation, OverlapIsDecidedPerElement) {
  std::mt19937 rng(12345);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<float> buf(8192, 0.0f), w(8, 1.0f);
  int disjoint_same = 0, accepted_same = 0, overlapping = 0;
  for (int it = 0; it < 4000; ++it) {
    const bool same_layout = it % 2 == 0;
    int64_t shape[3] = {uni(1, 4), uni(1, 5), uni(1, 4)};
    auto layout = [&](int64_t* stride) {  // dims in a random order, random padding
      int perm[3] = {0, 1, 2};
      std::shuffle(perm, perm + 3, rng);
      int64_t s = 1;
      for (int k = 2; k >= 0; --k) {
        stride[perm[k]] = s;
        s = s * shape[perm[k]] + uni(0, 3);
      }
    };
    int64_t sx[3], sy[3];
    layout(sx);
    if (same_layout) std::copy(sx, sx + 3, sy); else layout(sy);
    auto offsets = [&](int64_t base, const int64_t* st) {
      std::set<int64_t> o;
      for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t t = 0; t < shape[1]; ++t)
          for (int64_t d = 0; d < shape[2]; ++d) o.insert(base + b * st[0] + t * st[1] + d * st[2]);
      return o;
    };
    const int64_t ox = 400 + uni(0, 50), oy = ox + uni(-300, 300);
    const std::set<int64_t> X = offsets(ox, sx), Y = offsets(oy, sy);
    bool shared = false;
    for (int64_t o : Y) shared = shared || X.count(o);
    sc_conv_args a = shortconv::conv_args();
    a.width = 1;
    a.exec.backend = SC_BACKEND_REF;
    a.x = shortconv::tensor(buf.data() + ox, SC_F32, {shape[0], shape[1], shape[2]},
                            {sx[0], sx[1], sx[2]});
    a.y = shortconv::tensor(buf.data() + oy, SC_F32, {shape[0], shape[1], shape[2]},
                            {sy[0], sy[1], sy[2]});
    a.weight = shortconv::tensor(w.data(), SC_F32, {shape[2], 1});
    sc_error err;
    const sc_status st = sc_validate(&a, 0, &err);
    SCOPED_TRACE("it " + std::to_string(it) + ": " + err.message);
    if (shared) {
      ++overlapping;
      EXPECT_EQ(st, SC_ERR_INVALID_ARGUMENT);
      EXPECT_TRUE(names(err.message, "y") && names(err.message, "x"));
    } else if (same_layout) {
      ++disjoint_same;
      EXPECT_EQ(st, SC_OK);
      accepted_same += st == SC_OK;
    } else if (st != SC_OK) {
      EXPECT_TRUE(names(err.message, "y") && names(err.message, "x"));  // conservative is fine
    }
  }
  EXPECT_GT(overlapping, 300);
  EXPECT_GT(disjoint_same, 200);
  EXPECT_EQ(accepted_same, disjoint_same);
}

// y as the second column slice of a fused [B, T, 2D] buffer, but 2 bytes off:
// its elements straddle x's next row, so it overlaps although the truncated
// element offset (D) would describe a disjoint slice.
TEST(Validation, MisalignedSliceOverlaps) {
  const int64_t B = 2, T = 3, D = 4;
  std::vector<float> buf(B * T * 2 * D + 4), w(D, 1.0f);
  sc_conv_args a = shortconv::conv_args();
  a.width = 1;
  a.exec.backend = SC_BACKEND_REF;
  a.x = shortconv::tensor(buf.data(), SC_F32, {B, T, D}, {T * 2 * D, 2 * D, 1});
  a.weight = shortconv::tensor(w.data(), SC_F32, {D, 1});
  a.y = a.x;
  a.y.data = buf.data() + D;  // the aligned slice: disjoint, accepted
  sc_error err;
  EXPECT_EQ(sc_validate(&a, 0, &err), SC_OK) << err.message;
  a.y.data = reinterpret_cast<uint8_t*>(buf.data() + D) + 2;
  EXPECT_EQ(sc_validate(&a, 0, &err), SC_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(err.message, "y") && names(err.message, "x")) << err.message;
}

// A valid but enormous problem (D = 2^40 through a broadcast weight, T = 0)
// makes the oracle's std::vector scratch throw std::bad_alloc; no C++
// exception may cross the C ABI, so the call must return SC_ERR_BACKEND.
// Run in a child with an alarm (no hang) and an address-space limit (no
// memory exhaustion where overcommit would let the allocation succeed).
TEST(Validation, NoExceptionCrossesTheAbi) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan reports huge allocations itself";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    alarm(20);
    rlimit lim{size_t(16) << 30, size_t(16) << 30};
    setrlimit(RLIMIT_AS, &lim);
    static float w[2] = {1.0f, 2.0f};
    const int64_t D = int64_t(1) << 40;
    sc_conv_args a = shortconv::conv_args();
    a.width = 2;
    a.exec.backend = SC_BACKEND_REF;
    a.x = shortconv::tensor(nullptr, SC_F32, {1, 0, D});
    a.weight = shortconv::tensor(w, SC_F32, {D, 2}, {0, 1});
    sc_error err;
    const sc_status st = sc_backward(&a, &err);
    std::fprintf(stderr, "status %d: %s\n", int(st), err.message);
    std::_Exit(int(st));
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(SC_ERR_BACKEND), "internal error");
#endif
}

// docs/semantics.md section 8, "Checked on request": a host backend's validation
// reads the contents of index tensors only, so a caller may check a CUDA call's
// index contents by describing host copies of them beside the device pointers of
// everything else.  Here every float tensor lies in memory that cannot be read
// (PROT_NONE): a validation that touched it would crash the test.  The serving
// step's index tensors (rows, accepted counts, parents) are in host memory; a bad
// entry in each must be named, and the good contents must pass.
TEST(Validation, HostValidationReadsOnlyIndexContents) {
  constexpr int64_t N = 3, T = 2, D = 8, W = 4, S = (W - 2) + T, P = 5;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto no_access = [&](int64_t bytes) {
    const size_t len = (size_t(bytes) + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return std::pair<void*, size_t>(p, len);
  };
  const auto x = no_access(N * T * D * 4), y = no_access(N * T * D * 4),
             w = no_access(D * W * 4), pool = no_access(P * D * S * 4);
  std::vector<int32_t> rows = {4, 0, 2}, accepted = {1, 2, 1}, parents = {-1, 0, -1, 0, -1, 0};
  sc_conv_args a = shortconv::conv_args();
  a.width = int32_t(W);
  a.exec.backend = SC_BACKEND_CPU;
  a.x = shortconv::tensor(x.first, SC_F32, {N, T, D});
  a.y = shortconv::tensor(y.first, SC_F32, {N, T, D});
  a.weight = shortconv::tensor(w.first, SC_F32, {D, W});
  a.initial_state = a.final_state = shortconv::tensor(pool.first, SC_F32, {P, D, S});
  a.initial_state_indices = a.final_state_indices = shortconv::tensor(rows.data(), SC_I32, {N});
  a.num_accepted = shortconv::tensor(accepted.data(), SC_I32, {N});
  a.parent_tokens = shortconv::tensor(parents.data(), SC_I32, {N, T});
  sc_error err;
  EXPECT_EQ(sc_validate(&a, 0, &err), SC_OK) << err.message;
  struct Bad {
    std::vector<int32_t>* v;
    size_t at;
    int32_t value;
    const char* name;
  };
  for (const Bad& b : {Bad{&rows, 1, int32_t(P), "initial_state_indices[1]"},
                       Bad{&rows, 2, 4, "final_state_indices[2]"},  // row 4 named twice
                       Bad{&accepted, 0, 0, "num_accepted[0]"},
                       Bad{&accepted, 2, 3, "num_accepted[2]"},  // past S - (W-1) + 1 = 2
                       Bad{&parents, 3, 1, "parent_tokens"}}) {  // token 1's parent is itself
    const int32_t good = (*b.v)[b.at];
    (*b.v)[b.at] = b.value;
    EXPECT_EQ(sc_validate(&a, 0, &err), SC_ERR_INVALID_ARGUMENT) << b.name;
    EXPECT_NE(std::string(err.message).find(b.name), std::string::npos) << err.message;
    (*b.v)[b.at] = good;
  }
  EXPECT_EQ(sc_validate(&a, 0, &err), SC_OK) << err.message;
  for (const auto& m : {x, y, w, pool}) munmap(m.first, m.second);
}

// The workspace: ask for the size; when the backend needs one, one byte less
// (and none at all) must be SC_ERR_WORKSPACE with nothing written.
TEST(Validation, WorkspaceTooSmall) {
  for (Kind k : {DENSE, PACKED})
    for (sc_backend be : {SC_BACKEND_REF, SC_BACKEND_CPU})
      for (bool fwd : {true, false}) {
        SCOPED_TRACE(std::string(be == SC_BACKEND_REF ? "ref" : "cpu") + (fwd ? " fwd" : " bwd") +
                     (k == DENSE ? " dense" : " packed"));
        auto c = baseline(k, be);
        sc_error err;
        size_t need = 0;
        ASSERT_EQ(fwd ? sc_forward_workspace_size(&c->a, &need, &err)
                      : sc_backward_workspace_size(&c->a, &need, &err),
                  SC_OK)
            << err.message;
        std::vector<uint8_t> ws(need + 1, 0);
        if (need > 0) {
          for (size_t give : {need - 1, size_t(0)}) {
            auto d = baseline(k, be);
            d->a.exec.workspace = give ? ws.data() : nullptr;
            d->a.exec.workspace_bytes = give;
            const auto before = d->mem;
            EXPECT_EQ(fwd ? sc_forward(&d->a, &err) : sc_backward(&d->a, &err), SC_ERR_WORKSPACE);
            EXPECT_TRUE(names(err.message, "exec.workspace")) << err.message;
            EXPECT_TRUE(before == d->mem) << "written despite SC_ERR_WORKSPACE";
          }
          // NULL workspace with a large byte count is still missing
          auto d = baseline(k, be);
          d->a.exec.workspace = nullptr;
          d->a.exec.workspace_bytes = need;
          EXPECT_EQ(fwd ? sc_forward(&d->a, &err) : sc_backward(&d->a, &err), SC_ERR_WORKSPACE);
        }
        // exactly `need` bytes (NULL when 0) succeeds
        c->a.exec.workspace = need ? ws.data() : nullptr;
        c->a.exec.workspace_bytes = need;
        EXPECT_EQ(fwd ? sc_forward(&c->a, &err) : sc_backward(&c->a, &err), SC_OK) << err.message;
      }
}

// ---------------------------------------------------------------------------------------
// Valid edge cases: they succeed and give the values of docs/semantics.md.
// ---------------------------------------------------------------------------------------

float getf(const sc_tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0) {
  float v;
  std::memcpy(&v,
              static_cast<const uint8_t*>(t.data) +
                  4 * (i0 * t.stride[0] + i1 * (t.ndim > 1 ? t.stride[1] : 0) +
                       i2 * (t.ndim > 2 ? t.stride[2] : 0)),
              4);
  return v;
}

bool untouched(const Case& c, const std::string& name) {
  for (uint8_t b : c.mem.at(name))
    if (b != kSentinel) return false;
  return true;
}

void run_ok(sc_conv_args& a, bool fwd) {
  sc_error err;
  size_t need = 0;
  ASSERT_EQ(fwd ? sc_forward_workspace_size(&a, &need, &err)
                : sc_backward_workspace_size(&a, &need, &err),
            SC_OK)
      << err.message;
  std::vector<uint8_t> ws(need);
  a.exec.workspace = need ? ws.data() : nullptr;
  a.exec.workspace_bytes = need;
  ASSERT_EQ(sc_validate(&a, fwd ? 0 : 1, &err), SC_OK) << err.message;
  ASSERT_EQ(fwd ? sc_forward(&a, &err) : sc_backward(&a, &err), SC_OK) << err.message;
  EXPECT_STREQ(err.message, "");
  a.exec.workspace = nullptr;
  a.exec.workspace_bytes = 0;
}

const sc_backend kBackends[] = {SC_BACKEND_REF, SC_BACKEND_CPU};

TEST(ValidEdges, BaselinesSucceed) {
  for (sc_backend be : kBackends)
    for (Kind k : {DENSE, PACKED})
      for (bool fwd : {true, false}) {
        auto c = baseline(k, be);
        run_ok(c->a, fwd);
        if (fwd) {
          EXPECT_FALSE(untouched(*c, "y"));
          EXPECT_FALSE(untouched(*c, "final_state"));
        } else {
          for (const char* o : {"dx", "dweight", "dbias", "dinitial_state"})
            EXPECT_FALSE(untouched(*c, o)) << o;
        }
      }
}

// T = 0 (dense): ht = h0, dh0 = dht, dweight = dbias = 0 (overwritten).
TEST(ValidEdges, ZeroLengthDense) {
  for (sc_backend be : kBackends) {
    auto c = baseline(DENSE, be);
    for (sc_tensor* t : {&c->a.x, &c->a.residual, &c->a.y, &c->a.dy, &c->a.dx}) {
      *t = shortconv::tensor(t->data, SC_F32, {kB, 0, kD});  // contiguous: stride[0] = 0
      ASSERT_EQ(t->stride[0], 0);
    }
    c->a.x.data = nullptr;  // NULL is allowed for an empty tensor, input or output
    c->a.y.data = nullptr;
    run_ok(c->a, true);
    run_ok(c->a, false);
    for (int64_t b = 0; b < kB; ++b)
      for (int64_t d = 0; d < kD; ++d)
        for (int64_t j = 0; j < kS; ++j) {
          EXPECT_EQ(getf(c->a.final_state, b, d, j), getf(c->a.initial_state, b, d, j));
          EXPECT_EQ(getf(c->a.dinitial_state, b, d, j), getf(c->a.dfinal_state, b, d, j));
        }
    for (int64_t d = 0; d < kD; ++d) {
      EXPECT_EQ(getf(c->a.dbias, d), 0.0f);
      for (int64_t k = 0; k < kW; ++k) EXPECT_EQ(getf(c->a.dweight, d, k), 0.0f);
    }
    EXPECT_TRUE(untouched(*c, "dx"));
  }
}

// D = 0: every tensor but the state-free weight is empty; contiguous strides
// of an empty tensor contain zeros, which an output may have.
TEST(ValidEdges, ZeroChannels) {
  for (sc_backend be : kBackends) {
    Case c;
    sc_conv_args& a = c.a;
    sc_conv_args_init(&a);
    a.width = int32_t(kW);
    a.exec.backend = be;
    a.x = c.make("x", SC_F32, {kB, kT, 0}, false);
    a.weight = c.make("weight", SC_F32, {0, kW}, false);
    a.bias = c.make("bias", SC_F32, {0}, false);
    a.initial_state = c.make("initial_state", SC_F32, {kB, 0, kS}, false);
    a.y = c.make("y", SC_F32, {kB, kT, 0}, true);
    a.final_state = c.make("final_state", SC_F32, {kB, 0, kS}, true);
    a.dy = c.make("dy", SC_F32, {kB, kT, 0}, false);
    a.dfinal_state = c.make("dfinal_state", SC_F32, {kB, 0, kS}, false);
    a.dx = c.make("dx", SC_F32, {kB, kT, 0}, true);
    a.dweight = c.make("dweight", SC_F32, {0, kW}, true);
    a.dbias = c.make("dbias", SC_F32, {0}, true);
    a.dinitial_state = c.make("dinitial_state", SC_F32, {kB, 0, kS}, true);
    a.x.data = a.y.data = a.dinitial_state.data = nullptr;
    run_ok(a, true);
    run_ok(a, false);
    for (const char* o : {"dx", "dweight", "dbias", "dinitial_state", "final_state"})
      EXPECT_TRUE(untouched(c, o)) << o;
  }
}

// B = 0 (dense) and N = 0 (packed, cu_seqlens = [0]): no sequence, but
// dweight and dbias are still overwritten with the empty sum 0.
TEST(ValidEdges, NoSequences) {
  for (sc_backend be : kBackends)
    for (Kind k : {DENSE, PACKED}) {
      auto c = baseline(k, be);
      sc_conv_args& a = c->a;
      if (k == DENSE) {
        for (sc_tensor* t : {&a.x, &a.residual, &a.y, &a.dy, &a.dx}) t->shape[0] = 0;
        for (sc_tensor* t : {&a.initial_state, &a.final_state, &a.dfinal_state, &a.dinitial_state})
          t->shape[0] = 0;
      } else {
        for (sc_tensor* t : {&a.x, &a.residual, &a.y, &a.dy, &a.dx}) t->shape[0] = 0;
        a.cu_seqlens = c->index<int64_t>("cu_seqlens", SC_I64, {0});
        a.initial_state_indices.shape[0] = a.final_state_indices.shape[0] = 0;
        a.dfinal_state.shape[0] = a.dinitial_state.shape[0] = 0;
      }
      a.x.data = nullptr;
      run_ok(a, true);
      run_ok(a, false);
      for (int64_t d = 0; d < kD; ++d) {
        EXPECT_EQ(getf(a.dbias, d), 0.0f);
        for (int64_t w = 0; w < kW; ++w) EXPECT_EQ(getf(a.dweight, d, w), 0.0f);
      }
      EXPECT_TRUE(untouched(*c, "final_state"));
      EXPECT_TRUE(untouched(*c, "y"));
    }
}

// Zero-length sequences in a packed batch: their final state is their initial
// state (zeros without one) and their dh0 is dht; -1 final rows are not written.
TEST(ValidEdges, ZeroLengthSequences) {
  for (sc_backend be : kBackends) {
    auto c = baseline(PACKED, be);
    sc_conv_args& a = c->a;
    a.cu_seqlens = c->index<int64_t>("cu_seqlens", SC_I64, {0, 0, 7, 7});
    // sequence 0 (empty) reads row 2 and writes row 1; sequence 1 reads none
    // and writes row 3; sequence 2 (empty) reads row 0 and writes nothing
    run_ok(a, true);
    run_ok(a, false);
    for (int64_t d = 0; d < kD; ++d)
      for (int64_t j = 0; j < kS; ++j) {
        EXPECT_EQ(getf(a.final_state, 1, d, j), getf(a.initial_state, 2, d, j));
        EXPECT_EQ(getf(a.dinitial_state, 0, d, j), getf(a.dfinal_state, 0, d, j));
        EXPECT_EQ(getf(a.dinitial_state, 2, d, j), getf(a.dfinal_state, 2, d, j));
        // sequence 1 has no initial state: its last S tokens become the state
        EXPECT_EQ(getf(a.final_state, 3, d, j), getf(a.x, 7 - kS + j, d));
      }
    // rows 0 and 2 of the final pool are written by nobody
    const uint8_t* fs = c->ptr("final_state");
    for (int64_t r : {0, 2})
      for (int64_t i = 0; i < kD * kS * 4; ++i) EXPECT_EQ(fs[r * kD * kS * 4 + i], kSentinel);
  }
}

double silu(double z) { return z / (1.0 + std::exp(-z)); }

// W = 1, S = 0: y = act(w x + b) + residual, empty states (contiguous strides
// with zeros) accepted, dx = w dpre.
TEST(ValidEdges, WidthOneNoState) {
  for (sc_backend be : kBackends)
    for (int32_t state_len : {-1, 0}) {
      auto c = baseline(DENSE, be);
      sc_conv_args& a = c->a;
      a.width = 1;
      a.state_len = state_len;
      a.weight = shortconv::tensor(a.weight.data, SC_F32, {kD, 1});
      a.dweight = shortconv::tensor(a.dweight.data, SC_F32, {kD, 1});
      for (sc_tensor* t : {&a.initial_state, &a.final_state, &a.dfinal_state, &a.dinitial_state}) {
        *t = shortconv::tensor(t->data, SC_F32, {kB, kD, 0});
        t->data = nullptr;
      }
      run_ok(a, true);
      run_ok(a, false);
      double err2 = 0, ref2 = 0, derr2 = 0, dref2 = 0;
      for (int64_t b = 0; b < kB; ++b)
        for (int64_t t = 0; t < kT; ++t)
          for (int64_t d = 0; d < kD; ++d) {
            const double z = double(getf(a.weight, d, 0)) * getf(a.x, b, t, d) + getf(a.bias, d);
            const double want = silu(z) + getf(a.residual, b, t, d);
            err2 += std::pow(getf(a.y, b, t, d) - want, 2);
            ref2 += want * want;
            const double s = 1.0 / (1.0 + std::exp(-z));
            const double dwant = getf(a.dy, b, t, d) * s * (1 + z * (1 - s)) * getf(a.weight, d, 0);
            derr2 += std::pow(getf(a.dx, b, t, d) - dwant, 2);
            dref2 += dwant * dwant;
          }
      EXPECT_LE(std::sqrt(err2 / ref2), 1e-5);
      EXPECT_LE(std::sqrt(derr2 / dref2), 1e-5);
    }
}

// A straightforward transcription of section 1 for a dense f32 batch with
// optional h0 (strided), used to check absent-optional and aliasing runs.
std::vector<double> reference_y(const sc_conv_args& a, bool with_h0) {
  const int64_t B = a.x.shape[0], T = a.x.shape[1], D = a.x.shape[2], W = a.width;
  const int64_t S = with_h0 ? a.initial_state.shape[2] : W - 1;
  std::vector<double> y(size_t(B * T * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t t = 0; t < T; ++t) {
        double s = a.bias.ndim ? getf(a.bias, d) : 0.0;
        for (int64_t k = 0; k < W; ++k) {
          const int64_t p = S - (W - 1) + t + k;  // position in u = h0 ++ x
          const double u = p >= S ? getf(a.x, b, p - S, d) : with_h0 ? getf(a.initial_state, b, d, p) : 0.0;
          s += getf(a.weight, d, k) * u;
        }
        double v = a.activation == SC_ACT_SILU ? silu(s) : s;
        if (a.residual.ndim) v += getf(a.residual, b, t, d);
        y[size_t((b * T + t) * D + d)] = v;
      }
  return y;
}

double rel_err_y(const sc_conv_args& a, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (int64_t b = 0; b < a.x.shape[0]; ++b)
    for (int64_t t = 0; t < a.x.shape[1]; ++t)
      for (int64_t d = 0; d < a.x.shape[2]; ++d) {
        const double w = want[size_t((b * a.x.shape[1] + t) * a.x.shape[2] + d)];
        e += std::pow(getf(a.y, b, t, d) - w, 2);
        r += w * w;
      }
  return std::sqrt(e / r);
}

TEST(ValidEdges, AbsentOptionals) {
  for (sc_backend be : kBackends) {
    auto c = baseline(DENSE, be);
    sc_conv_args& a = c->a;
    for (sc_tensor* t : {&a.bias, &a.residual, &a.initial_state, &a.final_state, &a.dfinal_state,
                         &a.dweight, &a.dbias, &a.dinitial_state})
      t->ndim = 0;
    run_ok(a, true);
    EXPECT_LE(rel_err_y(a, reference_y(a, false)), 1e-5);
    // backward with dy absent (= 0) and only dweight requested: all zeros
    a.dy.ndim = 0;
    a.dx.ndim = 0;
    a.dweight = shortconv::tensor(c->ptr("dweight"), SC_F32, {kD, kW});
    run_ok(a, false);
    for (int64_t d = 0; d < kD; ++d)
      for (int64_t k = 0; k < kW; ++k) EXPECT_EQ(getf(a.dweight, d, k), 0.0f);
    EXPECT_TRUE(untouched(*c, "dx"));
    // backward with no output at all is a valid no-op
    a.dweight.ndim = 0;
    run_ok(a, false);
  }
}

// final_state exactly initial_state (same pointer, dtype, shape, strides):
// allowed, and equal to the out-of-place result (dense and pool, strided).
TEST(ValidEdges, InPlaceStateUpdate) {
  for (sc_backend be : kBackends)
    for (Kind k : {DENSE, PACKED}) {
      auto in_place = baseline(k, be);
      auto apart = baseline(k, be);
      // out-of-place reference: the final pool starts as a copy of the initial pool
      std::memcpy(apart->ptr("final_state"), apart->ptr("initial_state"),
                  size_t(numel(apart->a.initial_state)) * 4);
      run_ok(apart->a, true);
      in_place->a.final_state = in_place->a.initial_state;
      run_ok(in_place->a, true);
      const size_t bytes = size_t(numel(apart->a.initial_state)) * 4;
      EXPECT_EQ(std::memcmp(in_place->ptr("initial_state"), apart->ptr("final_state"), bytes), 0);
      EXPECT_EQ(std::memcmp(in_place->ptr("y"), apart->ptr("y"), size_t(numel(apart->a.y)) * 4), 0);
      EXPECT_TRUE(untouched(*in_place, "final_state"));
      if (k == DENSE) {  // and y is right, by the definition, against the original h0
        auto orig = baseline(k, be);
        EXPECT_LE(rel_err_y(in_place->a, reference_y(orig->a, true)), 1e-5);
      }
    }
  // channel-major strided state updated in place: [B, D, S] stored as [S, B, D]
  for (sc_backend be : kBackends) {
    auto c = baseline(DENSE, be);
    auto orig = baseline(DENSE, be);
    for (Case* cc : {c.get(), orig.get()})
      cc->a.initial_state =
          shortconv::tensor(cc->ptr("initial_state"), SC_F32, {kB, kD, kS}, {kD, 1, kB * kD});
    c->a.final_state = c->a.initial_state;
    run_ok(c->a, true);
    EXPECT_LE(rel_err_y(c->a, reference_y(orig->a, true)), 1e-5);
    for (int64_t b = 0; b < kB; ++b)  // S = 3 < T: the last S tokens
      for (int64_t d = 0; d < kD; ++d)
        for (int64_t j = 0; j < kS; ++j)
          EXPECT_EQ(getf(c->a.initial_state, b, d, j), getf(c->a.x, b, kT - kS + j, d));
  }
}

// Index edge cases that are valid: several sequences reading one pool row,
// several -1 (not written) final rows, int64 and int32 mixed, and an empty
// pool row (S = 0) named twice (nothing is written).
TEST(ValidEdges, PoolIndices) {
  for (sc_backend be : kBackends) {
    auto c = baseline(PACKED, be);
    sc_conv_args& a = c->a;
    a.initial_state_indices = c->index<int32_t>("isi", SC_I32, {2, 2, 2});
    a.final_state_indices = c->index<int64_t>("fsi", SC_I64, {-1, 0, -1});
    run_ok(a, true);
    run_ok(a, false);
    const uint8_t* fs = c->ptr("final_state");
    for (int64_t r : {1, 2, 3})  // only row 0 is written
      for (int64_t i = 0; i < kD * kS * 4; ++i) EXPECT_EQ(fs[r * kD * kS * 4 + i], kSentinel);
    EXPECT_FALSE(untouched(*c, "final_state"));
    // W = 1, S = 0: an empty row may be named twice
    a.width = 1;
    a.weight = shortconv::tensor(c->ptr("weight"), SC_F32, {kD, 1});
    a.dweight = shortconv::tensor(c->ptr("dweight"), SC_F32, {kD, 1});
    a.initial_state = shortconv::tensor(c->ptr("initial_state"), SC_F32, {kP, kD, 0});
    a.final_state = shortconv::tensor(c->ptr("final_state"), SC_F32, {kP, kD, 0});
    a.dfinal_state = shortconv::tensor(c->ptr("dfinal_state"), SC_F32, {kN, kD, 0});
    a.dinitial_state = shortconv::tensor(c->ptr("dinitial_state"), SC_F32, {kN, kD, 0});
    a.final_state_indices = c->index<int64_t>("fsi", SC_I64, {3, 3, 3});
    run_ok(a, true);
    run_ok(a, false);
  }
}

// The pad index is "no row" in both index tensors, also when it names a real
// row or repeats; flags and ring offsets of every allowed dtype are accepted.
TEST(ValidEdges, StateAddressing) {
  for (sc_backend be : kBackends) {
    for (int64_t pad : {int64_t(kP), int64_t(1), int64_t(-7)}) {
      auto c = baseline(PACKED, be);
      sc_conv_args& a = c->a;
      a.pad_index = pad;
      a.initial_state_indices = c->index<int64_t>("isi", SC_I64, {pad, 2, pad});
      a.final_state_indices = c->index<int64_t>("fsi", SC_I64, {pad, 0, pad});
      a.has_initial_state = c->index<int64_t>("flags", SC_I64, {0, 1, 7});
      a.ring_offsets = c->index<int64_t>("rings", SC_I64, {0, 1000003, 4});
      run_ok(a, true);
      run_ok(a, false);
      const uint8_t* fs = c->ptr("final_state");
      for (int64_t r : {1, 2, 3})  // only row 0 is written
        for (int64_t i = 0; i < kD * kS * 4; ++i) EXPECT_EQ(fs[r * kD * kS * 4 + i], kSentinel);
      a.has_initial_state = c->index<uint8_t>("flags8", SC_BOOL, {1, 1, 0});
      a.ring_offsets = c->index<int32_t>("rings32", SC_I32, {3, 0, 0});
      run_ok(a, true);
      run_ok(a, false);
    }
  }
}

// Serving steps: counts are read only for sequences that read a row, parents
// only for tokens 1 .. L_n - 1 (token 0 is the root); the speculative row's
// entries past (W-2) + L_n are left alone; in place, a sequence may rewrite
// the row it reads.
TEST(ValidEdges, ServingSteps) {
  for (sc_backend be : kBackends) {
    auto c = baseline(PACKED, be);  // lengths 3, 0, 4; W = 3
    sc_conv_args& a = c->a;
    const int64_t S = 7;
    a.initial_state = c->make("initial_state", SC_F32, {kP, kD, S}, false);
    a.final_state = c->make("final_state", SC_F32, {kP, kD, S}, true);
    a.num_accepted = c->index<int64_t>("num_accepted", SC_I64, {S - 1, -5, 1});
    a.parent_tokens = c->index<int64_t>("parents", SC_I64, {99, 0, 0, -4, -4, -4, 3, 0, 1, 2});
    a.parent_tokens = shortconv::tensor(a.parent_tokens.data, SC_I64, {kN, 4});  // (10 of 12 given)
    a.parent_tokens.stride[0] = 3;  // row n at 3n: [99 0 0 | -4 -4 -4 | 3 0 1 2]
    run_ok(a, true);
    // sequence 0 writes row 1: its first (W-2) + 3 = 4 entries; sequence 2 writes none (-1)
    const uint8_t* fs = c->ptr("final_state");
    for (int64_t d = 0; d < kD; ++d)
      for (int64_t j = 0; j < S; ++j) {
        const int64_t at = ((1 * kD + d) * S + j) * 4;
        for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(fs[at + b] == kSentinel, j >= 4) << d << " " << j;
      }
    for (int64_t r : {0, 2, 3})
      for (int64_t i = 0; i < kD * S * 4; ++i) EXPECT_EQ(fs[r * kD * S * 4 + i], kSentinel);
    a.final_state = a.initial_state;  // in place: sequence 0 reads row 2 and writes row 1
    reinterpret_cast<int32_t*>(c->ptr("final_state_indices"))[0] = 2;
    run_ok(a, true);
  }
}

// Prefix caching writes the final rows and the snapshots and nothing else; in
// place, a chunk may snapshot into the row it started from.
TEST(ValidEdges, PrefixCaching) {
  for (sc_backend be : kBackends) {
    auto c = baseline(PACKED, be);  // lengths 3, 0, 4
    sc_conv_args& a = c->a;
    a.initial_state = c->make("initial_state", SC_F32, {12, kD, kS}, false);
    a.final_state = c->make("final_state", SC_F32, {12, kD, kS}, true);
    a.initial_state_indices.ndim = a.final_state_indices.ndim = 0;
    a.block_table = c->index<int32_t>("block_table", SC_I32, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    a.block_table = shortconv::tensor(a.block_table.data, SC_I32, {kN, 4});
    a.initial_block = c->index<int32_t>("initial_block", SC_I32, {0, 0, 1});
    a.final_block = c->index<int32_t>("final_block", SC_I32, {1, 0, 2});
    a.first_block = c->index<int64_t>("first_block", SC_I64, {0, 0, 1});
    a.computed_tokens = c->index<int64_t>("computed_tokens", SC_I64, {1, 0, 2});
    a.block_size = 2;
    run_ok(a, true);
    const uint8_t* fs = c->ptr("final_state");
    for (int64_t r = 0; r < 12; ++r) {
      const bool written = r == 0 || r == 1 || r == 4 || r == 9 || r == 10;
      for (int64_t i = 0; i < kD * kS * 4; ++i)
        ASSERT_EQ(fs[r * kD * kS * 4 + i] == kSentinel, !written) << "row " << r;
    }
    // in place: sequence 2 starts from row 9 (its block 1) and snapshots into it
    a.final_state = a.initial_state;
    run_ok(a, true);
  }
}

// Sequence ids: an id in two runs while states are only read, broadcast ids
// (one run per row), all padding, ids past the rows without state tensors.
TEST(ValidEdges, SequenceIds) {
  for (sc_backend be : kBackends) {
    auto c = baseline(DENSE, be);
    sc_conv_args& a = c->a;
    use_ids(*c, {0, 0, 1, 1, -1, -2, 1, 1, 0, 0});
    a.final_state.ndim = a.dfinal_state.ndim = a.dinitial_state.ndim = 0;
    run_ok(a, true);
    run_ok(a, false);
    use_ids(*c, {3, 3, 3, 3, 3, 2, 2, 2, 2, 2});
    a.seq_idx.stride[1] = 0;  // row b is one run of id seq_idx[b, 0]
    run_ok(a, true);
    run_ok(a, false);
    use_ids(*c, {-1, -1, -3, -3, -3, -9, -9, -9, -9, -9});  // all padding: y = 0, nothing else
    run_ok(a, true);
    const float* y = reinterpret_cast<const float*>(c->ptr("y"));
    for (int64_t i = 0; i < kB * kT * kD; ++i) EXPECT_EQ(y[i], 0.0f);
    EXPECT_TRUE(untouched(*c, "final_state"));
    run_ok(a, false);
    for (int64_t i = 0; i < kIdRows * kD * kS; ++i)
      EXPECT_EQ(reinterpret_cast<float*>(c->ptr("dinitial_state"))[i], 0.0f);
    auto d = baseline(DENSE, be);
    use_ids(*d, {7, 7, 9, 9, -1, 100, 100, 100, 5, 5});  // no state tensors: any ids
    for (sc_tensor* t : {&d->a.initial_state, &d->a.final_state, &d->a.dfinal_state,
                         &d->a.dinitial_state})
      t->ndim = 0;
    run_ok(d->a, true);
    run_ok(d->a, false);
  }
}

// Broadcast inputs (stride 0) and channel-major / strided layouts are valid.
TEST(ValidEdges, BroadcastAndStridedInputs) {
  for (sc_backend be : kBackends) {
    auto c = baseline(DENSE, be);
    sc_conv_args& a = c->a;
    a.dy.stride[0] = a.dy.stride[1] = 0;  // one dy row for every (b, t)
    a.residual.stride[0] = 0;
    a.x = shortconv::channel_major(a.x.data, SC_F32, kB, kT, kD);
    a.initial_state.stride[0] = 0;  // every sequence starts from the same state
    run_ok(a, true);
    EXPECT_LE(rel_err_y(a, reference_y(a, true)), 1e-5);
    run_ok(a, false);
    // final_state_indices is not a backward field: ignored there, even if malformed
    a.final_state_indices = c->index<int32_t>("junk", SC_I32, {99});
    run_ok(a, false);
  }
}

// Every combination of the three float dtype groups is accepted.
TEST(ValidEdges, IndependentDtypeGroups) {
  const sc_dtype F[] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  for (sc_backend be : kBackends)
    for (sc_dtype act : F)
      for (sc_dtype par : F)
        for (sc_dtype st : F) {
          auto c = baseline(PACKED, be);
          sc_conv_args& a = c->a;
          for (sc_tensor* t : {&a.x, &a.residual, &a.y, &a.dy, &a.dx}) t->dtype = act;
          for (sc_tensor* t : {&a.weight, &a.bias, &a.dweight, &a.dbias}) t->dtype = par;
          for (sc_tensor* t : {&a.initial_state, &a.final_state, &a.dfinal_state, &a.dinitial_state})
            t->dtype = st;
          // inputs hold f32 bit patterns reinterpreted: only acceptance is
          // checked here (numerics belong to the backend tests)
          SCOPED_TRACE(std::to_string(act) + "/" + std::to_string(par) + "/" + std::to_string(st));
          sc_error err;
          EXPECT_EQ(sc_validate(&a, 0, &err), SC_OK) << err.message;
          EXPECT_EQ(sc_validate(&a, 1, &err), SC_OK) << err.message;
          // run the all-different combinations (and the uniform ones) end to end
          if ((act != par && par != st && act != st) || (act == par && par == st)) {
            run_ok(a, true);
            run_ok(a, false);
          }
        }
}

}  // namespace
