"""Where a vectorized round's client threads meet: their `local_sgd` calls run together.

`run_together` runs each client's update (any algorithm code) in a thread of its own, kept across
rounds (`_Workers`); every `pflkit.fl.train.local_sgd` call in those threads hands its plan and batch
stream to a `Rendezvous` (through `pflkit.fl.train.SGD_OFFLOAD`) and waits. When every client thread
is waiting or finished, the calling thread runs the waiting plans together
(`pflkit.fl.vectorized.run_plans`) and wakes the threads, which go on with their update. Plans that
cannot be batched (`pflkit.fl.batchable.why_not`) run in their own thread with the ordinary loop.
"""
from __future__ import annotations

import contextvars
import logging
import queue
import threading
from functools import partial
from typing import Any, Callable, Iterator

from pflkit.fl.batchable import why_not
from pflkit.fl.train import SGD_OFFLOAD, Batch, SGDPlan
from pflkit.fl.vectorized import Request, run_plans

log = logging.getLogger(__name__)

__all__ = ["Rendezvous", "run_together"]


class Rendezvous:
    """Where the client threads of a vectorized round hand over their `local_sgd` calls.

    `offload` (a client thread) queues a call and waits; `serve` (the calling thread) runs the
    queued calls together whenever every live client thread is waiting, until all have left. Each
    client waits on its own request's event and the server is woken only when its turn has come: a
    condition shared by all woke every waiting thread at every arrival (N^2 wake-ups a round, each
    taking the GIL).
    """

    def __init__(self, threads: int, note: Callable[[str], None]):
        self._cond = threading.Condition()
        self._live, self._pending = threads, []
        self._note = note

    def offload(self, plan: SGDPlan, batches: Iterator[Batch]):
        """`pflkit.fl.train.SGD_OFFLOAD` of a client thread: ``(stats, batches)``, stats None to run it there."""
        why = why_not(plan)
        if why:
            self._note(why)
            return None, batches
        req = Request(plan, batches)
        with self._cond:
            self._pending.append(req)
            self._wake()
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.stats, req.batches

    def leave(self) -> None:
        """A client thread has finished (or failed)."""
        with self._cond:
            self._live -= 1
            self._wake()

    def _turn(self) -> bool:
        return self._live == 0 or len(self._pending) == self._live

    def _wake(self) -> None:
        """Wake the server if its turn has come (holding the condition's lock)."""
        if self._turn():
            self._cond.notify()

    def serve(self) -> None:
        """Run the queued calls each time every live thread waits; return when all threads have left."""
        while True:
            with self._cond:
                self._cond.wait_for(self._turn)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                run_plans(batch, self._note)
            finally:
                for r in batch:
                    r.done.set()


class _Workers:
    """Client threads kept across rounds: starting 50 threads a round took about 1 ms each (other threads
    holding the GIL), about a fifth of the host's time in a round of the host workload
    (benchmarks/vectorized.py --workload host). Every call handed over gets a thread
    of its own (one that is free, or a new one): a client waits for the others inside `local_sgd`, so
    they must all run at once."""

    def __init__(self):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = self._started = 0

    def _loop(self) -> None:
        while True:
            task, after = self._tasks.get()
            try:
                task()
            except BaseException:  # noqa: BLE001 - a task hands its errors over itself; never lose the thread
                log.exception("a vectorized client thread's task failed")
            finally:
                with self._lock:
                    self._free += 1
                after()  # free before the caller hears of it: its next round finds this thread free

    def submit(self, tasks: list[Callable[[], None]], after: Callable[[], None]) -> None:
        """Run each of ``tasks`` in a thread of its own (each task handles its own errors), then ``after``."""
        with self._lock:
            new = max(0, len(tasks) - self._free)
            self._free += new - len(tasks)
            first, self._started = self._started, self._started + new
        for i in range(new):
            threading.Thread(target=self._loop, daemon=True, name=f"pflkit-vclient-{first + i}").start()
        for task in tasks:
            self._tasks.put((task, after))


_WORKERS = _Workers()


def run_together(calls: list[Callable[[], Any]], note: Callable[[str], None]) -> list[tuple[Any, BaseException | None]]:
    """Run ``calls`` (one per client) in threads whose `local_sgd` calls are batched; ``(result, error)``
    of each, in order. Each thread runs in a copy of the caller's context (the kernel backend...)."""
    meet = Rendezvous(len(calls), note)
    outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)

    def body(i: int, call: Callable[[], Any]) -> None:
        SGD_OFFLOAD.set(meet.offload)
        try:
            outcomes[i] = (call(), None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, in the clients' order
            outcomes[i] = (None, e)

    _WORKERS.submit([partial(contextvars.copy_context().run, body, i, call) for i, call in enumerate(calls)],
                    after=meet.leave)
    meet.serve()  # returns once every call has left, its outcome set
    return outcomes
