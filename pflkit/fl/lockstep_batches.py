"""The batches of a vectorized group's clients, step by step (`pflkit.fl.vectorized`).

Each client's batch stream (`pflkit.fl.train.BatchStream`) draws its batches from its own generator.
Where the stream allows it (`positions`), the positions of all its batches are drawn up front with
the same generator calls, so a step's batches of many clients are one index op on the pooled
tensors (`Source.gather`), padded to one size where the group allows it; other streams are drawn
one batch at a time and stacked, clients with batches of another size in subgroups.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import torch

from pflkit.data.base import to_float
from pflkit.fl.train import Batch, BatchStream

__all__ = ["positions", "Source", "pooled_steps", "loose_steps"]


def positions(stream: Iterator[Batch]) -> list[np.ndarray] | None:
    """The pooled positions of every batch ``stream`` (a `BatchStream`) would yield, drawn now by the same
    generator calls (`Client.batches` / `Client.random_batch`), so that many clients' batches can be
    gathered together; None when it cannot say (a stream already started, augmentation, which draws
    from the generator between batches, or data not held in one tensor). The stream is then spent."""
    if not isinstance(stream, BatchStream) or stream.started:
        return None
    c, g, size = stream.client, stream.generator, stream.batch_size
    if (stream.augment and c.augment != "none") or not isinstance(c.x, torch.Tensor):
        return None
    idx = c.splits[stream.split]
    if stream.steps > 0:
        out = [idx[torch.randperm(len(idx), generator=g, device="cpu")[: min(size, len(idx))].numpy()]
               for _ in range(stream.steps)]
    else:
        out = []
        for _ in range(stream.epochs):
            order = idx[torch.randperm(len(idx), generator=g, device="cpu").numpy()]
            out.extend(order[s:s + size] for s in range(0, len(order), size))
    stream._it = iter(())
    return out


class Source:
    """Where the clients of a group get their batches: positions drawn up front (`positions`) where
    the streams allow it, gathered for many clients with one index op; else the streams themselves."""

    def __init__(self, reqs: list):
        self.reqs = reqs
        self.pos = [positions(r.batches) for r in reqs]
        first = reqs[0].batches
        self.pooled = all(p is not None for p in self.pos) and all(
            r.batches.client.x is first.client.x and r.batches.client.y is first.client.y
            and r.batches.client.meta == first.client.meta and r.batches.device == first.device for r in reqs)
        if self.pooled:
            self._table()

    def _table(self) -> None:
        """Every client's positions in one array (``flat``, client after client, batch after batch), with
        the start and length of client ``i``'s batch ``s`` at ``start[i, s]`` / ``length[i, s]`` and its
        number of batches ``count[i]``: a step's index matrix for many clients is then a few array ops,
        not a concatenate per client (`gather`)."""
        lengths = [[len(b) for b in p] for p in self.pos]
        self.count = np.array([len(l) for l in lengths], dtype=np.int64)
        steps = int(self.count.max(initial=0))
        every = np.fromiter(itertools.chain.from_iterable(lengths), dtype=np.int64)
        starts = np.cumsum(every) - every
        self.length = np.zeros((len(self.pos), steps), dtype=np.int64)
        self.start = np.zeros((len(self.pos), steps), dtype=np.int64)
        at = 0
        for i, n in enumerate(self.count.tolist()):
            self.length[i, :n], self.start[i, :n] = every[at:at + n], starts[at:at + n]
            at += n
        batches = [b for p in self.pos for b in p]
        self.flat = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)

    def batch(self, i: int, step: int) -> Batch:
        """Client ``i``'s batch number ``step`` (StopIteration past its last)."""
        if self.pos[i] is None:
            return next(self.reqs[i].batches)
        if step >= len(self.pos[i]):
            raise StopIteration
        s = self.reqs[i].batches
        return s.client.take(self.pos[i][step], s.device)

    def gather(self, idx: list[int], step: int, pad: int = 0) -> Batch:
        """The stacked batches ``step`` of the clients ``idx`` (pooled): one index op on the pool. Equal
        sizes, or each padded to ``pad`` samples by repeating its first (masked out by `_client_losses`)."""
        s = self.reqs[idx[0]].batches
        first, n = self.start[idx, step][:, None], self.length[idx, step][:, None]
        cols = np.arange(pad or int(n[0, 0]))
        rows = self.flat[np.where(cols < n, first + cols, first)]
        at = torch.as_tensor(rows, dtype=torch.long, device=s.client.y.device)
        x = to_float(s.client.x[at.flatten()], s.client.meta)
        x, y = x.view(*at.shape, *x.shape[1:]), s.client.y[at]
        if s.device is not None:
            x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
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
