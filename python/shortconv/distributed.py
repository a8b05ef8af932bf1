"""Context parallelism: one causal_conv1d over sequences sharded along time across a process group.

    y_local, final_state = shortconv.distributed.causal_conv1d(
        x_local, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
        activation=None, *, group=None, cu_seqlens=None, state_len=None, context=None)

The global input is the concatenation of the ranks' ``x_local`` along the token axis in the
group's rank order; ``y_local`` is this rank's slice of ``shortconv.causal_conv1d`` on it.
Exchange per call (docs/layouts.md, "Context parallelism"):

- forward: each rank receives the up to S tokens just before its shard of the sequence that
  its first token belongs to (the "halo", possibly from several short earlier shards), by
  point-to-point messages from exactly the ranks that hold them; final states by one all-reduce;
- backward: each rank receives x and dy of the next W-1 tokens of the sequence that its last
  token belongs to (the "look-ahead"), and the final-state gradient summed over the group
  (one all-reduce).

The exchange pattern (who sends which rows to whom) follows from every rank's shard length and
the global cu_seqlens, which the host must read once; ``build_context`` does that once per batch
(a CPContext, like FLA's FLACPContext: ``.group``, ``.cu_seqlens``), so calls that pass it issue
only device collectives.  Without a context, each call builds one (one all-gather read on the host).
"""

import torch
import torch.distributed as dist

from . import _layout, _ops
from ._lib import FLOAT_CODES, INDEX_CODES
from ._ops import activation_code

__all__ = ["causal_conv1d", "build_context", "CPContext"]

_WHERE = "shortconv.distributed.causal_conv1d"
_DTYPE_NAMES = {code: str(dt) for dt, code in FLOAT_CODES.items()}
_DEVICE_TYPES = {"cpu": 1, "cuda": 2}


# Host-side planning (collectives whose results the host reads, Python over host ints) is not
# traceable: torch.compile runs it eagerly, a graph break (an error under fullgraph=True).
_host_only = getattr(getattr(torch, "compiler", None), "disable", lambda f: f)


def _common_state_dtype(x_dtype, s_dtype):
    """A dtype holding every x value and every state value exactly (the halo mixes both)."""
    if x_dtype == s_dtype:
        return s_dtype
    return torch.float64 if torch.float64 in (x_dtype, s_dtype) else torch.float32


# ---- the context: the token structure of one batch, read once on the host ----------------------
class CPContext:
    """Where every rank's shard sits in the global token axis, for one batch.

    Attributes: ``group`` (the process group), ``cu_seqlens`` (the global offsets [N+1] as
    given, or None for a dense batch), ``rank``, ``world_size``, ``lengths`` (every rank's
    shard length, a tuple), ``offset`` (this rank's first global token), ``batch`` (B of a dense
    batch, 1 when packed), ``num_seqs`` (N).  Build it with :func:`build_context`; pass it as
    ``context=`` here or as ``cp_context=`` to ``shortconv.causal_conv1d``.  The exchange pattern
    for a (state_len, kernel_size) pair is computed on the host on first use and cached.
    """

    def __init__(self, group, rank, world_size, global_ranks, lengths, cu_host, cu_seqlens,
                 batch, device):
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.global_ranks = tuple(global_ranks)
        self.lengths = tuple(lengths)
        self.offset = sum(self.lengths[:rank])
        self.total = sum(self.lengths)
        self.cu_seqlens = cu_seqlens
        self.cu_host = cu_host  # tuple of ints (packed) or None (dense)
        self.packed = cu_host is not None
        self.batch = batch
        self.num_seqs = len(cu_host) - 1 if self.packed else batch
        self.device = device
        self.group_name = getattr(group, "group_name", None)  # how the custom ops name it
        self._patterns = {}

    def pattern(self, state_len, kernel_size):
        key = (int(state_len), int(kernel_size))
        pat = self._patterns.get(key)
        if pat is None:
            pat = self._patterns[key] = _new_pattern(self, *key)
        return pat

    def __repr__(self):
        return "CPContext(rank=%d/%d, lengths=%s, %s)" % (
            self.rank, self.world_size, list(self.lengths),
            "packed N=%d" % self.num_seqs if self.packed else "dense B=%d" % self.batch)


class _Pattern:
    """This rank's part of the exchange for one (S, W): host ints and small device tensors.

    Token positions are global; "local" rows count from this shard's first token.
      carry   the sequence c holding the shard's first token started on an earlier rank and
              S > 0: the forward needs its halo (hn rows before the shard, from ranks < r);
      open    the sequence o holding the shard's last token continues after it; the backward
              needs la <= W-1 look-ahead rows (from ranks > r) when W > 1.
    """

    def __init__(self, ctx, S, W):
        R, r = ctx.world_size, ctx.rank
        self.S, self.W = S, W
        lens = torch.tensor(ctx.lengths, dtype=torch.int64)
        ends = torch.cumsum(lens, 0)
        starts = ends - lens
        cu = torch.tensor(ctx.cu_host if ctx.packed else (0, ctx.total), dtype=torch.int64)
        nseq = cu.numel() - 1
        nonempty = lens > 0
        zero = torch.zeros_like(lens)
        if nseq > 0:
            last = nseq - 1
            first_seq = (torch.searchsorted(cu, starts, right=True) - 1).clamp(0, last)
            hn = torch.where(nonempty, (starts - cu[first_seq]).clamp(0, S), zero)
            last_seq = (torch.searchsorted(cu, ends - 1, right=True) - 1).clamp(0, last)
            gap = cu[last_seq + 1] - ends  # tokens of the open sequence after the shard
            is_open = nonempty & (gap > 0)
            la = torch.where(is_open, gap.clamp(0, W - 1), zero)
            # who holds a sequence's first token (dinitial_state) and its last (final_state)
            start_owner = torch.searchsorted(ends, cu[:-1], right=True).clamp(max=R - 1)
            final_owner = torch.searchsorted(ends, cu[1:], right=False)
        else:
            first_seq = last_seq = gap = zero
            hn = la = zero
            is_open = nonempty & False
            start_owner = final_owner = torch.zeros(0, dtype=torch.int64)

        off, end = int(starts[r]), int(ends[r])
        self.T = T = int(lens[r])
        g = ctx.global_ranks

        def pieces(counts, los=None):
            idx = torch.nonzero(counts > 0).flatten().tolist()
            if los is None:
                return tuple((g[q], int(counts[q])) for q in idx)
            return tuple((g[q], int(los[q]), int(counts[q])) for q in idx)

        def overlap(lo, hi):  # rows of every shard inside global [lo, hi)
            return (torch.minimum(ends, torch.tensor(hi)) -
                    torch.maximum(starts, torch.tensor(lo))).clamp(min=0)

        # forward: halo rows this rank receives (by source) and sends (by destination)
        self.hn = int(hn[r])
        self.carry = self.hn > 0
        self.halo_from = pieces(overlap(off - self.hn, off))
        lo = torch.maximum(starts - hn, torch.tensor(off))
        hi = torch.minimum(starts, torch.tensor(end))
        self.halo_to = pieces((hi - lo).clamp(min=0), lo - off)
        # backward: look-ahead rows received (by source) and sent (by destination)
        self.la = int(la[r])
        self.la_from = pieces(overlap(end, end + self.la))
        lo = torch.maximum(ends, torch.tensor(off))
        hi = torch.minimum(ends + la, torch.tensor(end))
        self.la_to = pieces((hi - lo).clamp(min=0), lo - off)

        # the carried-in sequence c: local rows [0, Lc)
        self.c = c = int(first_seq[r])
        self.Lc = min(T, int(cu[c + 1]) - off) if nseq > 0 else 0
        self.mf = min(S, self.Lc) if self.carry else 0  # rows the forward recomputes with the halo
        self.c_final_owned = self.carry and int(final_owner[c]) == r
        self.small_ht = self.c_final_owned and self.Lc <= S
        # the open sequence o: local rows [s_o, T); the backward recomputes dx of rows [a, T)
        self.open = bool(is_open[r])
        self.o = o = int(last_seq[r])
        self.s_o = max(int(cu[o]), off) - off if nseq > 0 else 0
        self.a = max(self.s_o, T - (W - 1))
        self.g_main = int(gap[r]) if self.open else 0  # tokens of o after the shard
        self.g_small = self.g_main - self.la  # ... after the look-ahead
        self.o_carried = self.carry and o == c
        self.o_start_owned = nseq > 0 and int(start_owner[o]) == r
        self.small_bwd = self.la > 0
        self.small_dh0 = self.small_bwd and self.o_start_owned and self.a == self.s_o

        self.packed, self.N = ctx.packed, ctx.num_seqs
        dev = ctx.device
        if ctx.packed:
            cu_dev = ctx.cu_seqlens
            self.cu_local = (cu.clamp(off, end) - off).to(device=dev, dtype=cu_dev.dtype)
            self.own_final = (final_owner == r).to(dev).view(-1, 1, 1)
            self.own_start = (start_owner == r).to(dev).view(-1, 1, 1)
            self.owns_final = bool((final_owner == r).any())
            self.owns_start = bool((start_owner == r).any())
        else:
            self.cu_local = self.own_final = self.own_start = None
            self.owns_final = nseq > 0 and int(final_owner[0]) == r
            self.owns_start = nseq > 0 and int(start_owner[0]) == r
        self.ints = self._encode()

    # The custom ops (torch.compile) take the pattern as an int[] and its tensors separately.
    _SCALARS = ("packed", "N", "T", "hn", "carry", "c", "mf", "small_ht", "owns_final", "la",
                "small_bwd", "open", "o", "g_main", "g_small", "owns_start", "a", "s_o",
                "o_carried", "small_dh0")
    _LISTS = (("halo_from", 2), ("halo_to", 3), ("la_from", 2), ("la_to", 3))

    def _encode(self):
        out = [int(getattr(self, k)) for k in self._SCALARS]
        for name, width in self._LISTS:
            items = getattr(self, name)
            out.append(len(items))
            for item in items:
                out.extend(item)
        return out

    @classmethod
    def decode(cls, ints, cu_local, own_final, own_start):
        pat = cls.__new__(cls)
        for i, k in enumerate(cls._SCALARS):
            setattr(pat, k, int(ints[i]))
        at = len(cls._SCALARS)
        for name, width in cls._LISTS:
            n = int(ints[at])
            at += 1
            flat = [int(v) for v in ints[at:at + n * width]]
            setattr(pat, name, tuple(tuple(flat[i * width:(i + 1) * width]) for i in range(n)))
            at += n * width
        pat.cu_local, pat.own_final, pat.own_start = cu_local, own_final, own_start
        return pat


@_host_only
def _new_pattern(ctx, S, W):
    return _Pattern(ctx, S, W)


# ---- validation: every rank checks every rank's inputs, raises the same error ------------------
def _group_rank(group):
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("%s: group: torch.distributed is not initialised (call "
                         "torch.distributed.init_process_group first)" % _WHERE)
    if group is None:
        group = dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("%s: group: this process (global rank %d) is not a member of the group"
                         % (_WHERE, dist.get_rank()))
    return group, rank, dist.get_world_size(group)


def _comm_device(group, x):
    backend = str(dist.get_backend(group)).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device()), "nccl"
    if backend == "gloo":
        return torch.device("cpu"), "gloo"
    return (x.device if isinstance(x, torch.Tensor) else torch.device("cpu")), backend


class _Local:
    """A rank's view of its call: values every rank must agree on, and its first error."""

    def __init__(self):
        self.fields = []  # (argument, what, value, names) compared across ranks
        self.error = None  # (exception class, message) of this rank's first local error

    def same(self, arg, what, value, names=None):
        self.fields.append((arg, what, int(value), names))

    def fail(self, cls, msg):
        if self.error is None:
            self.error = (cls, msg)


def _check_tensor(loc, arg, t, dims, x):
    if not isinstance(t, torch.Tensor):
        loc.fail(TypeError, "%s: expected a torch.Tensor, got %s" % (arg, type(t).__name__))
        return False
    if t.dim() not in dims:
        loc.fail(ValueError, "%s: expected %s dims, got shape %s"
                 % (arg, " or ".join(map(str, dims)), list(t.shape)))
        return False
    if x is not None and t.device != x.device:
        loc.fail(ValueError, "%s: is on %s but x is on %s; every tensor must be on x's device"
                 % (arg, t.device, x.device))
        return False
    return True


def _cu_hashes(cu):
    # Two position-weighted residues mod 2^31-1: cheap on the host, different for any change.
    p = 2147483647
    i = torch.arange(cu.numel(), dtype=torch.int64)
    v = cu % p
    return [int((((v * ((i * m + 11) % p)) % p).sum() % p)) for m in (48271, 69621)]


def _describe(loc, x, cu_seqlens, backend, call):
    """Fill loc from x, cu_seqlens and (plain call) the rest of the call; returns cu on the host."""
    cu_host = None
    packed = cu_seqlens is not None
    loc.same("cu_seqlens", "presence (packed batch)", packed, _BOOL)
    if not _check_tensor(loc, "x", x, (2, 3) if packed else (3,), None):
        return None
    B = 1 if x.dim() == 2 else x.shape[0]
    if packed and B != 1:
        loc.fail(ValueError, "x: a packed batch (cu_seqlens given) is [1, T, D] or [T, D], got "
                             "shape %s" % list(x.shape))
    loc.same("x", "B (dim 0)", B)
    loc.same("x", "D (last dim)", x.shape[-1])
    if x.dtype not in FLOAT_CODES:
        loc.fail(TypeError, "x: dtype %s; expected one of %s"
                 % (x.dtype, ", ".join(map(str, FLOAT_CODES))))
    loc.same("x", "dtype", FLOAT_CODES.get(x.dtype, -1), _DTYPE_NAMES)
    dev = _DEVICE_TYPES.get(x.device.type, 0)
    loc.same("x", "device type", dev, {v: k for k, v in _DEVICE_TYPES.items()})
    need = {"nccl": "cuda", "gloo": "cpu"}.get(backend)
    if need is not None and x.device.type != need:
        loc.fail(ValueError, "x: is on %s; the %s backend of the group needs %s tensors"
                 % (x.device, backend, need))
    if packed:
        if _check_tensor(loc, "cu_seqlens", cu_seqlens, (1,), x):
            if cu_seqlens.dtype not in INDEX_CODES:
                loc.fail(TypeError, "cu_seqlens: dtype %s; expected torch.int32 or torch.int64"
                         % cu_seqlens.dtype)
            elif cu_seqlens.numel() < 1:
                loc.fail(ValueError, "cu_seqlens: expected N+1 >= 1 offsets, got none")
            else:
                cu = cu_seqlens.detach().to("cpu", torch.int64)  # the one host read of the call
                if int(cu[0]) != 0:
                    loc.fail(ValueError, "cu_seqlens: cu_seqlens[0] is %d; expected 0" % int(cu[0]))
                elif bool((cu[1:] < cu[:-1]).any()):
                    loc.fail(ValueError, "cu_seqlens: offsets decrease (expected non-decreasing)")
                else:
                    cu_host = tuple(cu.tolist())
                loc.same("cu_seqlens", "N (number of sequences)", cu.numel() - 1)
                loc.same("cu_seqlens", "cu_seqlens[-1] (global total)", int(cu[-1]))
                for h in _cu_hashes(cu):
                    loc.same("cu_seqlens", "offsets", h, _HASH)
    if call is not None:
        _describe_call(loc, x, B, call)
    return cu_host


def _describe_call(loc, x, B, call):
    weight, bias, residual, h0, S, s_given, activation, ofs, grad, N = call
    D = x.shape[-1]
    act = _act_or_none(activation)
    if act is None:
        loc.fail(ValueError, "activation: expected None, 'identity', 'silu' or 'swish', got %r"
                 % (activation,))
        act = -1
    W = 1
    if _check_tensor(loc, "weight", weight, (2,), x):
        W = weight.shape[1]
        if weight.shape[0] != D or W < 1:
            loc.fail(ValueError, "weight: expected [D, W] = [%d, W >= 1], got %s"
                     % (D, list(weight.shape)))
        if weight.dtype not in FLOAT_CODES:
            loc.fail(TypeError, "weight: dtype %s; expected a float dtype" % weight.dtype)
        loc.same("weight", "dtype", FLOAT_CODES.get(weight.dtype, -1), _DTYPE_NAMES)
    loc.same("weight", "W (dim 1)", W)
    loc.same("bias", "presence", bias is not None, _BOOL)
    if bias is not None and _check_tensor(loc, "bias", bias, (1,), x):
        if bias.shape[0] != D or (isinstance(weight, torch.Tensor) and bias.dtype != weight.dtype):
            loc.fail(ValueError, "bias: expected [%d] in weight's dtype, got %s %s"
                     % (D, list(bias.shape), bias.dtype))
    if residual is not None and _check_tensor(loc, "residual", residual, (x.dim(),), x):
        if residual.shape != x.shape or residual.dtype != x.dtype:
            loc.fail(ValueError, "residual: expected x's shape %s and dtype %s, got %s %s"
                     % (list(x.shape), x.dtype, list(residual.shape), residual.dtype))
    s_arg = "state_len" if s_given else "initial_state"
    loc.same(s_arg, "S" if s_given else "S (last dim, the default state_len)", S)
    if S < max(W - 1, 0):
        loc.fail(ValueError, "%s: S = %d; expected S >= W-1 = %d" % (s_arg, S, W - 1))
    loc.same("initial_state", "presence", h0 is not None, _BOOL)
    if h0 is not None and _check_tensor(loc, "initial_state", h0, (3,), x):
        if N is not None and tuple(h0.shape) != (N, D, S):
            loc.fail(ValueError, "initial_state: expected [N, D, S] = [%d, %d, %d], got %s"
                     % (N, D, S, list(h0.shape)))
        if h0.dtype not in FLOAT_CODES:
            loc.fail(TypeError, "initial_state: dtype %s; expected a float dtype" % h0.dtype)
        loc.same("initial_state", "dtype", FLOAT_CODES.get(h0.dtype, -1), _DTYPE_NAMES)
    loc.same("activation", "code (0 = none, 1 = silu)", act)
    loc.same("output_final_state", "value", ofs, _BOOL)
    loc.same("autograd", "recording for backward (grad enabled and an input requires grad)",
             grad, _BOOL)


_HASH = "hash"  # marks a field compared by hash: the message names no values
_BOOL = {0: "False", 1: "True"}


def _raise_everywhere(group, loc, g_ranks, metas, names):
    """Raise on every rank: the first failing rank's local error, else the first disagreement."""
    bad = [q for q, m in enumerate(metas) if m[0] != 0]
    if bad:
        q = bad[0]
        obj = [loc.error[1] if loc.error is not None else None]
        dist.broadcast_object_list(obj, src=g_ranks[q], group=group)
        cls = TypeError if metas[q][0] == 2 else ValueError
        raise cls("%s: on rank %d: %s" % (_WHERE, q, obj[0]))
    for i, (arg, what, _, vnames) in enumerate(names):
        ref = metas[0][2 + i]
        for q, m in enumerate(metas):
            if m[2 + i] != ref and vnames is _HASH:
                raise ValueError("%s: %s: the offsets on rank %d differ from rank 0's; every "
                                 "rank must pass the same global offsets" % (_WHERE, arg, q))
            if m[2 + i] != ref:
                show = (lambda v: vnames.get(v, v)) if vnames else (lambda v: v)
                raise ValueError("%s: %s: %s is %s on rank %d but %s on rank 0; every rank of "
                                 "the group must pass the same" % (
                                     _WHERE, arg, what, show(m[2 + i]), q, show(ref)))


_META_LEN = 40  # fixed, so that a rank that failed early still sends what the others expect


def _gather(group, device, loc, T):
    err = 0 if loc.error is None else (2 if loc.error[0] is TypeError else 1)
    vals = [err, T] + [f[2] for f in loc.fields]
    vals += [0] * (_META_LEN - len(vals))
    mine = torch.tensor(vals, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out).cpu().tolist()


@_host_only
def _build(x, cu_seqlens, group, call):
    group, rank, world = _group_rank(group)
    device, backend = _comm_device(group, x)
    loc = _Local()
    cu_host = _describe(loc, x, cu_seqlens, backend, call)
    T = x.shape[-2] if isinstance(x, torch.Tensor) and x.dim() >= 2 else 0
    ranks = (list(range(world)) if group is dist.group.WORLD
             else dist.get_process_group_ranks(group))
    metas = _gather(group, device, loc, T)
    _raise_everywhere(group, loc, ranks, metas, loc.fields)
    lengths = [m[1] for m in metas]
    B = 1 if x.dim() == 2 else x.shape[0]
    if cu_host is not None and cu_host[-1] != sum(lengths):
        raise ValueError(
            "%s: cu_seqlens: cu_seqlens[-1] is %d on every rank; expected %d, the sum of the shard "
            "lengths %s over the group (cu_seqlens holds global offsets over the concatenated "
            "shards, not this rank's)" % (_WHERE, cu_host[-1], sum(lengths), lengths))
    return CPContext(group, rank, world, ranks, lengths, cu_host, cu_seqlens, B, x.device)


def build_context(x_local, cu_seqlens=None, group=None, *, kernel_size=None, state_len=None):
    """The exchange plan of one batch, built once (one all-gather whose result the host reads).

    Every rank calls it with its shard; it checks that x's B (dense), D, dtype and device type
    and cu_seqlens agree on every rank and that cu_seqlens[-1] is the sum of the shard
    lengths, and raises the same error on every rank otherwise.

    Args:
        x_local: [B, T_r, D] (dense) or [1, T_r, D] / [T_r, D] with cu_seqlens; only its shape,
            dtype and device are read.
        cu_seqlens: [N+1] global offsets over the concatenated shards (the same on every rank),
            on x's device; None for a dense batch.
        group: the context-parallel process group (default: the world group).
        kernel_size, state_len: W and S to plan the exchange for now (the pattern is otherwise
            computed on the first call that uses them; plan them here for torch.compile).
    """
    ctx = _build(x_local, cu_seqlens, group, None)
    if kernel_size is not None:
        ctx.pattern(state_len if state_len is not None else kernel_size, kernel_size)
    return ctx


# ---- the exchange ------------------------------------------------------------------------------
def _bytes(t):
    # Payloads travel as bytes: exact for every dtype, and gloo lacks bfloat16 on older torch.
    return t.view(torch.uint8) if t.dim() > 0 and t.numel() > 0 else t


def _p2p(group, sends, recvs):
    """Post sends [(global peer, tensor, tag)] and receives [(global peer, buffer, tag)];
    returns the works.  Tags keep two messages between one pair apart on gloo."""
    ops = [dist.P2POp(dist.irecv, _bytes(b), peer, group, tag) for peer, b, tag in recvs]
    ops += [dist.P2POp(dist.isend, _bytes(t.contiguous()), peer, group, tag)
            for peer, t, tag in sends]
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(works):
    for w in works:
        w.wait()


def _all_reduce_bytes(t, group):
    """Replicate rows that one rank filled (the others hold zeros): a byte-wise sum is exact."""
    if t.numel() > 0:
        dist.all_reduce(_bytes(t), group=group)
    return t


def _shift(v, g):
    """dfinal_state as seen by a chunk that ends g tokens before the sequence: [-0]*g ++ v[:S-g].

    Adding -0.0 is the exact identity, so positions outside the sequence's last S tokens come
    out bitwise as if nothing were added."""
    S = v.shape[-1]
    g = min(g, S)
    if g == 0:
        return v
    return torch.cat([torch.full(v.shape[:-1] + (g,), -0.0, dtype=v.dtype, device=v.device),
                      v[..., :S - g]], dim=-1)


def _rows(t, n, packed):
    """Row n of a state [N, D, S] as [1, D, S] (packed); the whole state (dense)."""
    return t[n:n + 1] if packed else t


# ---- the computation ---------------------------------------------------------------------------
def _forward(x, weight, bias, residual, h0, group, pat, S, act, ofs):
    """y [x's shape], final_state [N, D, S] (replicated) or None, halo state E [B, D, S] or None."""
    packed = pat.packed
    B, T, D = x.shape
    sdt = h0.dtype if h0 is not None else x.dtype
    edt = _common_state_dtype(x.dtype, sdt)
    # rows travel token-major ([n, B, D]; for B = 1 a slice of x as it is)
    halo = x.new_empty((pat.hn, B, D)) if pat.carry else None
    sends = [(p, x[:, lo:lo + n].transpose(0, 1), 0) for p, lo, n in pat.halo_to]
    recvs, at = [], 0
    for p, n in pat.halo_from:
        recvs.append((p, halo[at:at + n], 0))
        at += n
    works = _p2p(group, sends, recvs)
    # Rows past the first S of the carried sequence never read the halo: compute the whole
    # shard now (the carried sequence with a stand-in initial state) while the halo travels.
    y, ht = _ops.forward_impl(x, weight, bias, residual, h0, pat.cu_local, S, act, ofs,
                              where=_WHERE)
    _wait(works)
    E = None
    if pat.carry:
        E = halo.permute(1, 2, 0).to(edt)  # a strided view when the halo fills the state
        if pat.hn < S:  # the sequence started fewer than S tokens ago: initial_state's tail
            h0c = (_rows(h0, pat.c, packed).to(edt) if h0 is not None
                   else torch.zeros((B, D, S), dtype=edt, device=x.device))
            E = torch.cat([h0c[..., pat.hn:], E], dim=2)
        if pat.mf > 0:
            rs = residual[:, :pat.mf] if residual is not None else None
            ys, hs = _ops.forward_impl(x[:, :pat.mf], weight, bias, rs, E, None, S, act,
                                       ofs and pat.small_ht, where=_WHERE)
            y[:, :pat.mf] = ys
            if ofs and pat.small_ht:
                _rows(ht, pat.c, packed).copy_(hs)
    if ofs:
        if packed:
            ht = torch.where(pat.own_final, ht, torch.zeros_like(ht))
        elif not pat.owns_final:
            ht = torch.zeros_like(ht)
        _all_reduce_bytes(ht, group)
    return y, (ht if ofs else None), E


def _backward(x, weight, bias, h0, E, group, pat, S, act, ofs, dy, dht,
              need_dx, need_dw, need_db, need_dh0):
    """(dx, dweight, dbias, dinitial_state): dx this rank's slice, the rest partial sums."""
    packed, N = pat.packed, pat.N
    B, T, D = x.shape
    sdt = h0.dtype if h0 is not None else x.dtype
    edt = _common_state_dtype(x.dtype, sdt)
    ar = None
    if ofs:  # gradients of the replicated final_state copies, summed over the group
        acc = torch.float32 if sdt in (torch.float16, torch.bfloat16) else sdt
        red = (dht.to(acc).contiguous() if dht is not None
               else torch.zeros((N, D, S), dtype=acc, device=x.device))
        if red is dht:
            red = red.clone()
        ar = dist.all_reduce(red, group=group, async_op=True) if red.numel() else None
    # look-ahead: x and dy of the next rows of the open sequence, from later ranks
    sends = []
    for p, lo, n in pat.la_to:
        gx = x[:, lo:lo + n]
        gd = dy[:, lo:lo + n].to(x.dtype) if dy is not None else torch.zeros_like(gx)
        sends += [(p, gx.transpose(0, 1), 1), (p, gd.transpose(0, 1), 2)]
    la_x = x.new_empty((pat.la, B, D)) if pat.small_bwd else None
    la_dy = x.new_empty((pat.la, B, D)) if pat.small_bwd else None
    recvs, at = [], 0
    for p, n in pat.la_from:
        recvs += [(p, la_x[at:at + n], 1), (p, la_dy[at:at + n], 2)]
        at += n
    works = _p2p(group, sends, recvs)
    if ar is not None:
        ar.wait()
    dht_sum = red.to(sdt) if ofs else None

    # main: the whole shard with its true initial states; dfinal_state of the open sequence
    # shifted to where the whole computation adds it
    if pat.carry:
        if packed:
            init = (h0.to(edt) if h0 is not None
                    else torch.zeros((N, D, S), dtype=edt, device=x.device))
            if init is h0:
                init = init.clone()
            init[pat.c:pat.c + 1] = E
        else:
            init = E
    else:
        init = h0
    bdt = init.dtype if init is not None else sdt
    dht_main = None
    if ofs:
        dht_main = dht_sum.to(bdt)
        if pat.open and pat.g_main > 0:
            if dht_main is dht_sum:
                dht_main = dht_main.clone()
            rows = _rows(dht_main, pat.o, packed)
            rows.copy_(_shift(rows.clone(), pat.g_main))
    want_dh0 = need_dh0 and pat.owns_start
    dx, dw, db, dh0 = _ops.backward_impl(x, weight, bias, init, pat.cu_local, dy, dht_main, S,
                                         act, need_dx, need_dw, need_db, want_dh0,
                                         where=_WHERE + " (backward)")
    if need_dh0:
        if dh0 is None:
            dh0 = torch.zeros((N, D, S), dtype=sdt, device=x.device)
        else:
            dh0 = dh0.to(sdt)
            if packed:
                dh0 = torch.where(pat.own_start, dh0, torch.zeros_like(dh0))
    if need_dw and dw is None:
        dw = torch.zeros_like(weight)
    if need_db and db is None:
        db = torch.zeros_like(bias)

    # small: the last rows [a, T) of the open sequence ++ the look-ahead, for bitwise dx
    _wait(works)
    if pat.small_bwd and (need_dx or (need_dh0 and pat.small_dh0)):
        a, m = pat.a, T - pat.a
        x_ext = torch.cat([x[:, a:], la_x.transpose(0, 1)], dim=1)
        g_loc = dy[:, a:].to(x.dtype) if dy is not None else torch.zeros_like(x[:, a:])
        dy_ext = torch.cat([g_loc, la_dy.transpose(0, 1)], dim=1)
        k = a - pat.s_o  # rows of o before the small segment
        if k >= S:
            init_s = x[:, a - S:a].permute(0, 2, 1).to(edt)
        else:
            if pat.o_carried:
                init_o = E
            elif h0 is not None:
                init_o = _rows(h0, pat.o, packed).to(edt)
            else:
                init_o = torch.zeros((B, D, S), dtype=edt, device=x.device)
            init_s = torch.cat([init_o[..., k:], x[:, pat.s_o:a].permute(0, 2, 1).to(edt)], dim=2)
        dht_s = _shift(_rows(dht_sum, pat.o, packed).to(edt), pat.g_small) if ofs else None
        want = need_dh0 and pat.small_dh0
        dxs, _, _, dh0s = _ops.backward_impl(x_ext, weight, bias, init_s, None, dy_ext, dht_s, S,
                                             act, need_dx, False, False, want,
                                             where=_WHERE + " (backward)")
        if need_dx:
            dx[:, a:] = dxs[:, :m]
        if want:
            _rows(dh0, pat.o, packed).copy_(dh0s)
    return dx, dw, db, dh0


class _Run:
    """What one call needs besides tensors (kept on the autograd node)."""
    __slots__ = ("group", "pat", "S", "act", "ofs")

    def __init__(self, group, pat, S, act, ofs):
        self.group, self.pat, self.S, self.act, self.ofs = group, pat, S, act, ofs


class _CPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, h0, run):
        y, ht, E = _forward(x, weight, bias, residual, h0, run.group, run.pat, run.S, run.act,
                            run.ofs)
        ctx.save_for_backward(x, weight, bias, h0, E)
        ctx.run = run
        ctx.has_residual = residual is not None
        ctx.set_materialize_grads(False)
        return y, ht

    @staticmethod
    def backward(ctx, dy, dht):
        x, weight, bias, h0, E = ctx.saved_tensors
        need = ctx.needs_input_grad
        r = ctx.run
        dx, dw, db, dh0 = _backward(x, weight, bias, h0, E, r.group, r.pat, r.S, r.act, r.ofs, dy,
                                    dht, need[0], need[1], need[2] and bias is not None,
                                    need[4] and h0 is not None)
        dres = None
        if ctx.has_residual and need[3]:
            dres = dy if dy is not None else torch.zeros_like(x)
        return dx, dw, db, dres, dh0, None


# ---- custom ops (torch >= 2.4): torch.compile traces the call without a graph break ------------
try:
    from torch.distributed.distributed_c10d import _resolve_process_group
except ImportError:  # torch < 2.3
    _resolve_process_group = None
HAS_CP_CUSTOM_OPS = _ops.HAS_CUSTOM_OPS and _resolve_process_group is not None

if HAS_CP_CUSTOM_OPS:

    def _empty(x, dtype):
        return torch.empty((0,), dtype=dtype, device=x.device)

    def _dtypes(x, h0):
        sdt = h0.dtype if h0 is not None else x.dtype
        return sdt, _common_state_dtype(x.dtype, sdt)

    @torch.library.custom_op(
        "shortconv::cp_fwd", mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, Tensor? initial_state, "
               "Tensor? cu_local, Tensor? own_final, Tensor? own_start, int[] pattern, str group, "
               "int state_len, int activation, bool output_final_state) "
               "-> (Tensor, Tensor, Tensor)")
    def _cp_fwd_op(x, weight, bias, residual, h0, cu_local, own_final, own_start, pattern, group,
                   S, act, ofs):
        pat = _Pattern.decode(pattern, cu_local, own_final, None)
        y, ht, E = _forward(x, weight, bias, residual, h0, _resolve_process_group(group), pat,
                            S, act, ofs)
        sdt, edt = _dtypes(x, h0)
        return y, (ht if ht is not None else _empty(x, sdt)), (E if E is not None
                                                               else _empty(x, edt))

    @_cp_fwd_op.register_fake
    def _cp_fwd_fake(x, weight, bias, residual, h0, cu_local, own_final, own_start, pattern,
                     group, S, act, ofs):
        pat = _Pattern.decode(pattern, None, None, None)
        B, T, D = x.shape
        sdt, edt = _dtypes(x, h0)
        ht = x.new_empty((pat.N, D, S), dtype=sdt) if ofs else _empty(x, sdt)
        if not pat.carry:
            E = _empty(x, edt)
        elif pat.hn < S:  # initial_state's tail ++ the halo: a fresh concatenation
            E = x.new_empty((B, D, S), dtype=edt)
        else:  # the halo [S, B, D] viewed as [B, D, S] (_forward)
            E = x.new_empty((S, B, D), dtype=edt).permute(1, 2, 0)
        return _layout.like_x(x), ht, E

    @torch.library.custom_op(
        "shortconv::cp_bwd", mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? initial_state, Tensor halo_state, "
               "Tensor? cu_local, Tensor? own_start, Tensor? dy, Tensor? dht, int[] pattern, "
               "str group, int state_len, int activation, bool output_final_state, bool need_dx, "
               "bool need_dweight, bool need_dbias, bool need_dinitial_state) "
               "-> (Tensor, Tensor, Tensor, Tensor)")
    def _cp_bwd_op(x, weight, bias, h0, E, cu_local, own_start, dy, dht, pattern, group, S, act,
                   ofs, need_dx, need_dw, need_db, need_dh0):
        pat = _Pattern.decode(pattern, cu_local, None, own_start)
        dx, dw, db, dh0 = _backward(x, weight, bias, h0, E if pat.carry else None,
                                    _resolve_process_group(group), pat, S, act, ofs, dy, dht,
                                    need_dx, need_dw, need_db, need_dh0)
        sdt = h0.dtype if h0 is not None else x.dtype
        return (dx if dx is not None else _empty(x, x.dtype),
                dw if dw is not None else _empty(x, weight.dtype),
                db if db is not None else _empty(x, weight.dtype),
                dh0 if dh0 is not None else _empty(x, sdt))

    @_cp_bwd_op.register_fake
    def _cp_bwd_fake(x, weight, bias, h0, E, cu_local, own_start, dy, dht, pattern, group, S, act,
                     ofs, need_dx, need_dw, need_db, need_dh0):
        sdt = h0.dtype if h0 is not None else x.dtype
        # the layouts _backward returns (_layout.py): dx like x, the others contiguous
        return (_layout.like_x(x) if need_dx else _empty(x, x.dtype),
                _layout.like_contiguous(weight) if need_dw else _empty(x, weight.dtype),
                _layout.like_contiguous(bias) if need_db else _empty(x, weight.dtype),
                _layout.like_contiguous(h0) if need_dh0 else _empty(x, sdt))

    def _cp_setup(ctx, inputs, output):
        (x, weight, bias, residual, h0, cu_local, _own_final, own_start, pattern, group, S, act,
         ofs) = inputs
        ctx.save_for_backward(x, weight, bias, h0, output[2], cu_local, own_start)
        ctx.args = (pattern, group, S, act, ofs, residual is not None)

    def _cp_backward(ctx, dy, dht, _dE):
        x, weight, bias, h0, E, cu_local, own_start = ctx.saved_tensors
        pattern, group, S, act, ofs, has_res = ctx.args
        need = ctx.needs_input_grad
        if dht is not None and dht.numel() == 0:
            dht = None
        want = (need[0], need[1], need[2] and bias is not None, need[4] and h0 is not None)
        dx, dw, db, dh0 = torch.ops.shortconv.cp_bwd(x, weight, bias, h0, E, cu_local, own_start,
                                                     dy, dht, pattern, group, S, act, ofs, *want)
        dres = None
        if has_res and need[3]:
            dres = dy if dy is not None else torch.zeros_like(x)
        return ((dx if want[0] else None), (dw if want[1] else None), (db if want[2] else None),
                dres, (dh0 if want[3] else None)) + (None,) * 8

    torch.library.register_autograd("shortconv::cp_fwd", _cp_backward, setup_context=_cp_setup)


# ---- public entry point ------------------------------------------------------------------------
def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t is not None and isinstance(t, torch.Tensor)
                                           and t.requires_grad for t in ts)


def causal_conv1d(x_local, weight, bias=None, residual=None, initial_state=None,
                  output_final_state=False, activation=None, *, group=None, cu_seqlens=None,
                  state_len=None, context=None):
    """Context-parallel short causal convolution: ``(y_local, final_state)``.

    With X = x_local(rank 0) ++ x_local(rank 1) ++ ... along the token axis (the group's rank
    order), and u_n = initial_state_n ++ X_n for each sequence n of X:

        y[n, t, d] = act(bias[d] + sum_k weight[d, k] * u_n[S-(W-1)+t+k, d]) + residual[n, t, d]
        final_state_n = the last S entries of u_n

    y_local is this rank's rows of y.  Exactness (tests/python/test_distributed.py asserts it):

    - y_local and final_state: bitwise equal to ``shortconv.causal_conv1d`` on X (one process,
      same backend), for any shard lengths (0 and 1 included; the state entering a rank may hold
      tokens of several earlier ranks and of initial_state).
    - dx_local (and dresidual = dy): bitwise equal to the single-process dx rows, given the same
      dy and the same final_state gradient.  Each rank recomputes the backward of its last W-1
      rows over the next W-1 tokens of the sequence (x and dy fetched from the ranks that hold
      them) and places dfinal_state where the whole computation adds it.
    - dinitial_state: partial sums that are exact: the rank holding a sequence's first token
      (for an empty sequence, the rank at its offset) returns its row bitwise, the others zeros.
    - dweight, dbias: partial sums over this rank's tokens; their sum over the group equals the
      single-process gradient within rounding (a different summation order), which is how a
      training framework reduces parameter gradients across a context-parallel group (an
      all-reduce over it, or over the data- and context-parallel ranks together).
    - final_state is returned on every rank; the gradients arriving at its copies are summed
      over the group (in fp32 for 16-bit states), so a loss on any rank's copy counts once.

    Args:
        x_local: [B, T_r, D] (dense; T_r may differ per rank and be 0), or [1, T_r, D] / [T_r, D]
            with cu_seqlens (packed); [B, T_r, H, Dh] is flattened like shortconv.causal_conv1d.
        weight: [D, W], the same on every rank.  bias: [D], optional, weight's dtype.
        residual: like x_local, optional (this rank's rows).
        initial_state: [N, D, S], optional, replicated (the same values on every rank); row n
            feeds sequence n's first token wherever it lives.
        output_final_state: return final_state [N, D, S] (replicated) instead of None.
        activation: None, 'silu' or 'swish'.
        group: the context-parallel process group (default: the world group); NCCL needs CUDA
            tensors, gloo CPU tensors.
        cu_seqlens: [N+1] global offsets over X, the same on every rank (packed batches).
        state_len: S >= W-1 (default initial_state.shape[-1], else W).
        context: a CPContext from build_context for this batch (its group and cu_seqlens are
            used); without one, each call builds it: one all-gather read on the host, which
            validates the call on every rank.

    Every rank of the group must call it (and run its backward) with the same B, D, W, S,
    dtypes, activation and output_final_state.  Without a context these are checked, and a
    mismatch or a bad argument raises the same error on every rank.  With a context only the
    shard (T_r, B, device) is checked, on this rank: a rank that raises leaves the others
    waiting in the exchange, as with any collective.

    Communication: torch.distributed point-to-point messages and all-reduces on ``group``;
    with NCCL they are ordered with the current CUDA stream (no host synchronisation; the
    plain call's plan reads an all-gather on the host).  torch.compile (torch >= 2.4): the
    call is the custom ops torch.ops.shortconv.cp_fwd / cp_bwd, traced without a graph break
    when a context is passed whose exchange for (S, W) is planned (build_context's
    kernel_size/state_len, or an earlier eager call); building a plan inside the compiled
    region is host work, a graph break.
    """
    act = activation_code(activation) if context is not None else _act_or_none(activation)
    shape = x_local.shape if isinstance(x_local, torch.Tensor) else None
    x = x_local
    if isinstance(x, torch.Tensor) and x.dim() > 3:
        x = x.flatten(2)
        if isinstance(residual, torch.Tensor) and residual.dim() > 3:
            residual = residual.flatten(2)
    s_given = state_len is not None
    if state_len is None:
        if isinstance(initial_state, torch.Tensor) and initial_state.dim() == 3:
            state_len = initial_state.shape[-1]
        else:
            state_len = weight.shape[-1] if isinstance(weight, torch.Tensor) and weight.dim() else 1
    S = int(state_len)
    ofs = bool(output_final_state)
    grad = _needs_grad(x, weight, bias, residual, initial_state)
    if context is None:
        N = None  # sequences, for initial_state's shape (None: x or cu_seqlens is malformed)
        if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1:
            N = cu_seqlens.numel() - 1
        elif cu_seqlens is None and isinstance(x, torch.Tensor) and x.dim() == 3:
            N = x.shape[0]
        call = (weight, bias, residual, initial_state, S, s_given, activation, ofs, grad, N)
        context = _build(x, cu_seqlens, group, call)
    else:
        _check_against(context, x, cu_seqlens)
    packed = context.packed
    x3 = x.unsqueeze(0) if x.dim() == 2 else x
    r3 = residual.unsqueeze(0) if residual is not None and residual.dim() == 2 else residual
    W = weight.shape[-1]
    pat = context.pattern(S, W)
    if context.world_size == 1:
        y, ht = _single(x3, weight, bias, r3, initial_state, context, S, act, ofs)
    elif HAS_CP_CUSTOM_OPS and _ops.use_custom_op():  # torch.compile: no graph break
        y, ht, _ = torch.ops.shortconv.cp_fwd(
            x3, weight, bias, r3, initial_state, pat.cu_local, pat.own_final, pat.own_start,
            pat.ints, context.group_name, S, act, ofs)
        ht = ht if ofs else None
    else:
        run = _Run(context.group, pat, S, act, ofs)
        if grad:
            y, ht = _CPFunction.apply(x3, weight, bias, r3, initial_state, run)
        else:
            y, ht, _ = _forward(x3, weight, bias, r3, initial_state, context.group, pat, S, act,
                                ofs)
    if packed and x.dim() == 2:
        y = y.squeeze(0)
    if y.shape != shape:
        y = y.view(shape)
    return y, ht


def _single(x3, weight, bias, r3, h0, ctx, S, act, ofs):
    from .functional import causal_conv1d as local
    names = {0: None, 1: "silu"}
    return local(x3, weight, bias, r3, h0, ofs, names[act], cu_seqlens=ctx.cu_seqlens,
                 state_len=S)


def _act_or_none(activation):
    try:
        return activation_code(activation)
    except ValueError:
        return None  # reported on every rank by the validation


def _check_against(ctx, x, cu_seqlens):
    if not isinstance(ctx, CPContext):
        raise TypeError("%s: context: expected a CPContext from build_context, got %s"
                        % (_WHERE, type(ctx).__name__))
    if cu_seqlens is not None and cu_seqlens is not ctx.cu_seqlens:
        raise ValueError("%s: cu_seqlens: pass the global offsets once, in the context"
                         % _WHERE)
    if not isinstance(x, torch.Tensor):
        raise TypeError("%s: x: expected a torch.Tensor, got %s" % (_WHERE, type(x).__name__))
    T = x.shape[-2] if x.dim() >= 2 else -1
    B = 1 if x.dim() == 2 else x.shape[0]
    if T != ctx.lengths[ctx.rank] or B != ctx.batch or (ctx.packed and x.dim() not in (2, 3)):
        raise ValueError("%s: x: shape %s on rank %d; the context was built for %s tokens and "
                         "B = %d on this rank" % (_WHERE, list(x.shape), ctx.rank,
                                                  ctx.lengths[ctx.rank], ctx.batch))
    if x.device != ctx.device:
        raise ValueError("%s: x: is on %s; the context was built for %s"
                         % (_WHERE, x.device, ctx.device))


def _from_cp_context(x, weight, bias, residual, initial_state, output_final_state, activation,
                     cu_seqlens, state_len, cp_context):
    """shortconv.causal_conv1d(..., cp_context=ctx): ctx carries .group and global .cu_seqlens."""
    if isinstance(cp_context, CPContext):
        return causal_conv1d(x, weight, bias, residual, initial_state, output_final_state,
                             activation, cu_seqlens=cu_seqlens, state_len=state_len,
                             context=cp_context)
    if not hasattr(cp_context, "group") or not hasattr(cp_context, "cu_seqlens"):
        raise TypeError("shortconv.causal_conv1d: cp_context: expected an object with .group and "
                        ".cu_seqlens (global offsets), e.g. shortconv.distributed.build_context's; "
                        "got %s" % type(cp_context).__name__)
    cu = cp_context.cu_seqlens
    if cu_seqlens is not None and cu_seqlens is not cu:
        raise ValueError("shortconv.causal_conv1d: cu_seqlens: pass the global offsets once, in "
                         "cp_context.cu_seqlens")
    return causal_conv1d(x, weight, bias, residual, initial_state, output_final_state,
                         activation, group=cp_context.group, cu_seqlens=cu, state_len=state_len)

