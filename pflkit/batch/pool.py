"""Calls run in turn: one after another in this process, or ``jobs`` at a time in worker processes (experiments,
each with its share of the machine's cores) or threads (notebooks, each of which runs its own kernel process)."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from typing import Callable, Iterator

from pflkit.batch.outcomes import Outcome


def _worker_threads(threads: int) -> None:
    """A batch worker process: this many intra-op threads and cores for the round engine, so that
    ``jobs`` workers share the machine's cores instead of each taking all of them."""
    import torch  # only a worker process needs it, not the process that plans the batch

    os.environ["PFLKIT_CPUS"] = str(threads)
    torch.set_num_threads(threads)


def in_turn(calls: list[tuple[Callable[[], Outcome], str]], jobs: int, *, processes: bool, ordered: bool = False,
            started: Callable[[str], None] | None = None, threads: int | None = None,
            in_process: bool = True) -> Iterator[Outcome]:
    """The outcomes of ``calls`` (``(call, label)``), one after another (``jobs == 1``) or ``jobs`` at a time:
    experiments in worker processes (``processes``; each with ``threads`` intra-op threads, default cores / jobs),
    notebooks in threads (each runs its own kernel process). ``in_process=False``: worker processes even for one
    job or one call. Outcomes come as they finish, or in the calls' order with ``ordered``."""
    if in_process and (jobs == 1 or len(calls) <= 1):
        for call, label in calls:
            if started is not None:
                started(label)
            yield call()
        return
    if processes:
        threads = threads or max(1, (os.cpu_count() or 1) // jobs)
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_threads, initargs=(threads,))
    else:
        pool = ThreadPoolExecutor(jobs)
    with pool:
        futures = [pool.submit(call) for call, _ in calls]
        if ordered:
            for f in futures:
                yield f.result()
            return
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futures.index):
                yield f.result()
