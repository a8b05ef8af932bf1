// What every backend provides.  Each receives a validated Problem (see
// problem.hpp) whose direction says forward or backward, and the caller's
// workspace of at least workspace_bytes(p) bytes in p.exec.workspace.
#pragma once

#include <cstddef>

#include "core/problem.hpp"

namespace shortconv {

namespace ref {  // src/ref: the float64 oracle
size_t workspace_bytes(const Problem& p);
sc_status run(const Problem& p, sc_error* err);
}  // namespace ref

namespace cpu {  // src/cpu: the fast host backend
size_t workspace_bytes(const Problem& p);
sc_status run(const Problem& p, sc_error* err);
}  // namespace cpu

#ifdef SHORTCONV_WITH_CUDA
namespace cuda {  // src/cuda: NVIDIA GPUs
size_t workspace_bytes(const Problem& p);
sc_status run(const Problem& p, sc_error* err);
}  // namespace cuda
#endif

}  // namespace shortconv
