"""Python-level checks of the public functions' arguments, before any allocation.

The library validates every tensor description (docs/semantics.md section 7);
what it cannot see is Python: a list where a tensor is expected, a float or a
string where an int is expected, an int the C ABI's int32 fields cannot hold, a
negative state length that would reach torch.empty before the library.  Each
check raises a TypeError (wrong Python type) or a ShortConvError (a ValueError:
wrong value, worded like the library's messages) naming the argument.

These run on every eager call, so each is a few type tests and comparisons and
allocates nothing on the common path.
"""

import operator

import torch

from ._lib import INT32_MAX, invalid, type_name

_Tensor = torch.Tensor
_SymInt = getattr(torch, "SymInt", ())  # torch.compile's symbolic ints (torch >= 2.0)


def describe(v):
    """A value for an error message: its type, and the value when it is a short scalar."""
    if isinstance(v, (bool, int, float, str)) and len(repr(v)) <= 40:
        return "%s %r" % (type_name(v), v)
    return type_name(v)


def check_tensor(where, name, v, expected):
    """v is a torch.Tensor the Python code may ask for .shape (not a nested tensor)."""
    if not isinstance(v, _Tensor):
        raise TypeError("%s: %s: expected a torch.Tensor %s, got %s"
                        % (where, name, expected, describe(v)))
    if v.is_nested:
        raise TypeError("%s: %s: expected a torch.Tensor %s, got a nested tensor; describe "
                        "variable-length sequences as a packed batch with cu_seqlens"
                        % (where, name, expected))


def check_tensors(where, named):
    """check_tensor for each (name, value, expected) whose value is not None: the slow
    path the public functions take when their inline test of the common case fails."""
    for name, v, expected in named:
        if v is not None:
            check_tensor(where, name, v, expected)


def _as_int(where, name, v):
    if isinstance(v, _SymInt):
        return v
    if isinstance(v, (bool, float, str, _Tensor)) or not hasattr(type(v), "__index__"):
        raise TypeError("%s: %s: expected an int, got %s" % (where, name, describe(v)))
    return operator.index(v)  # numpy integers


def check_state_len(where, name, S, W):
    """S as an int in [W-1, INT32_MAX] (W None: only the int32 bound, the library checks W-1)."""
    if type(S) is not int:
        S = _as_int(where, name, S)
    if W is not None and S < W - 1:
        raise invalid(where, "%s: state length S must be >= W-1 = %d, got S = %d"
                      % (name, W - 1, S))
    if S > INT32_MAX:
        raise invalid(where, "%s: state length S = %d exceeds the C ABI's int32 (at most %d)"
                      % (name, S, INT32_MAX))
    return S


def check_flag(where, name, v):
    """A bool (also 0/1 and numpy bools); anything else is a TypeError."""
    if v is True or v is False:
        return v
    if type(v) is int or (type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0
                          and v.dtype.kind in "biu"):
        if v == 0 or v == 1:
            return bool(v)
    raise TypeError("%s: %s: expected a bool, got %s" % (where, name, describe(v)))
