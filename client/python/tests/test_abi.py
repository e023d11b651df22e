# SPDX-License-Identifier: MIT
"""The struct mirrors against the C headers (a compiled probe), the ABI check at import, and
how the library is found."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import kvtier
from kvtier import _abi
from conftest import PYTHON, REPO, build_dir

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def compile_c(tmp_path: Path, name: str, src: str, shared: bool = False) -> Path:
    assert CC, "no C compiler (cc) on PATH: the ABI probe needs one"
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    out = tmp_path / (f"lib{name}.so" if shared else name)
    flags = ["-shared", "-fPIC"] if shared else []
    # kvtier.h includes "kvtier/kvt_abi.h", the installed layout: lay proto/kvt_abi.h out so.
    inc = tmp_path / "include" / "kvtier"
    inc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "proto" / "kvt_abi.h", inc / "kvt_abi.h")
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", *flags,
                        "-I", str(REPO / "client" / "include"), "-I", str(tmp_path / "include"),
                        "-I", str(REPO / "proto"),
                        "-o", str(out), str(c)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def probe_source() -> str:
    """A C program printing sizeof, and offsetof and size of every field, of each mirrored
    struct, and the value of each mirrored constant, generated from the mirrors themselves so
    a field added to one side only fails."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "kvtier.h"',
             '#include "kvt_ctl.h"', "int main(void) {"]
    for cname, py in _abi.STRUCTS.items():
        lines.append(f'printf("{cname} . %zu\\n", sizeof(struct {cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname} {field} %zu %zu\\n", '
                         f"offsetof(struct {cname}, {field}), "
                         f"sizeof(((struct {cname} *)0)->{field}));")
    for name in _abi.CONSTANTS:
        lines.append(f'printf("const {name} %lld\\n", (long long)({name}));')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_struct_layouts_match_the_c_headers(tmp_path):
    exe = compile_c(tmp_path, "abi_probe", probe_source())
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    checked = 0
    for line in out.splitlines():
        kind, name, *vals = line.split()
        if kind == "const":
            assert _abi.CONSTANTS[name] == int(vals[0]), f"{name}: C says {vals[0]}"
            checked += 1
            continue
        py = _abi.STRUCTS[kind]
        if name == ".":
            assert ctypes.sizeof(py) == int(vals[0]), f"sizeof(struct {kind})"
        else:
            f = getattr(py, name)
            assert (f.offset, f.size) == (int(vals[0]), int(vals[1])), f"{kind}.{name}"
        checked += 1
    fields = sum(len(s._fields_) + 1 for s in _abi.STRUCTS.values())
    assert checked == fields + len(_abi.CONSTANTS)


def test_header_structs_are_all_mirrored():
    """A struct added to kvt_abi.h or kvtier.h that a call takes needs a mirror here."""
    text = (REPO / "proto" / "kvt_abi.h").read_text() + (
        REPO / "client" / "include" / "kvtier.h").read_text()
    import re
    defined = set(re.findall(r"^struct (kvt_\w+) \{", text, re.M))
    shared_memory_only = {"kvt_ring_hdr", "kvt_region_hdr"}  # libkvtier's, never the caller's
    assert defined - shared_memory_only <= set(_abi.STRUCTS), defined - set(_abi.STRUCTS)


def test_every_exported_call_is_declared():
    """Every kvt_* the library exports (nm -D) is reachable from Python."""
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed"
    out = subprocess.run([nm, "-D", "--defined-only", kvtier.LIBRARY_PATH if "/" in
                          kvtier.LIBRARY_PATH else str(build_dir() / "client" /
                                                       "libkvtier.so.0")],
                         capture_output=True, text=True, check=True).stdout
    exported = {ln.split()[-1].split("@")[0] for ln in out.splitlines() if " T kvt_" in ln}
    lib = kvtier.core._LIB
    undeclared = {n for n in exported if getattr(lib, n).argtypes is None}
    assert exported and not undeclared, undeclared


def run_import(env_extra: dict[str, str], python_env: dict[str, str]) -> subprocess.CompletedProcess:
    env = dict(python_env)
    env.pop("KVTIER_LIB", None)
    env.update(env_extra)
    return subprocess.run([PYTHON, "-c", "import kvtier; print(kvtier.LIBRARY_PATH)"],
                          capture_output=True, text=True, env=env, timeout=120)


def test_abi_major_mismatch_fails_import_clearly(tmp_path, python_env):
    """A libkvtier of another ABI major (a real shared library reporting 2.3) is refused at
    import with a message that names both ABIs and the way out."""
    lib = compile_c(tmp_path, "kvtier_abi2", textwrap.dedent("""
        #include <stdint.h>
        __attribute__((visibility("default"))) uint32_t kvt_abi_version(void)
        { return 2u << 16 | 3u; }
    """), shared=True)
    r = run_import({"KVTIER_LIB": str(lib)}, python_env)
    assert r.returncode != 0
    assert "LibraryError: ABI mismatch" in r.stderr
    assert "ABI 2.3" in r.stderr and "ABI 1" in r.stderr and "KVTIER_LIB" in r.stderr


def test_library_without_version_query_is_refused(tmp_path, python_env):
    lib = compile_c(tmp_path, "notkvtier", "int kvt_other(void) { return 0; }\n", shared=True)
    r = run_import({"KVTIER_LIB": str(lib)}, python_env)
    assert r.returncode != 0 and "no kvt_abi_version()" in r.stderr


def test_missing_library_names_what_was_tried(tmp_path, python_env):
    r = run_import({"KVTIER_LIB": str(tmp_path / "nope.so")}, python_env)
    assert r.returncode != 0
    assert "libkvtier not found" in r.stderr and str(tmp_path / "nope.so") in r.stderr


def test_lookup_uses_kvt_build_dir_without_kvtier_lib(python_env):
    b = build_dir()
    r = run_import({"KVT_BUILD_DIR": str(b)}, python_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(b / "client" / "libkvtier.so.0")


def test_lookup_falls_back_to_the_checkout_build(python_env):
    from kvtier import _lib
    import os
    saved = {k: os.environ.pop(k, None) for k in ("KVTIER_LIB", "KVT_BUILD_DIR")}
    try:
        cands = _lib.candidates()
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    assert cands == [str(REPO / "build" / "client" / "libkvtier.so.0"), "libkvtier.so.0"]
