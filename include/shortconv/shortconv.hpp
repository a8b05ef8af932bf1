// Thin C++ layer over the C ABI: tensor builders and exceptions.  Header-only;
// everything goes through shortconv.h, so C and C++ callers see one library.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "shortconv/shortconv.h"

namespace shortconv {

class Error : public std::runtime_error {
 public:
  Error(sc_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  sc_status status() const { return status_; }

 private:
  sc_status status_;
};

inline void check(sc_status status, const sc_error& err) {
  if (status != SC_OK)
    throw Error(status, std::string(sc_status_string(status)) + ": " + err.message);
}

// A tensor description with explicit strides (in elements).
inline sc_tensor tensor(void* data, sc_dtype dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> stride) {
  sc_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  i = 0;
  for (int64_t s : stride) t.stride[i++] = s;
  return t;
}

// A contiguous (row-major) tensor description.
inline sc_tensor tensor(void* data, sc_dtype dtype, std::initializer_list<int64_t> shape) {
  sc_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// Channel-major storage [B, D, T] described in the logical [B, T, D] order.
inline sc_tensor channel_major(void* data, sc_dtype dtype, int64_t B, int64_t T, int64_t D) {
  return tensor(data, dtype, {B, T, D}, {D * T, 1, T});
}

inline sc_conv_args conv_args() {
  sc_conv_args a;
  sc_conv_args_init(&a);
  return a;
}

inline size_t forward_workspace_size(const sc_conv_args& a) {
  sc_error err{};
  size_t bytes = 0;
  check(sc_forward_workspace_size(&a, &bytes, &err), err);
  return bytes;
}

inline size_t backward_workspace_size(const sc_conv_args& a) {
  sc_error err{};
  size_t bytes = 0;
  check(sc_backward_workspace_size(&a, &bytes, &err), err);
  return bytes;
}

inline void forward(const sc_conv_args& a) {
  sc_error err{};
  check(sc_forward(&a, &err), err);
}

inline void backward(const sc_conv_args& a) {
  sc_error err{};
  check(sc_backward(&a, &err), err);
}

}  // namespace shortconv
