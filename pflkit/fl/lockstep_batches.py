"""The batches of a vectorized group's clients, step by step (`pflkit.fl.vectorized`).

Each client's batch stream (`pflkit.fl.train.BatchStream`) draws its batches from its own generator.
Where the stream allows it (`positions`), the positions of all its batches are drawn up front with
the same generator calls, so a step's batches of many clients are one index op on the pooled
tensors (`Source.gather`), padded to one size where the group allows it; other streams are drawn
one batch at a time and stacked, clients with batches of another size in subgroups.
"""
from __future__ import annotations

import functools
import itertools
from typing import Iterator

import numpy as np
import torch

from pflkit.data.base import to_float
from pflkit.fl.train import Batch, BatchStream

__all__ = ["drawn", "positions", "Source", "pooled_steps", "loose_steps"]


def drawn(stream: Iterator[Batch]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The pooled positions of every batch ``stream`` (a `BatchStream`) would yield, drawn now by the same
    generator calls (`Client.batches` / `Client.random_batch`: one ``torch.randperm`` per epoch or step),
    as (the batches' positions one after another, each batch's length, the same positions as places in
    the client's split); None when it cannot say (a
    stream already started, augmentation, which draws from the generator between batches, or data not
    held in one tensor). The stream is then spent."""
    if not isinstance(stream, BatchStream) or stream.started:
        return None
    c, g, size = stream.client, stream.generator, stream.batch_size
    if (stream.augment and c.augment != "none") or not isinstance(c.x, torch.Tensor):
        return None
    idx = c.splits[stream.split]
    n, rounds = len(idx), stream.steps if stream.steps > 0 else stream.epochs
    perms = [torch.randperm(n, generator=g, device="cpu") for _ in range(rounds)]
    if stream.steps > 0:  # a fresh random batch per step: the first min(size, n) of each permutation
        take = min(size, n)
        order, lengths = torch.stack(perms)[:, :take] if perms else torch.zeros(0, 0, dtype=torch.long), [take] * rounds
    else:  # every epoch a shuffled pass in batches of ``size``, the last one short
        order, lengths = torch.stack(perms) if perms else torch.zeros(0, 0, dtype=torch.long), \
            ([size] * (n // size) + ([n % size] if n % size else [])) * rounds
    stream._it = iter(())
    order = order.numpy().reshape(-1)
    return idx[order], np.array(lengths, dtype=np.int64), order


def positions(stream: Iterator[Batch]) -> list[np.ndarray] | None:
    """`drawn`'s positions batch by batch (None when it cannot say); the stream is then spent."""
    got = drawn(stream)
    return None if got is None else _split(got[0], got[1])


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


class Source:
    """Where the clients of a group get their batches: positions drawn up front (`drawn`) where the
    streams allow it, the batches of many clients and steps gathered with one index op (`gather`);
    else the streams themselves.

    ``prefetch``: bytes of float inputs gathered at once, several steps of every client (a block,
    padded to the longest batch), from which each step takes its rows: one index op and one
    conversion per block instead of per step."""

    prefetch = 64 * 2**20

    def __init__(self, reqs: list):
        self.reqs = reqs
        self.drawn = [drawn(r.batches) for r in reqs]
        first = reqs[0].batches
        self.pooled = all(d is not None for d in self.drawn) and all(
            r.batches.client.x is first.client.x and r.batches.client.y is first.client.y
            and r.batches.client.meta == first.client.meta and r.batches.device == first.device for r in reqs)
        if self.pooled:
            self._table()
        self._block: tuple[int, int, torch.Tensor, torch.Tensor] | None = None

    @functools.cached_property
    def pos(self) -> list[list[np.ndarray] | None]:
        """Each client's positions batch by batch (None where they were not drawn up front)."""
        return [None if d is None else _split(d[0], d[1]) for d in self.drawn]

    def _table(self) -> None:
        """Every client's positions in one array (``flat``, client after client, batch after batch), with
        the start and length of client ``i``'s batch ``s`` at ``start[i, s]`` / ``length[i, s]`` and its
        number of batches ``count[i]``: the index matrix of many clients' batches is a few array ops."""
        self.count = np.array([len(d[1]) for d in self.drawn], dtype=np.int64)
        steps = int(self.count.max(initial=0))
        every = np.concatenate([d[1] for d in self.drawn])
        starts = np.cumsum(every) - every
        self.length = np.zeros((len(self.drawn), steps), dtype=np.int64)
        self.start = np.zeros((len(self.drawn), steps), dtype=np.int64)
        at = 0
        for i, n in enumerate(self.count.tolist()):
            self.length[i, :n], self.start[i, :n] = every[at:at + n], starts[at:at + n]
            at += n
        self.flat = np.concatenate([d[0] for d in self.drawn])
        self.widest = int(self.length.max(initial=0))
        # the clients' samples, client after client, and each drawn position as a place among them
        splits = [r.batches.client.splits[r.batches.split] for r in self.reqs]
        offsets = np.cumsum([0] + [len(p) for p in splits])
        self.samples = np.concatenate(splits)
        self.local = np.concatenate([off + d[2] for off, d in zip(offsets.tolist(), self.drawn)])

    @functools.cached_property
    def _pool(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, bool]:
        """(inputs, labels, the index into them of every drawn position, converted to float): the clients'
        samples converted once (a sample is drawn once an epoch) when they fit in `prefetch`; else the
        pooled data, each block converted as it is gathered. `to_float` is elementwise, so both give the
        same floats."""
        s = self.reqs[0].batches
        x, y = s.client.x, s.client.y
        if len(self.samples) * 4 * max(1, int(np.prod(x.shape[1:]))) > self.prefetch:
            return x, y, self.flat, False
        at = torch.as_tensor(self.samples, dtype=torch.long, device=y.device)
        return to_float(x.index_select(0, at), s.client.meta), y.index_select(0, at), self.local, True

    def _steps(self, step: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(inputs, labels) of every client's batch at the steps of the block holding ``step`` (steps,
        clients, then the widest batch, each padded by repeating its first sample), and the block's first
        step; gathered when ``step`` is past the block held."""
        if self._block is None or not self._block[0] <= step < self._block[1]:
            s = self.reqs[0].batches
            row = 4 * max(1, int(np.prod(s.client.x.shape[1:])))  # float32 bytes of one sample
            k = max(1, self.prefetch // max(1, row * len(self.drawn) * self.widest))
            end = min(step + k, self.length.shape[1])
            first, n = self.start[:, step:end].T[..., None], self.length[:, step:end].T[..., None]
            cols = np.arange(self.widest)
            px, py, where, converted = self._pool
            at = torch.as_tensor(where[np.where(cols < n, first + cols, first)], dtype=torch.long, device=py.device)
            flat = at.flatten()  # index_select: ~25x faster than x[flat] on the CPU for a uint8 image pool
            x = px.index_select(0, flat)
            x = x if converted else to_float(x, s.client.meta)
            x, y = x.view(*at.shape, *x.shape[1:]), py.index_select(0, flat).view(at.shape)
            if s.device is not None:
                x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
            self._block = (step, end, x, y)
        return self._block[2], self._block[3], self._block[0]

    def batch(self, i: int, step: int) -> Batch:
        """Client ``i``'s batch number ``step`` (StopIteration past its last)."""
        if self.pos[i] is None:
            return next(self.reqs[i].batches)
        if step >= len(self.pos[i]):
            raise StopIteration
        s = self.reqs[i].batches
        return s.client.take(self.pos[i][step], s.device)

    def gather(self, idx: list[int], step: int, pad: int = 0) -> Batch:
        """The stacked batches ``step`` of the clients ``idx`` (pooled), taken from the block (`_steps`). Equal
        sizes, or each padded to ``pad`` samples by repeating its first (masked out by `_client_losses`)."""
        x, y, first = self._steps(step)
        x, y = x[step - first], y[step - first]
        n = pad or int(self.length[idx[0], step])
        if len(idx) != len(self.drawn):  # some clients only (others have finished, or another size)
            sel = torch.as_tensor(idx, dtype=torch.long, device=x.device)
            x, y = x.index_select(0, sel), y.index_select(0, sel)
        if n < x.shape[1]:
            x, y = x[:, :n].contiguous(), y[:, :n].contiguous()
        return x, y

    def restart(self, live: list[int], got: dict[int, Batch], step: int) -> None:
        """Give each live client its batches from ``step`` on (``got``: those drawn from a stream at that
        step), for the ordinary loop in its thread."""
        for i in live:
            r = self.reqs[i]
            if self.pos[i] is not None:
                s = r.batches
                r.batches = (s.client.take(p, s.device) for p in self.pos[i][step:])
            elif i in got:
                r.batches = itertools.chain([got[i]], r.batches)


def _by_size(live: list[int], got: dict[int, Batch]) -> list[list[int]]:
    """The live clients grouped by the shapes of their current batch (first-seen order)."""
    groups: dict[tuple, list[int]] = {}
    for i in live:
        groups.setdefault((tuple(got[i][0].shape), tuple(got[i][1].shape)), []).append(i)
    return list(groups.values())


def _draw(src: Source, live: list[int], step: int) -> dict[int, Batch]:
    """The next batch of each live client; a stream that fails sets its request's error."""
    got = {}
    for i in live:
        try:
            got[i] = src.batch(i, step)
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 - the client's own failure, raised in its thread
            src.reqs[i].error = e
    return got


def pooled_steps(src: Source, live: list[int], step: int, pad: bool) -> tuple[list[int], list[tuple]]:
    """(the clients still training, ``(clients, stacked batches, real sizes or None)`` per size) at ``step``,
    gathered from the pool; ``pad``: every size in one stack, the short batches padded (`paddable`)."""
    live = [i for i, more in zip(live, (src.count[live] > step).tolist()) if more]
    counts = src.length[live, step].tolist() if live else []
    if pad and live:
        return live, [(live, src.gather(live, step, max(counts)), counts)]
    groups: dict[int, list[int]] = {}
    for i, n in zip(live, counts):
        groups.setdefault(n, []).append(i)
    return live, [(idx, src.gather(idx, step), None) for idx in groups.values()]


def loose_steps(src: Source, live: list[int], step: int) -> tuple[list[int], list[tuple[list[int], Batch]], dict]:
    got = _draw(src, live, step)
    live = [i for i in live if i in got]
    return live, [(idx, (torch.stack([got[i][0] for i in idx]), torch.stack([got[i][1] for i in idx])), None)
                  for idx in _by_size(live, got)], got
