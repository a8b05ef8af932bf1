// The checks validation (validate.cpp) applies to single tensors and pairs of
// tensors, and the conversions from sc_tensor to the Problem's View.
//
// A Checker remembers the first failure: each check writes its message
// (naming the argument, what was expected and what was given) into err and
// returns false; once one failed, every later check returns false at once,
// so a chain `c.a(...) && c.b(...)` reports only the first.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/problem.hpp"

namespace shortconv::validation {

std::string shape_str(const sc_tensor& t);                   // "[2, 3]"
std::string shape_str(std::initializer_list<int64_t> dims);  // "[2, 3]"

inline bool present(const sc_tensor& t) { return t.ndim != 0; }

// t as a View (dims past its rank: shape 1, stride 0).
void to_view(const sc_tensor& t, View* v);
// An activation-like tensor as [B, T, D]: a packed [total, D] becomes [1, total, D].
void to_act_view(const sc_tensor& t, View* v);
// Exactly the same elements: pointer, dtype, shape and (where a dim has more
// than one element) strides -- the aliasing final_state == initial_state allows.
bool same_memory(const sc_tensor& a, const sc_tensor& b);

class Checker {
 public:
  Checker(sc_error* err, bool host_memory) : err_(err), host_(host_memory) {}

  sc_status status = SC_OK;
  bool ok() const { return status == SC_OK; }
  // Whether the backend's tensors live in host memory (contents checkable).
  bool host() const { return host_; }

  // Records a failure (unless one is already recorded); returns false.
  template <class... A>
  bool bad(sc_status st, const char* fmt, A... a) {
    if (ok()) status = fail(err_, st, fmt, a...);
    return false;
  }

  // Rank in [min_rank, max_rank], shape >= 0, strides >= 0, no 64-bit
  // overflow of the element count or the byte extent, data when non-empty.
  bool basic(const char* name, const sc_tensor& t, int min_rank, int max_rank);
  bool float_dtype(const char* name, const sc_tensor& t);
  bool same_dtype(const char* name, const sc_tensor& t, sc_dtype want, const char* why);
  bool index_dtype(const char* name, const sc_tensor& t);
  // Exactly the shape `want`; `meaning` explains it in the message.
  bool shape_is(const char* name, const sc_tensor& t, std::initializer_list<int64_t> want,
                const char* meaning);
  // An output writes no element twice.
  bool no_self_overlap(const char* name, const sc_tensor& t);
  // Output `out` shares no element with `in` (an input or another output).
  bool disjoint(const char* out_name, const sc_tensor& out, const char* in_name,
                const sc_tensor& in);

 private:
  sc_error* err_;
  bool host_;
};

}  // namespace shortconv::validation
