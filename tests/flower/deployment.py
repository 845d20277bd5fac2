"""A Flower deployment on this machine, as separate processes on 127.0.0.1 only: one SuperLink, one
SuperNode per partition and ``flwr run`` (the README's "Running on Flower" commands, with free ports and
a temporary Flower home). Every process started is recorded with its descendants (Flower's SuperLink and
SuperNodes start detached helper processes) and ended by PID; every wait is bounded.
"""
from __future__ import annotations

import os
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
                    "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PFLKIT_OFFLINE": "1"}
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

    def supernode(self, i: int, long_running: bool = False) -> None:
        """``flower-supernode --insecure --superlink 127.0.0.1:P --port Q --node-config "partition-id=I ..."``.

        ``long_running``: ``--isolation process`` with a ``flwr-clientapp`` beside it. Flower 1.42's
        ``flwr-clientapp`` refuses to start without ``--token`` / ``--token-file`` (one token per app
        execution), so it cannot serve every message from one process: left off by default."""
        config = (f"partition-id={i} num-partitions={self.num_nodes} state-dir='{self.work / f'state{i}'}' "
                  f"num-cpus=1" + (f" data-root='{self.data_root}'" if self.data_root else ""))
        port = free_port()
        self._start(f"supernode{i}", [str(BIN / "flower-supernode"), "--insecure", "--superlink",
                                      f"{HOST}:{self.port}", "--port", str(port), "--node-config", config,
                                      *(["--isolation", "process"] if long_running else [])])
        if long_running:
            wait_for_port(port, 60)
            self._start(f"clientapp{i}", [str(BIN / "flwr-clientapp"), "--insecure", "--runtime-api-address",
                                          f"{HOST}:{port}"])

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
