# SPDX-License-Identifier: MIT
"""The Python example of README.md runs as written against a live kvtierd."""
from __future__ import annotations

import re
import subprocess

from conftest import PYTHON, REPO


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python\n", 1)
    assert len(section) == 2, 'README.md has no "## Python" section'
    m = re.search(r"```python\n(.*?)```", section[1].split("\n## ", 1)[0], re.S)
    assert m, 'the "Python" section of README.md has no ```python example'
    return m.group(1)


def test_readme_python_example_runs(kvtierd, python_env, tmp_path):
    src = tmp_path / "example.py"
    src.write_text(readme_example())
    python_env["KVTIER_SOCKET"] = kvtierd.socket
    r = subprocess.run([PYTHON, str(src)], capture_output=True, text=True, env=python_env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "is in T0 slot" in r.stdout and "SeqStat(" in r.stdout
    assert kvtierd.wait_sessions(0) == 0  # it disconnected
