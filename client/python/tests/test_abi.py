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
from kvtier import abi as _abi
from conftest import PYTHON, REPO, build_dir

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def compile_c(tmp_path: Path, name: str, src: str, shared: bool = False,
              link_kvtier: bool = False) -> Path:
    """Compile @src against kvtier.h; @link_kvtier links the libkvtier the package loaded."""
    assert CC, "no C compiler (cc) on PATH: the ABI probe needs one"
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    out = tmp_path / (f"lib{name}.so" if shared else name)
    flags = ["-shared", "-fPIC"] if shared else []
    libs: list[str] = []
    if link_kvtier:
        lib = Path(kvtier.LIBRARY_PATH if "/" in kvtier.LIBRARY_PATH
                   else build_dir() / "client" / "libkvtier.so.0").resolve()
        libs = [str(lib), f"-Wl,-rpath,{lib.parent}"]
    # kvtier.h includes "kvtier/kvt_abi.h", the installed layout: lay proto/kvt_abi.h out so.
    inc = tmp_path / "include" / "kvtier"
    inc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "proto" / "kvt_abi.h", inc / "kvt_abi.h")
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", *flags,
                        "-I", str(REPO / "client" / "include"), "-I", str(tmp_path / "include"),
                        "-I", str(REPO / "proto"),
                        "-o", str(out), str(c), *libs], capture_output=True, text=True)
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
        for field in fields(py):
            lines.append(f'printf("{cname} {field} %zu %zu\\n", '
                         f"offsetof(struct {cname}, {field}), "
                         f"sizeof(((struct {cname} *)0)->{field}));")
    for name in _abi.CONSTANTS:
        lines.append(f'printf("const {name} %lld\\n", (long long)({name}));')
    for args in MACRO_ARGS["KVT_RETIER_OUT_SIZE"] + MACRO_ARGS["KVT_TOPK_OUT_SIZE"]:
        name = "KVT_RETIER_OUT_SIZE" if len(args) == 1 else "KVT_TOPK_OUT_SIZE"
        a = ", ".join(map(str, args))
        lines.append(f'printf("macro {name} {",".join(map(str, args))} %lld\\n", '
                     f"(long long){name}({a}));")
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


MACRO_ARGS = {"KVT_RETIER_OUT_SIZE": [(0,), (1,), (4096,)],
              "KVT_TOPK_OUT_SIZE": [(1, 1), (8, 100), (64, 4096)]}
MACRO_PY = {"KVT_RETIER_OUT_SIZE": _abi.retier_out_size,
            "KVT_TOPK_OUT_SIZE": _abi.topk_out_size}


def fields(py) -> list[str]:
    """The field names of a mirror, anonymous unions expanded to their members (C reaches
    them as the struct's own fields)."""
    out = []
    for name, t in py._fields_:
        if name in getattr(py, "_anonymous_", ()):
            out += [n for n, _ in t._fields_]
        else:
            out.append(name)
    return out


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
        if kind == "macro":
            args = tuple(int(x) for x in vals[0].split(","))
            assert MACRO_PY[name](*args) == int(vals[1]), f"{name}{args}: C says {vals[1]}"
            checked += 1
            continue
        py = _abi.STRUCTS[kind]
        if name == ".":
            assert ctypes.sizeof(py) == int(vals[0]), f"sizeof(struct {kind})"
        else:
            f = getattr(py, name)
            assert (f.offset, f.size) == (int(vals[0]), int(vals[1])), f"{kind}.{name}"
        checked += 1
    nfields = sum(len(fields(s)) + 1 for s in _abi.STRUCTS.values())
    nmacros = sum(len(v) for v in MACRO_ARGS.values())
    assert checked == nfields + len(_abi.CONSTANTS) + nmacros


PREP_CALLS = [
    ("nop", ()), ("seq_open", (4096,)), ("seq_close", (3,)), ("append", (3, 64, 2048, 2)),
    ("append_t0", (3, 128, 5)), ("score_add", (3, 17, 256, 9)), ("seq_stat", (3, 512)),
    ("retier", (3, 1024, 8264)), ("fetch", (3, _abi.FETCH_F_T1 | _abi.FETCH_F_T2, 1, 2, 4,
                                             64, 30)),
    ("fetch", (3, _abi.FETCH_F_LIST, 0, 3, 0, 64, 7)),
    ("topk", (3, 256)),
    ("seq_open_prefix", (4096, 2, 7)), ("ns_open", (512,)), ("ns_close", (3,)),
    ("lookup", (2, _abi.LOOKUP_F_PIN, 64, 9)), ("publish", (5, 128, 4)),
]


def every_prep_call() -> list[tuple[str, tuple[int, ...]]]:
    """PREP_CALLS, plus each prep helper kvtier.h has (PREP_ARGTYPES, generated) with distinct
    small arguments: a helper added later is compared without an entry here."""
    auto = []
    for cname, argtypes in _abi.PREP_ARGTYPES.items():
        args = tuple(3 + 5 * i for i in range(len(argtypes) - 1))
        auto.append((cname.removeprefix("kvt_prep_"), args))
    return PREP_CALLS + auto


def test_prep_helpers_fill_what_kvtier_h_fills(tmp_path):
    """Each Sqe.prep_*() (libkvtier's exported copy) leaves the 64 bytes the inline
    kvt_prep_*() leaves (user_data and stamp aside), starting from an entry full of garbage."""
    calls = every_prep_call()
    assert {n for n, _ in calls} >= {c.removeprefix("kvt_prep_") for c in _abi.PREP_ARGTYPES}
    lines = ['#include <stdio.h>', '#include <string.h>', '#include "kvtier.h"',
             "static void dump(const struct kvt_sqe *e) {",
             "const unsigned char *b = (const void *)e;",
             'for (size_t i = 0; i < sizeof(*e); i++) printf("%02x", b[i]);',
             'printf("\\n"); }', "int main(void) { struct kvt_sqe e;"]
    for name, args in calls:
        a = "".join(f", {x}" for x in args)
        lines.append(f"memset(&e, 0xa5, sizeof(e)); e.user_data = 0; e.stamp = 0; "
                     f"kvt_prep_{name}(&e{a}); dump(&e);")
    lines += ["return 0; }"]
    exe = compile_c(tmp_path, "prep_probe", "\n".join(lines) + "\n")
    want = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert len(want) == len(calls)
    for (name, args), hexdump in zip(calls, want):
        e = _abi.Sqe.from_buffer_copy(b"\xa5" * 64)
        e.user_data = e.stamp = 0
        getattr(e, f"prep_{name}")(*args)
        assert bytes(e).hex() == hexdump, f"prep_{name}{args}"


def test_header_structs_are_all_mirrored():
    """A struct added to kvt_abi.h or kvtier.h that a call takes needs a mirror here."""
    text = (REPO / "proto" / "kvt_abi.h").read_text() + (
        REPO / "client" / "include" / "kvtier.h").read_text()
    import re
    defined = set(re.findall(r"^struct (kvt_\w+) \{", text, re.M))
    shared_memory_only = {"kvt_ring_hdr", "kvt_region_hdr"}  # libkvtier's, never the caller's
    assert defined - shared_memory_only <= set(_abi.STRUCTS), defined - set(_abi.STRUCTS)


def test_default_socket_is_kvt_abi_h_s():
    """The Python client connects where kvtierd listens by default: the one definition is
    KVT_DEFAULT_SOCKET in kvt_abi.h."""
    import re
    m = re.search(r'^#define KVT_DEFAULT_SOCKET "([^"]+)"',
                  (REPO / "proto" / "kvt_abi.h").read_text(), re.M)
    assert m, "KVT_DEFAULT_SOCKET is not defined in proto/kvt_abi.h"
    assert _abi.DEFAULT_SOCKET == m.group(1)


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


def test_abi_py_is_generated_from_the_headers():
    """kvtier/abi.py is what tools/gen-pyabi.py derives from the headers now: an opcode, flag,
    constant, struct field or prep helper added to the C side reaches Python by rerunning it,
    and a stale mirror fails here."""
    r = subprocess.run([PYTHON, str(REPO / "tools" / "gen-pyabi.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_constants_are_enums_and_flags():
    from enum import IntEnum, IntFlag

    assert isinstance(_abi.OP_TOPK, IntEnum) and _abi.OP_TOPK is _abi.Op.TOPK
    assert _abi.Op(7) is _abi.Op.TOPK and _abi.Op.TOPK.name == "TOPK"
    assert isinstance(_abi.TOPK_F_UNION, IntFlag)
    both = _abi.TopkFlag.UNION | _abi.TopkFlag.FETCH
    assert both == 3 and _abi.TopkFlag.FETCH in both
    assert _abi.TopkMode.PROBE == 3 and _abi.Dtype.F32 == 2 and _abi.Policy.FULL == 3
    # the raw names stay reachable where they were, outside the public surface
    assert kvtier.TOPK_F_FAST is _abi.TopkFlag.FAST and "TOPK_F_FAST" not in kvtier.__all__
    from kvtier import _abi as old

    assert old.Sqe is _abi.Sqe and old.OP_TOPK is _abi.Op.TOPK


def test_gen_pyabi_refuses_what_it_cannot_mirror(tmp_path):
    """A header construct the generator does not understand stops it with a reason, never a
    silently wrong mirror."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_pyabi", REPO / "tools" / "gen-pyabi.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    h = tmp_path / "x.h"
    h.write_text("struct kvt_x {\n\tvoid *p;\n};\n")
    with pytest.raises(gen.ParseError, match="kvt_x.p"):
        gen.Abi().parse(h)
    h.write_text("struct kvt_y {\n\talignas(64) uint32_t a;\n};\n")
    with pytest.raises(gen.ParseError, match="kvt_y"):
        gen.Abi().parse(h)
