// Validation allocates no heap memory on the common calls (the standards: no
// hidden allocation).  operator new is replaced in this test binary by one
// that counts the allocations of the calling thread while a scope is open
// (and otherwise only forwards to malloc), and sc_validate plus the workspace
// queries run inside such a scope for training and decode calls on a device
// backend's description (no data read on the host) and on the CPU backend.
//
// Not covered, on purpose: the host backends' checks of index tensors in
// host memory (pool rows written twice, rows read and written in place,
// seq_idx runs) sort a scratch of (row, sequence) pairs, held in place up to
// 64 pairs (checked below for decode steps) and on the heap past them; those
// calls allocate on the host, in proportion to the number of sequences.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "harness/harness.hpp"
#include "shortconv/shortconv.h"

namespace {
thread_local bool g_counting = false;
thread_local long g_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_counting) ++g_allocations;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  if (g_counting) ++g_allocations;
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace shortconv::harness;

// Allocations made by f() on this thread.
template <class F>
long allocations(F&& f) {
  g_allocations = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_allocations;
}

Case training() {
  Case c;
  c.act_dtype = c.param_dtype = c.state_dtype = SC_BF16;
  c.W = 4;
  c.S = 3;
  c.B = 2;
  c.T = 17;
  c.D = 8;
  c.h0 = c.ht = c.dht = c.want_dh0 = c.residual = true;
  return c;
}

Case packed() {
  Case c = training();
  c.B = 1;
  c.packed = true;
  c.lengths = {0, 5, 2, 9};
  return c;
}

Case decode(bool indices) {
  Case c = training();
  c.B = 4;
  c.T = 1;
  c.residual = c.dht = c.want_dh0 = false;
  c.want_dx = c.want_dweight = c.want_dbias = false;
  if (indices) {
    c.pool = 6;
    c.h0_index = {3, -1, 0, 5};
    c.ht_index = c.h0_index;
    c.in_place = true;
  }
  return c;
}

// sc_validate and the workspace query of both directions (or the forward's).
void expect_no_allocation(const Case& c, sc_backend backend, bool backward) {
  const Inputs in = make_inputs(c);
  Prepared p(c, &in, SC_BACKEND_CPU);  // host buffers; `backend` only goes in exec
  sc_conv_args fa = p.fwd_args(), ba = p.bwd_args();
  fa.exec.backend = ba.exec.backend = backend;
  sc_error err;
  sc_status sf = SC_OK, sb = SC_OK, wf = SC_OK, wb = SC_OK;
  size_t bytes = 0;
  const long n = allocations([&] {
    sf = sc_validate(&fa, 0, &err);
    wf = sc_forward_workspace_size(&fa, &bytes, &err);
    if (backward) {
      sb = sc_validate(&ba, 1, &err);
      wb = sc_backward_workspace_size(&ba, &bytes, &err);
    }
  });
  ASSERT_EQ(sf, SC_OK) << c.describe();
  ASSERT_EQ(wf, SC_OK) << c.describe();
  ASSERT_EQ(sb, SC_OK) << c.describe();
  ASSERT_EQ(wb, SC_OK) << c.describe();
  EXPECT_EQ(n, 0) << c.describe() << " on backend " << backend;
}

// The counter sees the allocations it should (else a zero proves nothing):
// this thread's, and the library's own (an unknown backend's message lists
// the known ones in a std::string).
TEST(NoAlloc, TheCounterCountsThisThreadAndTheLibrary) {
  EXPECT_EQ(allocations([] { ::operator delete(::operator new(16)); }), 1);
  EXPECT_EQ(allocations([] {}), 0);
  const Case c = training();
  const Inputs in = make_inputs(c);
  Prepared p(c, &in, SC_BACKEND_CPU);
  sc_conv_args a = p.fwd_args();
  a.exec.backend = 99;
  sc_error err;
  sc_status st = SC_OK;
  EXPECT_GT(allocations([&] { st = sc_validate(&a, 0, &err); }), 0);
  EXPECT_EQ(st, SC_ERR_INVALID_ARGUMENT);
}

TEST(NoAlloc, ValidationOfTrainingCalls) {
  for (sc_backend be : {SC_BACKEND_CPU, SC_BACKEND_REF}) {
    expect_no_allocation(training(), be, true);
    expect_no_allocation(packed(), be, true);
  }
}

TEST(NoAlloc, ValidationOfDecodeSteps) {
  expect_no_allocation(decode(false), SC_BACKEND_CPU, false);
  // pool rows in host memory, in place: the rows written twice and the rows read
  // after another sequence wrote them are found without heap scratch up to 64
  // sequences (RowPairs, validate.cpp)
  expect_no_allocation(decode(true), SC_BACKEND_CPU, false);
  Case wide = decode(true);
  wide.B = 64;
  wide.pool = 80;
  wide.h0_index.clear();
  for (int64_t n = 0; n < wide.B; ++n) wide.h0_index.push_back(n % 9 == 4 ? -1 : (n * 37) % 80);
  wide.ht_index = wide.h0_index;
  expect_no_allocation(wide, SC_BACKEND_CPU, false);
  // pool rows through indices: checked without host scratch on a device
  // backend (its indices are device memory, never read on the host)
  if (sc_has_backend(SC_BACKEND_CUDA)) expect_no_allocation(decode(true), SC_BACKEND_CUDA, false);
}

}  // namespace
