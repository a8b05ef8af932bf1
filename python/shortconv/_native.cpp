// The package's common calls in C++: the decode step of _fast.update_fast (and of the
// wrappers that call it: vllm.py, dao.py, ShortConvolution's step) and the forward /
// backward of _fast.plain_call (x, weight, bias and cu_seqlens only), compiled against the
// installed torch by `python -m shortconv.build_native` (shortconv/native.py).
//
// Why: a call through ctypes reads each tensor's metadata through torch's Python bindings,
// packs it with struct and crosses ctypes: ~115k instructions for a decode step, ten
// torch elementwise ops (bench/RESULTS.md, "PyTorch package host path").  Here a tensor's
// description is a few loads from its TensorImpl and the call is a C call.
//
// Contract (tests/python/test_fast.py runs each of its cases through this module and the
// Python paths):
//   - every function takes exactly what its Python counterpart takes and fills the
//     library's sc_conv_args with the same bytes, but for the data pointers of the
//     outputs it allocates and the workspace pointer;
//   - it returns None for anything that is not its case (a tensor the Python path
//     leaves to _lib.Call: a subclass, a negated view, another device or dtype, no
//     strided storage, a rank it does not take); the caller then takes the Python path;
//   - a library error is raised as the Python path raises it (the exception comes from
//     the factory that init() was given), with nothing written.
// The library is the one shortconv._lib loaded: init() receives its entry points.
// Module state: those entry points, the error factory and the workspace sizes of the
// call signatures seen (as _lib._WS_BYTES); every call reads it under the GIL.

#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <string>
#include <utility>

#include "shortconv/shortconv.h"

namespace py = pybind11;

namespace {

using run_fn = sc_status (*)(const sc_conv_args*, sc_error*);
using size_fn = sc_status (*)(const sc_conv_args*, size_t*, sc_error*);
using validate_fn = sc_status (*)(const sc_conv_args*, int, sc_error*);

// The library's entry points and the Python error factory, set once by init().
struct Library {
  run_fn forward = nullptr;
  run_fn backward = nullptr;
  size_fn forward_size = nullptr;
  size_fn backward_size = nullptr;
  validate_fn host_only = nullptr;  // set: calls are validated, not run (benchmarks)
  sc_conv_args tmpl{};   // sc_conv_args_init's bytes
  py::object error;      // error(where, rename_cache_names, status, message) -> exception
};
Library* lib = nullptr;  // leaked on purpose: outlives the interpreter's module teardown

constexpr int kCpu = -1;  // "device index" of a CPU call

// The workspace size of a call signature: the scalars, backend, threads and forced tiles,
// and each present tensor's field, dtype and shape (what the size depends on, as the
// Python key: not the pointers, strides or stream).  Bounded like _lib._WS_BYTES:
// cleared when full.
constexpr size_t kWsCacheMax = 4096;
std::unordered_map<std::string, size_t>* ws_cache = nullptr;

std::string signature(const sc_conv_args& a, int direction) {
  const sc_tensor* fields[] = {&a.x, &a.weight, &a.bias, &a.residual, &a.cu_seqlens,
                               &a.initial_state, &a.initial_state_indices, &a.y,
                               &a.final_state, &a.final_state_indices, &a.dy, &a.dfinal_state,
                               &a.dx, &a.dweight, &a.dbias, &a.dinitial_state,
                               &a.has_initial_state, &a.ring_offsets, &a.seq_idx,
                               &a.num_accepted, &a.parent_tokens, &a.block_table,
                               &a.initial_block, &a.final_block, &a.first_block,
                               &a.computed_tokens};
  int64_t k[9 + 6 * (sizeof fields / sizeof fields[0])];
  int n = 0;
  k[n++] = direction;
  k[n++] = a.width;
  k[n++] = a.state_len;
  k[n++] = a.activation;
  k[n++] = a.pad_index;
  k[n++] = a.block_size;
  k[n++] = (int64_t{a.exec.backend} << 32) | static_cast<uint32_t>(a.exec.num_threads);
  k[n++] = a.exec.tile_t;
  k[n++] = a.exec.tile_d;
  int field = 0;
  for (const sc_tensor* f : fields) {
    if (f->ndim != 0) {
      k[n++] = (int64_t{field} << 40) | (int64_t{f->dtype} << 8) | f->ndim;
      for (int i = 0; i < f->ndim; ++i) k[n++] = f->shape[i];
      k[n++] = -1;  // end of this tensor's shape
    }
    ++field;
  }
  return std::string(reinterpret_cast<const char*>(k), sizeof(int64_t) * n);
}

// ---- describing tensors (as _lib.describe) ------------------------------------------
int float_code(c10::ScalarType s) {
  switch (s) {
    case c10::kFloat: return SC_F32;
    case c10::kHalf: return SC_F16;
    case c10::kBFloat16: return SC_BF16;
    case c10::kDouble: return SC_F64;
    default: return -1;
  }
}
int index_code(c10::ScalarType s) {
  switch (s) {
    case c10::kInt: return SC_I32;
    case c10::kLong: return SC_I64;
    default: return -1;
  }
}

// The tensor behind a Python object when it is the common case: a plain Tensor or
// Parameter (no subclass), not a lazily negated view, on the call's device, strided with
// storage; nullptr otherwise.
const at::Tensor* plain_tensor(PyObject* obj, int cuda_index) {
  if (!THPVariable_CheckExact(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.is_neg() || t.is_nested() || t.layout() != c10::kStrided ||
      !t.has_storage())
    return nullptr;
  if (cuda_index == kCpu) {
    if (!t.is_cpu()) return nullptr;
  } else if (!t.is_cuda() || t.get_device() != cuda_index) {
    return nullptr;
  }
  return &t;
}

// d = t's description (1..4 dims) with dtype code `code`.
void fill(sc_tensor& d, const at::Tensor& t, int code) {
  const int64_t nd = t.dim();
  d.data = t.data_ptr();
  d.dtype = code;
  d.ndim = static_cast<int32_t>(nd);
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (int64_t i = 0; i < nd; ++i) {
    d.shape[i] = sizes[i];
    d.stride[i] = strides[i];
  }
}

// describe(): the tensor described at d, or nullptr (nothing written) when it is not
// the common case.  index: the code set (float or index tensors).
const at::Tensor* describe(sc_tensor& d, PyObject* obj, int cuda_index, bool index) {
  const at::Tensor* t = plain_tensor(obj, cuda_index);
  if (t == nullptr) return nullptr;
  const int code = index ? index_code(t->scalar_type()) : float_code(t->scalar_type());
  const int64_t nd = t->dim();
  if (code < 0 || nd < 1 || nd > SC_MAX_DIMS) return nullptr;
  fill(d, *t, code);
  return t;
}

// Output description: shape like `like`'s description, strides of t.
void describe_out(sc_tensor& d, const sc_tensor& like, const at::Tensor& t) {
  d = like;
  d.data = t.data_ptr();
  auto strides = t.strides();
  for (int i = 0; i < like.ndim; ++i) d.stride[i] = strides[i];
}

// exec: backend, threads and the current stream of the call's device.
void exec_fields(sc_exec& e, int cuda_index) {
  if (cuda_index == kCpu) {
    e.backend = SC_BACKEND_CPU;
    e.num_threads = at::get_num_threads();
    e.stream = nullptr;
  } else {
    e.backend = SC_BACKEND_CUDA;
    e.num_threads = 0;
    const c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_index));
    e.stream = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(dev).native_handle();
  }
  e.tile_t = 0;
  e.tile_d = 0;
  e.workspace = nullptr;
  e.workspace_bytes = 0;
}

// The device index of x's call (-1: CPU), or -2 for another kind of device.
int call_device(PyObject* x) {
  if (!THPVariable_CheckExact(x)) return -2;
  const at::Tensor& t = THPVariable_Unpack(x);
  if (t.is_cuda()) return t.get_device();
  if (t.is_cpu()) return kCpu;
  return -2;
}

[[noreturn]] void raise(const char* where, bool cache_names, sc_status status,
                        const sc_error& err) {
  py::object exc = lib->error(where, cache_names, static_cast<int>(status),
                              py::str(err.message));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// Run `run` with a workspace of the size remembered for the call's signature (queried and
// remembered when new; queried afresh when the run reports it short), on x's device.
sc_status run_call(sc_conv_args& a, sc_error& err, int direction, int cuda_index,
                   const c10::Device& device) {
  const run_fn run = direction == 0 ? lib->forward : lib->backward;
  const size_fn query = direction == 0 ? lib->forward_size : lib->backward_size;
  // A CUDA forward takes no workspace: it runs without a query (as _lib.forward_on).
  const bool try_without = direction == 0 && cuda_index != kCpu;
  c10::OptionalDeviceGuard guard;
  if (cuda_index != kCpu) guard.reset_device(device);
  if (lib->host_only != nullptr) return lib->host_only(&a, direction, &err);
  if (try_without) {
    sc_status s;
    {
      py::gil_scoped_release nogil;
      s = run(&a, &err);
    }
    if (s != SC_ERR_WORKSPACE) return s;
  }
  std::string key = signature(a, direction);
  size_t bytes = 0;
  bool known = false;
  if (auto it = ws_cache->find(key); it != ws_cache->end()) {
    bytes = it->second;
    known = true;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!known) {
      const sc_status q = query(&a, &bytes, &err);
      if (q != SC_OK) return q;
      if (ws_cache->size() >= kWsCacheMax) ws_cache->clear();
      (*ws_cache)[key] = bytes;
      known = true;
    }
    at::Tensor ws;
    if (bytes > 0) {
      ws = at::empty({static_cast<int64_t>(bytes)},
                     at::TensorOptions().dtype(at::kByte).device(device));
      a.exec.workspace = ws.data_ptr();
    } else {
      a.exec.workspace = nullptr;
    }
    a.exec.workspace_bytes = bytes;
    sc_status s;
    {
      py::gil_scoped_release nogil;
      s = run(&a, &err);
    }
    if (s != SC_ERR_WORKSPACE) return s;
    known = false;  // the size remembered fell short: ask again
  }
  return SC_ERR_WORKSPACE;
}

bool fits_int32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

constexpr const char* kUpdate = "shortconv.causal_conv1d_update";
constexpr const char* kConv = "shortconv.causal_conv1d";
constexpr const char* kConvBwd = "shortconv.causal_conv1d (backward)";

// ---- the decode step (_fast.update_fast) and the peers' wrappers of it ----------------
// How a wrapper's arguments map onto the core's decode step (update_impl's flags): each is
// what the wrapper's Python does with views before calling functional.causal_conv1d_update,
// done here on the descriptions (the same bytes, no views made).
enum UpdateFlags : unsigned {
  kStrict = 1u << 0,        // weight [D, W] and cache [P, D, S] only, cache dtype == x's
  kChannelFirst = 1u << 1,  // a 3-D x is [N, D, T] (transposed to the core's [N, T, D]);
                            // y is returned in x's shape, token-major underneath
  kNarrowState = 1u << 2,   // the state is the first W-1 entries of each row (S > W-1)
  kRowsOfBatch = 1u << 3,   // no indices: the cache's first min(N, P) rows
  kZeroPads = 1u << 4,      // outputs of padded rows are 0 (the core's zero_padded_outputs)
  kModuleStep = 1u << 5,    // x [N, 1, D] only; a weight [D, 1, W] read as [D, W]
};
constexpr unsigned kVllm = kStrict | kChannelFirst | kNarrowState | kRowsOfBatch;
constexpr unsigned kVllmSpeculative = kStrict | kChannelFirst | kRowsOfBatch;
constexpr unsigned kDao = kStrict | kChannelFirst | kZeroPads;


// x [N, D] (described as [N, 1, D]) or [N, T, D] ([N, D, T] with kChannelFirst); cache
// [N, D, S] or a pool with cache_indices [N]; weight [D, W]; bias [D]; num_accepted [N].
// y, or None.
py::object update_impl(py::handle x, py::handle cache, py::handle weight, py::handle bias,
                       py::handle cache_indices, py::handle num_accepted, int activation,
                       unsigned flags, int overlap = SC_OVERLAP_NONE) {
  const int cuda_index = call_device(x.ptr());
  if (cuda_index == -2) return py::none();
  sc_conv_args a = lib->tmpl;
  const at::Tensor* xt = plain_tensor(x.ptr(), cuda_index);
  if (xt == nullptr) return py::none();
  const int xcode = float_code(xt->scalar_type());
  const int64_t nd = xt->dim();
  if (xcode < 0 || (nd != 2 && nd != 3)) return py::none();
  fill(a.x, *xt, xcode);
  if (nd == 2) {  // [N, D] read as [N, 1, D]: the view unsqueeze(1) would make
    const int64_t n = a.x.shape[0], d = a.x.shape[1], sn = a.x.stride[0], sd = a.x.stride[1];
    a.x.ndim = 3;
    a.x.shape[0] = n; a.x.shape[1] = 1; a.x.shape[2] = d;
    a.x.stride[0] = sn; a.x.stride[1] = d * sd; a.x.stride[2] = sd;
  } else if (flags & kChannelFirst) {  // [N, D, T] read as x.transpose(1, 2)
    std::swap(a.x.shape[1], a.x.shape[2]);
    std::swap(a.x.stride[1], a.x.stride[2]);
  }
  const at::Tensor* wt = describe(a.weight, weight.ptr(), cuda_index, false);
  const at::Tensor* ct = describe(a.final_state, cache.ptr(), cuda_index, false);
  if (wt == nullptr || ct == nullptr) return py::none();
  if (flags & kModuleStep) {  // one token per sequence; weight.squeeze(1) of a [D, 1, W]
    if (nd != 3 || a.x.shape[1] != 1) return py::none();
    if (a.weight.ndim == 3 && a.weight.shape[1] == 1) {
      a.weight.ndim = 2;
      a.weight.shape[1] = a.weight.shape[2];
      a.weight.stride[1] = a.weight.stride[2];
      a.weight.shape[2] = 0;
      a.weight.stride[2] = 0;
    }
  }
  if ((flags & kStrict) &&
      (a.weight.ndim != 2 || a.final_state.ndim != 3 || a.final_state.dtype != xcode))
    return py::none();
  const int64_t D = a.x.shape[2];
  if (D != a.weight.shape[0]) return py::none();
  // FLA's [1, N, D] (one token each of N sequences) is functional.py's view
  if (nd == 3 && a.x.shape[0] == 1 && a.x.shape[1] > 1 && cache_indices.is_none())
    return py::none();
  const int64_t width = a.weight.shape[a.weight.ndim - 1];
  if (!fits_int32(width)) return py::none();
  if (flags & kNarrowState) {  // conv_state.narrow(-1, 0, W - 1)
    int64_t& s = a.final_state.shape[2];
    if (s != width - 1 && width >= 1) {
      if (s < width - 1) return py::none();  // (narrow's own error, in Python)
      s = width - 1;
    }
  }
  if ((flags & kRowsOfBatch) && cache_indices.is_none())  // cache.narrow(0, 0, min(N, P))
    a.final_state.shape[0] = std::min(a.final_state.shape[0], a.x.shape[0]);
  a.width = static_cast<int32_t>(width);
  a.state_len = -1;
  a.activation = activation;
  a.initial_state = a.final_state;  // read in place
  if (!bias.is_none() && describe(a.bias, bias.ptr(), cuda_index, false) == nullptr)
    return py::none();
  const at::Tensor* it = nullptr;
  if (!cache_indices.is_none()) {
    it = describe(a.initial_state_indices, cache_indices.ptr(), cuda_index, true);
    if (it == nullptr) return py::none();
    a.final_state_indices = a.initial_state_indices;
  }
  if (!num_accepted.is_none() &&
      describe(a.num_accepted, num_accepted.ptr(), cuda_index, true) == nullptr)
    return py::none();
  exec_fields(a.exec, cuda_index);
  a.exec.overlap = overlap;  // (checked by the library: a bad value is its error)
  at::Tensor y;  // x's strides when x is dense (_layout.like_x)
  if (nd == 2) {
    y = at::empty_like(*xt);
    auto ys = y.strides();
    a.y = a.x;
    a.y.data = y.data_ptr();
    a.y.stride[0] = ys[0]; a.y.stride[1] = D * ys[1]; a.y.stride[2] = ys[1];
  } else if (flags & kChannelFirst) {
    // empty_like(x.transpose(1, 2)).transpose(1, 2) without the two views (6.8k of the
    // 33.9k instructions of a speculative vLLM step, callgrind): x's strides when x is
    // dense, else [N, D, T] over contiguous [N, T, D] storage
    const int64_t n = xt->size(0), d = xt->size(1), t = xt->size(2);
    if (xt->is_non_overlapping_and_dense()) {
      y = at::empty_like(*xt);
    } else {
      const int64_t d1 = std::max<int64_t>(d, 1), t1 = std::max<int64_t>(t, 1);  // (torch's rule)
      const int64_t sizes[] = {n, d, t}, strides[] = {t1 * d1, 1, d1};
      y = at::empty_strided(at::IntArrayRef(sizes, 3), at::IntArrayRef(strides, 3), xt->options());
    }
    auto ys = y.strides();
    a.y = a.x;
    a.y.data = y.data_ptr();
    a.y.stride[0] = ys[0]; a.y.stride[1] = ys[2]; a.y.stride[2] = ys[1];
  } else {
    y = at::empty_like(*xt);
    describe_out(a.y, a.x, y);
  }
  if ((flags & kZeroPads) && it != nullptr) a.zero_padded_outputs = 1;
  sc_error err;
  err.message[0] = '\0';
  const sc_status s = run_call(a, err, 0, cuda_index, xt->device());
  if (s != SC_OK) raise(kUpdate, true, s, err);
  const at::Tensor& c = *ct;
  if (!c.is_inference()) torch::autograd::impl::bump_version(c);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
}

py::object update(py::handle x, py::handle cache, py::handle weight, py::handle bias,
                  py::handle cache_indices, py::handle num_accepted, int activation,
                  int overlap) {
  return update_impl(x, cache, weight, bias, cache_indices, num_accepted, activation, 0,
                     overlap);
}

// vllm.causal_conv1d_update's call of the core without query_start_loc, trees, prefix
// caching or another pad id: x [N, D] or [N, D, T] of conv_state's dtype.
py::object update_vllm(py::handle x, py::handle conv_state, py::handle weight,
                       py::handle bias, py::handle indices, py::handle num_accepted,
                       int activation, int overlap) {
  return update_impl(x, conv_state, weight, bias, indices, num_accepted, activation,
                     num_accepted.is_none() ? kVllm : kVllmSpeculative, overlap);
}

// ShortConvolution.forward's decode step without autograd: x [N, 1, D], cache [N, D, S],
// the module's weight [D, 1, W] (what step() hands functional.causal_conv1d_update).
py::object update_module(py::handle x, py::handle cache, py::handle weight, py::handle bias,
                         int activation) {
  return update_impl(x, cache, weight, bias, py::none(), py::none(), activation, kModuleStep);
}

// dao.causal_conv1d_update's call of the core without cache_seqlens.
py::object update_dao(py::handle x, py::handle conv_state, py::handle weight, py::handle bias,
                      py::handle indices, int activation, int overlap) {
  return update_impl(x, conv_state, weight, bias, indices, py::none(), activation, kDao, overlap);
}

// ---- the convolution of x, weight, bias, cu_seqlens (_fast.plain_call) ------------------
// One call's descriptions: filled by conv_prepare, run by forward(), reused by backward()
// (the inputs' descriptions of the forward, as the Python snapshot).
struct Conv {
  sc_conv_args args{};  // inputs and y described
  int cuda_index = kCpu;
  c10::Device device{c10::kCPU};
  void* px = nullptr;   // the inputs' data pointers, to tell a .data swap before backward
  void* pw = nullptr;
  void* pb = nullptr;
  void* pc = nullptr;
  int state_len = 0;
  int activation = 0;
  bool ran = false;

  void forward() {
    if (ran) throw std::runtime_error("shortconv: a native call's forward runs once");
    ran = true;
    sc_error err;
    err.message[0] = '\0';
    const sc_status s = run_call(args, err, 0, cuda_index, device);
    if (s != SC_OK) raise(kConv, false, s, err);
  }

  // (dx, dweight, dbias, None, None), or None when the saved tensors no longer hold the
  // memory described (the Python path describes them afresh) or dy is not the common case.
  py::object backward(py::handle x, py::handle weight, py::handle bias, py::handle cu,
                      py::handle dy, bool need_dx, bool need_dw, bool need_db);
};

void* data_of(py::handle h) {
  return h.is_none() ? nullptr : THPVariable_Unpack(h.ptr()).data_ptr();
}

// A new tensor like t, contiguous (_layout.like_contiguous).
at::Tensor like_contiguous(const at::Tensor& t) {
  if (t.is_contiguous()) return at::empty_like(t);
  return at::empty(t.sizes(), t.options());
}

py::object wrap(at::Tensor t) {
  if (!t.defined()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
}

py::object Conv::backward(py::handle x, py::handle weight, py::handle bias, py::handle cu,
                          py::handle dy, bool need_dx, bool need_dw, bool need_db) {
  if (data_of(x) != px || data_of(weight) != pw || data_of(bias) != pb || data_of(cu) != pc)
    return py::none();
  sc_conv_args a = args;
  a.y = lib->tmpl.y;  // the backward's buffer: the inputs described, before y
  exec_fields(a.exec, cuda_index);
  if (describe(a.dy, dy.ptr(), cuda_index, false) == nullptr) return py::none();
  const at::Tensor& xt = THPVariable_Unpack(x.ptr());
  at::Tensor dx, dw, db;
  if (need_dx) {
    dx = at::empty_like(xt);
    describe_out(a.dx, a.x, dx);
  }
  if (need_dw) {
    dw = like_contiguous(THPVariable_Unpack(weight.ptr()));
    describe_out(a.dweight, a.weight, dw);
  }
  if (need_db) {
    db = like_contiguous(THPVariable_Unpack(bias.ptr()));
    describe_out(a.dbias, a.bias, db);
  }
  if (!need_dx && !need_dw && !need_db)
    return py::make_tuple(py::none(), py::none(), py::none(), py::none(), py::none());
  sc_error err;
  err.message[0] = '\0';
  const sc_status s = run_call(a, err, 1, cuda_index, device);
  if (s != SC_OK) raise(kConvBwd, false, s, err);
  return py::make_tuple(wrap(std::move(dx)), wrap(std::move(dw)), wrap(std::move(db)),
                        py::none(), py::none());
}

// x [B, T, D] or [total, D]; weight [D, W]; bias [D]; cu_seqlens [N+1]; state_len None or
// an int >= W-1.  When autograd will record the call (grad mode on and x, weight or bias
// requiring grad), (y, Conv) with the forward not yet run (PlainConv1dFunction.forward
// runs it); else the forward is run and y returned.  None when it is not the case.
py::object conv(py::handle x, py::handle weight, py::handle bias, py::handle cu,
                py::handle state_len, int activation) {
  const int cuda_index = call_device(x.ptr());
  if (cuda_index == -2) return py::none();
  auto c = std::make_unique<Conv>();
  sc_conv_args& a = c->args;
  a = lib->tmpl;
  const at::Tensor* xt = describe(a.x, x.ptr(), cuda_index, false);
  const at::Tensor* wt = describe(a.weight, weight.ptr(), cuda_index, false);
  if (xt == nullptr || wt == nullptr || a.x.ndim == 4) return py::none();
  const int64_t width = a.weight.shape[a.weight.ndim - 1];
  int64_t S = width;  // FLA's default: S = W
  if (!state_len.is_none()) {
    if (!PyLong_CheckExact(state_len.ptr())) return py::none();
    int overflow = 0;
    S = PyLong_AsLongLongAndOverflow(state_len.ptr(), &overflow);
    if (overflow != 0) return py::none();
  }
  if (S < width - 1 || S > INT32_MAX || !fits_int32(width)) return py::none();
  a.width = static_cast<int32_t>(width);
  a.state_len = static_cast<int32_t>(S);
  a.activation = activation;
  if (!bias.is_none() && describe(a.bias, bias.ptr(), cuda_index, false) == nullptr)
    return py::none();
  if (!cu.is_none() && describe(a.cu_seqlens, cu.ptr(), cuda_index, true) == nullptr)
    return py::none();
  exec_fields(a.exec, cuda_index);
  at::Tensor y = at::empty_like(*xt);  // (x's strides when x is dense: _layout.like_x)
  describe_out(a.y, a.x, y);
  c->cuda_index = cuda_index;
  c->device = xt->device();
  c->state_len = static_cast<int>(S);
  c->activation = activation;
  const bool keep = c10::GradMode::is_enabled() &&
                    (xt->requires_grad() || wt->requires_grad() ||
                     (!bias.is_none() && THPVariable_Unpack(bias.ptr()).requires_grad()));
  if (!keep) {
    c->forward();
    return wrap(std::move(y));
  }
  c->px = a.x.data;
  c->pw = a.weight.data;
  c->pb = a.bias.ndim ? a.bias.data : nullptr;
  c->pc = a.cu_seqlens.ndim ? a.cu_seqlens.data : nullptr;
  return py::make_tuple(wrap(std::move(y)), py::cast(c.release(),
                                                     py::return_value_policy::take_ownership));
}

void init(uintptr_t forward, uintptr_t backward, uintptr_t forward_size,
          uintptr_t backward_size, py::bytes tmpl, py::object error) {
  std::string t = tmpl;
  if (t.size() < sizeof(sc_conv_args))
    throw std::invalid_argument("shortconv native: template shorter than sc_conv_args");
  if (lib == nullptr) lib = new Library();
  if (ws_cache == nullptr) ws_cache = new std::unordered_map<std::string, size_t>();
  ws_cache->clear();
  lib->forward = reinterpret_cast<run_fn>(forward);
  lib->backward = reinterpret_cast<run_fn>(backward);
  lib->forward_size = reinterpret_cast<size_fn>(forward_size);
  lib->backward_size = reinterpret_cast<size_fn>(backward_size);
  std::memcpy(&lib->tmpl, t.data(), sizeof(sc_conv_args));
  lib->error = std::move(error);
}

// The host path alone (python -m shortconv.bench --overhead-only): calls are validated by
// sc_validate (its address; 0 to run them again) and not run.
void host_only(uintptr_t validate) { lib->host_only = reinterpret_cast<validate_fn>(validate); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "shortconv's common calls in C++ (see shortconv/native.py)";
  m.attr("args_size") = py::int_(sizeof(sc_conv_args));
  m.def("init", &init, "Entry points of the loaded libshortconv, its args template and the "
        "error factory");
  m.def("host_only", &host_only, "Validate calls instead of running them (address of "
        "sc_validate, or 0)");
  m.def("update", &update, "_fast.update_fast in C++: y, or None");
  m.def("update_vllm", &update_vllm, "vllm.causal_conv1d_update's common step: y, or None");
  m.def("update_module", &update_module, "ShortConvolution's decode step: y, or None");
  m.def("update_dao", &update_dao, "dao.causal_conv1d_update's common step: y, or None");
  m.def("conv", &conv, "_fast.plain_call in C++: y, (y, Conv) when autograd records, or None");
  py::class_<Conv>(m, "Conv")
      .def("forward", &Conv::forward)
      .def("backward", &Conv::backward)
      .def_readonly("state_len", &Conv::state_len)
      .def_readonly("activation", &Conv::activation);
}
