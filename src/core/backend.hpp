// The backend table: what every backend provides, and the one list of them.
//
// The API (api.cpp), validation (memory kind, "not compiled" errors) and, via
// sc_backend_name / sc_has_backend, the harness, the CLI and the Python
// package all read this table; adding a backend means one entry here (and
// its sources), nothing else in src/core.
//
// Each backend receives a validated Problem (problem.hpp) whose direction says
// forward or backward, and the caller's workspace of at least the size its
// workspace function reported, in p.exec.workspace.
#pragma once

#include <cstddef>

#include "core/problem.hpp"

namespace shortconv {

// Where a backend's tensors, index tensors and workspace live.  Host backends
// read cu_seqlens and indices on the host, so validation checks their contents.
enum class Memory { host, device };

struct Backend {
  sc_backend id;
  const char* name;  // "cpu", "cuda", "ref": the CLI's and the Python package's names
  Memory memory;
  bool compiled;     // false: known to the ABI but not built into this library
  // Scratch bytes p needs on this backend; SC_ERR_UNSUPPORTED (message in err)
  // when the size is not representable.  A function of the shapes, dtypes,
  // layouts' presence and forced tiles only (never of the device it later runs on).
  sc_status (*workspace)(const Problem& p, size_t* bytes, sc_error* err);
  sc_status (*run)(const Problem& p, sc_error* err);
};

// The entry for a backend id, or nullptr when the id is unknown.
const Backend* find_backend(int32_t id);

// Each backend's two functions (defined in its own directory).
namespace ref {  // src/ref: the float64 oracle
sc_status workspace(const Problem& p, size_t* bytes, sc_error* err);
sc_status run(const Problem& p, sc_error* err);
}  // namespace ref

namespace cpu {  // src/cpu: the fast host backend
sc_status workspace(const Problem& p, size_t* bytes, sc_error* err);
sc_status run(const Problem& p, sc_error* err);
}  // namespace cpu

// Declared in every build, used only with SHORTCONV_WITH_CUDA (backend.cpp): the
// units that include this header then compile the same with and without the CUDA
// backend, and a CPU-only build (the wheel of scripts/package_test.sh) reuses the
// CUDA build's objects from ccache.
namespace cuda {  // src/cuda: NVIDIA GPUs
sc_status workspace(const Problem& p, size_t* bytes, sc_error* err);
sc_status run(const Problem& p, sc_error* err);
}  // namespace cuda

// The message of a workspace size that does not fit in 63 bits.
sc_status workspace_too_large(const Problem& p, sc_error* err);

}  // namespace shortconv
