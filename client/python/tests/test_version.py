# SPDX-License-Identifier: MIT
"""kvtier.version() is the release of the loaded libkvtier, the one kvtierd and kvtierctl print."""
from __future__ import annotations

import re
import subprocess

import kvtier
from conftest import tool


def test_version_matches_daemon_ctl_and_package():
    v = kvtier.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v), v
    for prog in ("daemon/kvtierd", "tools/kvtierctl/kvtierctl"):
        out = subprocess.run([str(tool(prog)), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
        assert out.split()[1] == v, (prog, out)
    # the package's own version is written in pyproject.toml and __init__.py: it must follow
    assert kvtier.__version__ == v
