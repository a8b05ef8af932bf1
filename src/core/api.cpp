// The C ABI: validate once, check the workspace, hand the Problem to a backend.
#include <cstring>
#include <exception>

#include "core/activation.hpp"
#include "core/backend.hpp"
#include "core/problem.hpp"

using namespace shortconv;

namespace {

// No C++ exception may cross the C ABI (it would terminate the caller): a
// failed allocation inside a backend (the oracle's std::vector scratch) or in
// validation's message formatting comes back as SC_ERR_BACKEND.
template <class F>
sc_status guarded(sc_error* err, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return fail(err, SC_ERR_BACKEND, "internal error: %s", e.what());
  } catch (...) {
    return fail(err, SC_ERR_BACKEND, "internal error: unknown exception");
  }
}

sc_status workspace_size(const sc_conv_args* args, Dir dir, size_t* bytes, sc_error* err) {
  if (!bytes) return fail(err, SC_ERR_INVALID_ARGUMENT, "bytes: NULL pointer");
  Problem p;
  sc_status st = validate(args, dir, &p, err);
  if (st != SC_OK) return st;
  size_t need = 0;
  st = find_backend(p.exec.backend)->workspace(p, &need, err);
  if (st == SC_OK) *bytes = need;
  return st;
}

sc_status run(const sc_conv_args* args, Dir dir, sc_error* err) {
  Problem p;
  sc_status st = validate(args, dir, &p, err);
  if (st != SC_OK) return st;
  const Backend& be = *find_backend(p.exec.backend);  // validate() checked it is compiled
  size_t need = 0;
  st = be.workspace(p, &need, err);
  if (st != SC_OK) return st;
  if (need > 0 && (!p.exec.workspace || p.exec.workspace_bytes < need))
    return fail(err, SC_ERR_WORKSPACE,
                "exec.workspace: expected at least %zu bytes (see sc_%s_workspace_size), got %zu "
                "bytes at %p",
                need, dir == Dir::fwd ? "forward" : "backward", p.exec.workspace_bytes,
                p.exec.workspace);
  st = be.run(p, err);
  // Host backends: a padded sequence's outputs set to 0 after the run (the CUDA
  // backend does it in its kernels: one launch for the engines' steps)
  if (st == SC_OK && dir == Dir::fwd && p.zero_pads && p.y && be.memory == Memory::host)
    zero_padded_outputs(p);
  return st;
}

}  // namespace

extern "C" {

void sc_conv_args_init(sc_conv_args* args) {
  if (!args) return;
  std::memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(sc_conv_args);
  args->state_len = -1;
  args->pad_index = -1;
}

sc_status sc_forward_workspace_size(const sc_conv_args* args, size_t* bytes, sc_error* err) {
  return guarded(err, [&] { return workspace_size(args, Dir::fwd, bytes, err); });
}
sc_status sc_backward_workspace_size(const sc_conv_args* args, size_t* bytes, sc_error* err) {
  return guarded(err, [&] { return workspace_size(args, Dir::bwd, bytes, err); });
}
sc_status sc_forward(const sc_conv_args* args, sc_error* err) {
  return guarded(err, [&] { return run(args, Dir::fwd, err); });
}
sc_status sc_backward(const sc_conv_args* args, sc_error* err) {
  return guarded(err, [&] { return run(args, Dir::bwd, err); });
}

sc_status sc_validate(const sc_conv_args* args, int backward, sc_error* err) {
  return guarded(err, [&] {
    Problem p;
    return validate(args, backward ? Dir::bwd : Dir::fwd, &p, err);
  });
}

const char* sc_status_string(sc_status status) {
  switch (status) {
    case SC_OK: return "ok";
    case SC_ERR_INVALID_ARGUMENT: return "invalid argument";
    case SC_ERR_UNSUPPORTED: return "unsupported";
    case SC_ERR_WORKSPACE: return "workspace missing or too small";
    case SC_ERR_BACKEND: return "backend failure";
  }
  return "unknown status";
}

#define SC_STR2(x) #x
#define SC_STR(x) SC_STR2(x)
const char* sc_version_string(void) {
  return SC_STR(SC_VERSION_MAJOR) "." SC_STR(SC_VERSION_MINOR) "." SC_STR(SC_VERSION_PATCH);
}
int32_t sc_version(void) {
  return SC_VERSION_MAJOR * 10000 + SC_VERSION_MINOR * 100 + SC_VERSION_PATCH;
}

int32_t sc_has_backend(int32_t backend) {
  const Backend* be = find_backend(backend);
  return be && be->compiled ? 1 : 0;
}

const char* sc_activation_name(int32_t activation) { return activation_name(activation); }

const char* sc_backend_name(int32_t backend) {
  const Backend* be = find_backend(backend);
  return be ? be->name : nullptr;
}

}  // extern "C"
