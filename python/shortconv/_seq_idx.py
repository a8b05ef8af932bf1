"""Sequence ids (``seq_idx``, Mamba-2's way of describing a packed batch) over cu_seqlens.

A batch ``x [B, T, D]`` with ``seq_idx [B, T]`` holds, in each row, maximal runs of equal ids;
each run is one sequence, and a negative id marks padding tokens (output 0, read by no other
token's window).  The runs become a packed batch over the ``B*T`` tokens taken row after row,
described by ``cu_seqlens [B*T + 1]``: run k covers ``[cu[k], cu[k+1])`` and the runs past the
last one are empty.  Everything here is device tensor arithmetic: no host synchronisation and
no Python loop over sequences (the number of runs is never needed on the host).

States: sequence id ``i`` reads row ``i`` of ``initial_state [N, D, S]`` and its final state is
row ``i`` of ``final_state`` (each id one run: an id in two runs has two final states and which
one is kept is not specified).  Padding runs read and write no row.
"""

import torch


def offsets(seq_idx, dtype):
    """cu_seqlens [B*T + 1] (``dtype``) of the runs of ``seq_idx [B, T]``, row after row."""
    B, T = seq_idx.shape
    n = B * T
    flat = seq_idx.reshape(n)
    start = torch.ones(n, dtype=torch.bool, device=seq_idx.device)
    if n > 1:
        start[1:] = flat[1:] != flat[:-1]
    if T > 0:
        start.view(B, T)[:, 0] = True  # a row boundary always starts a run
    run = torch.cumsum(start, 0) - 1  # run of each token, non-decreasing
    # cu[k] = number of tokens in runs before k
    k = torch.arange(n + 1, device=seq_idx.device, dtype=run.dtype)
    return torch.searchsorted(run, k, side="left").to(dtype)


def run_ids(seq_idx, cu):
    """(id of each run [B*T], whether it is a real sequence: non-empty and id >= 0)."""
    flat = seq_idx.reshape(-1)
    n = flat.numel()
    first = cu[:-1].long().clamp(max=max(n - 1, 0))
    ids = flat[first] if n else flat.new_empty(0)
    real = (cu[1:] > cu[:-1]) & (ids >= 0)
    return ids.long(), real


def gather_states(initial_state, ids, real):
    """initial_state rows of the runs [B*T, D, S]; zeros for padding and empty runs."""
    rows = ids.clamp(0, max(initial_state.shape[0] - 1, 0))
    h0 = initial_state.index_select(0, rows)
    return h0 * real.view(-1, 1, 1).to(h0.dtype)


def scatter_states(final_runs, ids, real, rows):
    """final_state [rows, D, S]: row i = the final state of the run with id i (zeros if none)."""
    _, D, S = final_runs.shape
    out = final_runs.new_zeros(rows + 1, D, S)  # row `rows` collects padding and empty runs
    idx = torch.where(real & (ids < rows), ids, torch.full_like(ids, rows))
    return out.index_copy(0, idx, final_runs)[:rows]
