"""Which Flower node serves which pflkit client: `NodeMap`, learned from each node's ``partition-id``.

A node reports its partition when asked (the ClientApp's ``query`` handler). At start-up
the server waits up to ``node-wait`` seconds for every partition to get a node, asking each
node as soon as it connects and waiting for its answer as long as the wait lasts: a node
that is slow to start (a Ray actor, a ClientApp process importing torch, a dataset being
read) is still mapped. Clients still without a node after that are recorded as failed,
with the reason `NodeMap.absent` gives, whenever they are sampled or evaluated. A node that
claims a partition another node held (a SuperNode restarted after a crash gets a new node id)
takes it over: the newest claim wins and the old node is never addressed again.
"""
from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from pflkit.flower.client_app import HEADER
from pflkit.flower.failures import one_line

log = logging.getLogger(__name__)


class NodeMap:
    """pflkit client id <-> Flower node id, learned from each node's ``partition-id``."""

    def __init__(self, num_clients: int):
        self.num_clients = num_clients
        self.node_of: dict[int, int] = {}
        self.cid_of: dict[int, int] = {}
        self.waited: float = 0.0  # how long the start-up wait let nodes connect (for the reasons given)
        self.silent: set[int] = set()  # nodes that connected but have not reported their partition

    @property
    def unmapped(self) -> list[int]:
        return [c for c in range(self.num_clients) if c not in self.node_of]

    def absent(self, cid: int) -> str:
        """Why client ``cid`` has no node: the one-line reason its failures record."""
        if not self.waited:
            return f"no node holds partition {cid}"
        silent = f"; {len(self.silent)} connected node(s) never reported a partition" if self.silent else ""
        return f"no node with partition-id {cid} connected within {self.waited:g} s{silent}"

    def refresh(self, grid: Grid, timeout: float | None = None, wait: float = 0.0) -> None:
        """Ask nodes not mapped yet for their partition (a query waits ``timeout`` s).

        With ``wait`` > 0 (start-up) keep looking for new nodes and asking silent ones until
        every partition has a node or ``wait`` s have passed; a query then waits for what is
        left of ``wait``, so a slow but healthy node (Ray actor or ClientApp process starting,
        dataset loading) is mapped, not declared missing.
        """
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            self._query(grid, timeout if wait <= 0 else max(left, 0.05))
            if not self.unmapped or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if wait > 0:
            self.waited = max(self.waited, wait)
            if self.unmapped:
                log.warning("no Flower node for partitions %s connected within %g s: those clients are reported "
                            "as failed whenever they are sampled", self.unmapped, wait)

    def _query(self, grid: Grid, timeout: float | None) -> None:
        new = [n for n in grid.get_node_ids() if n not in self.cid_of]
        if not new:
            return
        self.silent.update(new)
        msgs = [Message(RecordDict({HEADER: ConfigRecord({})}), dst_node_id=n, message_type="query") for n in new]
        for rep in grid.send_and_receive(msgs, timeout=timeout):
            node = rep.metadata.src_node_id
            self.silent.discard(node)
            if rep.has_error():  # e.g. no partition-id in its node config: a restarted node gets a new id
                log.warning("node %s did not report its partition: %s", node, one_line(rep.error.reason))
                self.cid_of[node] = -1
                continue
            pid = int(rep.content[HEADER]["partition-id"])
            if not 0 <= pid < self.num_clients:
                log.warning("node %s holds partition %d, outside 0..%d: ignored", node, pid, self.num_clients - 1)
                self.cid_of[node] = -1  # asked once is enough (also for the errors above)
                continue
            stale = self.node_of.get(pid, node)
            if stale != node:  # a restarted SuperNode has a new id: the newest claim wins, the old node is forgotten
                log.warning("partition-id %d: node %s takes over from node %s", pid, node, stale)
                self.cid_of[stale] = -1
            self.node_of[pid], self.cid_of[node] = node, pid
        log.info("Flower nodes: %d of %d clients mapped", len(self.node_of), self.num_clients)
