"""A Flower deployment on this machine, as separate processes on 127.0.0.1 only: one SuperLink, one
SuperNode per partition and ``flwr run`` (the README's "Running on Flower" commands, with free ports and
a temporary Flower home). Every process started is recorded with its descendants (Flower's SuperLink and
SuperNodes start detached helper processes) and ended by PID; every wait is bounded.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

HOST = "127.0.0.1"  # loopback only: nothing here listens on or talks to another address
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(done, timeout: float, what: str, every: float = 0.1) -> None:
    """Poll ``done()`` until it is true; a `TimeoutError` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


# Flower 1.42 has no option for the heartbeat interval: a SuperNode sends its own (the constant
# HEARTBEAT_DEFAULT_INTERVAL, 30 s) and the SuperLink marks it offline after 2 intervals without one
# (about a minute). A node started through this wrapper sends Flower's minimum accepted interval
# instead (set before Flower's modules copy the constant), so its death is noticed within ~20 s.
SHORT_HEARTBEAT = 10.0
_SUPERNODE_WITH_INTERVAL = (
    "import sys; import flwr.common.constant as c; c.HEARTBEAT_DEFAULT_INTERVAL = float(sys.argv[1]); "
    "from flwr.supernode.cli import flower_supernode; sys.argv = ['flower-supernode', *sys.argv[2:]]; "
    "sys.exit(flower_supernode())")


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {HOST}:{port} after {timeout:g} s")


class Deployment:
    """SuperLink + SuperNodes in ``work`` (logs, Flower home, state folders); use as a context manager."""

    def __init__(self, work: Path, nodes: int, data_root: str = ""):
        self.work, self.num_nodes, self.data_root = Path(work), nodes, data_root
        self.home = self.work / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PFLKIT_OFFLINE": "1",
                    "PYTHONUNBUFFERED": "1"}  # logs (the run id flwr run prints) as they are written
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: set[int] = set()  # everything started, descendants included, to end by PID

    # ------------------------------------------------------------------ processes

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = proc
        self.pids.add(proc.pid)
        return proc

    def _remember_descendants(self) -> None:
        for proc in list(self.procs.values()):
            try:
                self.pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass

    def superlink(self) -> None:
        """``flower-superlink --insecure --host 127.0.0.1 --port P --disable-runtime-dependency-installation``."""
        self._start("superlink", [str(BIN / "flower-superlink"), "--insecure", "--host", HOST, "--port",
                                  str(self.port), "--disable-runtime-dependency-installation"])
        wait_for_port(self.port, 60)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{HOST}:{self.port}"\ninsecure = true\n')

    def supernode(self, i: int, long_running: bool = False, heartbeat: float | None = None) -> None:
        """``flower-supernode --insecure --superlink 127.0.0.1:P --port Q --node-config "partition-id=I ..."``.

        The state folder is ``work/stateI`` whenever node ``i`` starts (a restart reads it back).
        ``heartbeat``: the node's heartbeat interval in s (>= 10; default Flower's 30), see `SHORT_HEARTBEAT`.

        ``long_running``: ``--isolation process`` with a ``flwr-clientapp`` beside it. Flower 1.42's
        ``flwr-clientapp`` refuses to start without ``--token`` / ``--token-file`` (one token per app
        execution), so it cannot serve every message from one process: left off by default."""
        config = (f"partition-id={i} num-partitions={self.num_nodes} state-dir='{self.work / f'state{i}'}' "
                  f"num-cpus=1" + (f" data-root='{self.data_root}'" if self.data_root else ""))
        port = free_port()
        command = ([str(BIN / "flower-supernode")] if heartbeat is None else
                   [sys.executable, "-c", _SUPERNODE_WITH_INTERVAL, str(heartbeat)])
        self._start(f"supernode{i}", [*command, "--insecure", "--superlink", f"{HOST}:{self.port}", "--port",
                                      str(port), "--node-config", config,
                                      *(["--isolation", "process"] if long_running else [])])
        if long_running:
            wait_for_port(port, 60)
            self._start(f"clientapp{i}", [str(BIN / "flwr-clientapp"), "--insecure", "--runtime-api-address",
                                          f"{HOST}:{port}"])

    def busy(self, i: int) -> bool:
        """SuperNode ``i`` is running a ClientApp (a ``flwr-clientapp`` child: a message in progress)."""
        try:
            kids = psutil.Process(self.procs[f"supernode{i}"].pid).children(recursive=True)
        except (KeyError, psutil.NoSuchProcess):
            return False
        for kid in kids:
            try:
                if any("flwr-clientapp" in part for part in kid.cmdline()):
                    self.pids.add(kid.pid)
                    return True
            except psutil.NoSuchProcess:
                continue
        return False

    def kill_node(self, i: int) -> None:
        """SuperNode ``i`` crashes (with its ClientApp process)."""
        for name in (f"supernode{i}", f"clientapp{i}"):
            if name in self.procs:
                self.kill(name)

    def kill(self, name: str) -> None:
        """End process ``name`` and its descendants by PID (SIGKILL: a crash, not a shutdown)."""
        proc = self.procs.pop(name)
        try:
            family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = [proc.pid]
        self.pids.update(family)
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)

    def start_run(self, run_config: str, name: str = "run") -> subprocess.Popen:
        """``flwr run . local --run-config "..." --stream`` in the background, its output in ``name.log``."""
        return self._start(name, [str(BIN / "flwr"), "run", str(REPO), "local", "--run-config", run_config,
                                  "--stream"])

    def run_id(self, name: str, timeout: float = 60) -> int:
        """The run id ``flwr run`` printed ("Successfully started run ID") in ``name.log``."""
        found: list[int] = []

        def printed() -> bool:
            m = re.search(r"started run (\d+)", self.log(name))
            found.extend([int(m.group(1))] if m else [])
            return bool(m)

        wait_until(printed, timeout, f"{name}: the run id")
        return found[0]

    def stop_run(self, run_id: int, timeout: float = 120) -> subprocess.CompletedProcess:
        """``flwr stop RUN_ID local``: the SuperLink stops the run (its ServerApp ends mid-stage)."""
        argv = [str(BIN / "flwr"), "stop", str(run_id), "local"]
        return subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout)

    def finish(self, name: str, timeout: float) -> int:
        """Wait (at most ``timeout`` s) for process ``name`` to end; its exit code."""
        try:
            return self.procs[name].wait(timeout=timeout)
        finally:
            self._remember_descendants()

    def flwr_run(self, run_config: str, timeout: float) -> subprocess.CompletedProcess:
        """``flwr run . local --run-config "..." --stream`` from the repository, bounded by ``timeout``."""
        argv = [str(BIN / "flwr"), "run", str(REPO), "local", "--run-config", run_config, "--stream"]
        proc = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.pids.add(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._remember_descendants()
            proc.kill()
            out, _ = proc.communicate(timeout=30)
            raise TimeoutError(f"flwr run did not end within {timeout:g} s:\n{out[-3000:]}")
        finally:
            self._remember_descendants()
        return subprocess.CompletedProcess(argv, proc.returncode, out)

    def close(self) -> None:
        """End every process started (and each one's descendants) by its PID: TERM, then KILL."""
        self._remember_descendants()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        alive = [pid for pid in self.pids if psutil.pid_exists(pid)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in alive if _running(pid)]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def flower_cli_available() -> bool:
    return all((BIN / name).exists() or shutil.which(name) for name in ("flower-superlink", "flower-supernode", "flwr"))
