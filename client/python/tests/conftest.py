# SPDX-License-Identifier: MIT
"""Fixtures for the kvtier Python tests: a real kvtierd per test (host backend, 256 MiB pool).

``kvtierd`` yields a Kvtierd with ``.socket``, ``.pid``, ``.ctl(args)`` (runs kvtierctl against
it); ``kvtierd_factory`` starts more (extra daemon arguments allowed); ``kvtierd_module`` is one
daemon shared by a test module. The daemon and kvtierctl come from the build tree of the
libkvtier the package loaded (or $KVT_BUILD_DIR); a missing binary fails the test, it never
skips it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import kvtier
from kvtier import ctl as kvtier_ctl

REPO = Path(__file__).resolve().parents[3]
"""The checkout the tests live in."""


def build_dir() -> Path:
    """The build tree whose kvtierd and kvtierctl match the loaded libkvtier."""
    env = os.environ.get("KVT_BUILD_DIR")
    if env:
        return Path(env)
    lib = Path(kvtier.LIBRARY_PATH)
    if lib.is_absolute() and (lib.resolve().parent.parent / "daemon" / "kvtierd").exists():
        return lib.resolve().parent.parent
    return REPO / "build"


def tool(rel: str) -> Path:
    """A built program under the build tree; fails loudly when it is not there."""
    p = build_dir() / rel
    if not os.access(p, os.X_OK):
        raise RuntimeError(f"{p} is missing: build the tree first (cmake --build {build_dir()})"
                           " or set KVT_BUILD_DIR")
    return p


class Kvtierd:
    """A kvtierd started for a test, in a private runtime directory."""

    def __init__(self, extra: list[str] | None = None, pool_size: str = "256M") -> None:
        # A short directory: socket paths are limited to 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="kvtpy."))
        self.socket: str = str(self.dir / "kvtierd.sock")
        """The control socket path."""
        self.log = self.dir / "kvtierd.log"
        self._logf = open(self.log, "wb")
        args = [str(tool("daemon/kvtierd")), "--config", "/dev/null", "--socket", self.socket,
                "--backend", "host", "--pool-size", pool_size, *(extra or [])]
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT)
        self.pid: int = self.proc.pid
        """The daemon's process id."""
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a measurement
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtierd exited with {self.proc.returncode}:\n"
                                   + self.log.read_text(errors="replace"))
            try:
                kvtier_ctl.request(self.socket, ["status"], timeout=5)
                break
            except kvtier_ctl.CtlError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError("kvtierd did not answer STATUS:\n"
                                       + self.log.read_text(errors="replace"))
                time.sleep(0.05)

    def ctl(self, args: list[str] | str, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``kvtierctl --socket SOCKET ARGS``; the CompletedProcess (text). With @check a
        non-zero exit raises AssertionError with its stderr."""
        argv = args.split() if isinstance(args, str) else list(args)
        r = subprocess.run([str(tool("tools/kvtierctl/kvtierctl")), "--socket", self.socket,
                            *argv], capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"kvtierctl {' '.join(argv)} exited {r.returncode}: "
                                 f"{r.stderr}")
        return r

    def doc(self, kind: str) -> dict:
        """The daemon's STATUS, CLIENTS or SEQS document ("status", "clients", "seqs")."""
        return kvtier_ctl.request(self.socket, [kind])[kind]

    def wait_sessions(self, n: int) -> int:
        """Wait until the daemon counts @n sessions (it sees a client's hangup a moment after
        the client leaves); returns the count it ended with, after at most a minute."""
        deadline = time.monotonic() + 60
        while True:
            got = self.doc("status")["sessions"]
            if got == n or time.monotonic() > deadline:
                return got
            time.sleep(0.01)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send @sig to the daemon (SIGKILL: it is gone without cleaning up)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(timeout=60)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status (0: a clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode

    def close(self) -> int:
        rc = self.stop()
        self._logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


@pytest.fixture
def kvtierd_factory() -> Iterator[Callable[..., Kvtierd]]:
    """A function that starts a kvtierd (``extra``: more daemon arguments); each one is stopped
    after the test, and one that was not killed by the test must stop cleanly."""
    started: list[tuple[Kvtierd, bool]] = []

    def start(extra: list[str] | None = None, pool_size: str = "256M") -> Kvtierd:
        d = Kvtierd(extra, pool_size)
        started.append((d, True))
        return d

    yield start
    for d, _ in started:
        crashed = d.proc.poll()
        log = d.log.read_text(errors="replace")
        rc = d.close()
        if crashed is None:
            assert rc == 0, f"kvtierd exited {rc} on SIGTERM:\n{log}"


@pytest.fixture
def kvtierd(kvtierd_factory: Callable[..., Kvtierd]) -> Kvtierd:
    """A fresh kvtierd for one test."""
    return kvtierd_factory()


@pytest.fixture(scope="module")
def kvtierd_module() -> Iterator[Kvtierd]:
    """One kvtierd shared by the tests of a module."""
    d = Kvtierd()
    yield d
    log = d.log.read_text(errors="replace")
    rc = d.close()
    assert rc == 0, f"kvtierd exited {rc} on SIGTERM:\n{log}"


@pytest.fixture
def python_env() -> dict[str, str]:
    """Environment for a child Python that imports this kvtier with the same libkvtier."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "client" / "python"), *filter(None, [env.get("PYTHONPATH")])])
    env["KVTIER_LIB"] = kvtier.LIBRARY_PATH
    return env


PYTHON = sys.executable
"""The interpreter running the tests (child processes use it too)."""


@pytest.fixture(scope="session")
def gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF tools/fetch-model.sh fetches (or finds) and prints."""
    r = subprocess.run(["sh", str(REPO / "tools" / "fetch-model.sh")], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail(f"tools/fetch-model.sh failed ({r.returncode}): {r.stderr}")
    return r.stdout.strip().splitlines()[-1]


def load_lm(path: str):
    """(model, tokenizer) from the GGUF at @path through transformers' gguf support, eager
    attention, one torch thread (the test machines share their cores, and processes that
    compare rows must run the same arithmetic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    d, f = path.rsplit("/", 1)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation="eager")
    model.eval()
    return model, tok


@pytest.fixture(scope="session")
def lm(gguf_path: str):
    """(model, tokenizer), loaded once per test session (load_lm())."""
    return load_lm(gguf_path)
