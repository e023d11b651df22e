#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write client/python/kvtier/abi.py, the Python mirror of the C ABI, from the headers.

    tools/gen-pyabi.py            rewrite abi.py
    tools/gen-pyabi.py --check    exit 1 if abi.py is not what the headers give (a test runs it)

The ABI is described once, in proto/kvt_abi.h, proto/kvt_ctl.h and client/include/kvtier.h.
From them this script derives, mechanically:
  - every ``#define KVT_*`` integer and every enum member, as a module constant without the
    ``KVT_`` prefix (``OP_TOPK``, ``MAX_LAYERS``); enums as ``IntEnum`` classes (``Op``,
    ``Dtype``, ``TopkMode``), the ``KVT_<FAMILY>_F_*`` bits as ``IntFlag`` classes
    (``TopkFlag``, ``FetchFlag``);
  - every struct as a ``ctypes.Structure`` (anonymous unions as in the C);
  - the signature of every ``kvt_prep_*()`` helper, as ``Sqe.prep_*()`` methods that call the
    out-of-line copies libkvtier exports (client/ffi.c): the helpers' bodies are not
    re-implemented in Python.
The headers follow the contract tier's rules (fixed-width types, one declaration per line),
which keeps this parser small; anything it does not understand stops it with an error rather
than a wrong mirror. tests/test_abi.py checks the output against a compiled probe.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADERS = [ROOT / "proto" / "kvt_abi.h", ROOT / "proto" / "kvt_ctl.h",
           ROOT / "client" / "include" / "kvtier.h"]
OUT = ROOT / "client" / "python" / "kvtier" / "abi.py"

CTYPES = {
    "uint8_t": "c_uint8", "uint16_t": "c_uint16", "uint32_t": "c_uint32", "uint64_t": "c_uint64",
    "int8_t": "c_int8", "int16_t": "c_int16", "int32_t": "c_int32", "int64_t": "c_int64",
    "float": "c_float", "double": "c_double", "char": "c_char", "unsigned": "c_uint",
    "int": "c_int", "const char *": "c_char_p",
}
# Python names where the plain CamelCase would be unclear or taken by the high-level layer.
STRUCT_NAMES = {"kvt_retier_result": "RetierResultC", "kvt_seq_stat": "SeqStatC"}
ENUM_NAMES = {"SCORE": "ScoreMode", "CTL": "CtlType", "BUF": "BufKind"}


class ParseError(Exception):
    pass


def camel(s: str) -> str:
    return "".join(w[:1].upper() + w[1:].lower() for w in s.split("_") if w)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return text.replace("\\\n", " ")


def c_int_expr(expr: str, known: dict[str, int]) -> int | None:
    """The value of a C integer constant expression of literals and known KVT_ names."""
    e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU])\b", r"\1", expr.strip())
    if not e or re.search(r"[^\w\s()+\-*/<>|&~^]", e):
        return None
    names = set(re.findall(r"[A-Za-z_]\w*", e))
    if any(n not in known for n in names if not re.fullmatch(r"0x[0-9a-fA-F]+", n)):
        return None
    e = e.replace("/", "//")
    try:
        v = eval(e, {"__builtins__": {}}, dict(known))  # noqa: S307 - literals and names only
    except Exception:
        return None
    return v if isinstance(v, int) else None


class Abi:
    def __init__(self) -> None:
        self.consts: dict[str, int] = {}  # KVT_NAME -> value, in header order
        self.strings: dict[str, str] = {}
        self.enums: list[tuple[str, str, list[tuple[str, int]]]] = []  # class, prefix, members
        self.enum_of: dict[str, str] = {}  # KVT_NAME -> class
        self.flags: dict[str, list[tuple[str, int]]] = {}  # class -> (member, value)
        self.flag_of: dict[str, str] = {}
        self.structs: list[tuple[str, str, list]] = []  # C name, class, fields
        self.struct_class: dict[str, str] = {}
        self.preps: list[tuple[str, list[tuple[str, str]]]] = []  # name, [(param, ctype)]
        self.ctl_tables: dict[str, list[tuple]] = {}  # "clients" -> X() rows; "status" too

    # ---- pieces of a header, in order ----
    def parse(self, path: Path) -> None:
        text = strip_comments(path.read_text())
        pos = 0
        pat = re.compile(r"^#define[ \t]+(KVT_\w+)(?!\()[ \t]+([^\n]+)$|"
                         r"^enum\s*(\w*)\s*\{(.*?)\}\s*;|"
                         r"^struct\s+(kvt_\w+)\s*\{(.*?)\n\}\s*;|"
                         r"^KVT_INLINE\s+void\s+(kvt_prep_\w+)\(([^)]*)\)|"
                         r"^#define[ \t]+KVT_CTL_(\w+?)_(?:COLS|LINES)\(X\)[ \t]+([^\n]+)$",
                         re.M | re.S)
        for m in pat.finditer(text, pos):
            if m.group(1):
                self.define(m.group(1), m.group(2).strip())
            elif m.group(4) is not None:
                self.enum(m.group(3), m.group(4), path)
            elif m.group(5):
                self.struct(m.group(5), m.group(6), path)
            elif m.group(7):
                self.prep(m.group(7), m.group(8))
            elif m.group(9):
                self.ctl_table(m.group(9).lower(), m.group(10))

    def define(self, name: str, value: str) -> None:
        s = re.fullmatch(r'"([^"]*)"', value)
        if s:
            self.strings[name] = s.group(1)
            return
        v = c_int_expr(value, self.consts)
        if v is None:
            return  # not an integer constant (a type, an attribute, a function-like use)
        self.consts[name] = v
        f = re.fullmatch(r"KVT_(\w+?)_F_(\w+)", name)
        if f and v > 0 and v & (v - 1) == 0:
            cls = camel(f.group(1)) + "Flag"
            self.flags.setdefault(cls, []).append((f.group(2), v))
            self.flag_of[name] = cls

    def ctl_table(self, name: str, body: str) -> None:
        rows = []
        for x in re.findall(r"X\(([^)]*)\)", body):
            parts = [p.strip() for p in x.split(",")]
            row = []
            for p in parts:
                if re.fullmatch(r'"[^"]*"', p):
                    row.append(p[1:-1])
                elif re.fullmatch(r"\d+", p):
                    row.append(int(p))
                elif re.fullmatch(r"[A-Z]+", p):
                    row.append(p.lower())
                else:
                    raise ParseError(f"KVT_CTL_{name.upper()}: {x!r}")
            rows.append(tuple(row))
        if not rows:
            raise ParseError(f"KVT_CTL_{name.upper()}: no X() rows")
        self.ctl_tables[name] = rows

    def enum(self, tag: str, body: str, path: Path) -> None:
        members: list[tuple[str, int]] = []
        nxt = 0
        for item in (x.strip() for x in body.split(",")):
            if not item:
                continue
            m = re.fullmatch(r"(KVT_\w+)\s*(?:=\s*(.+))?", item, re.S)
            if not m:
                raise ParseError(f"{path.name}: enum member {item!r}")
            v = nxt if m.group(2) is None else c_int_expr(m.group(2), self.consts)
            if v is None:
                raise ParseError(f"{path.name}: enum value {item!r}")
            self.consts[m.group(1)] = v
            members.append((m.group(1), v))
            nxt = v + 1
        names = [n for n, _ in members if "__" not in n]
        parts = [n.split("_") for n in names]
        common = []
        for ws in zip(*parts):
            if len(set(ws)) != 1:
                break
            common.append(ws[0])
        if len(names) == 1:  # a lone member: its family is all but the last word
            common = parts[0][:-1]
        if tag:
            cls = camel(tag.removeprefix("kvt_"))
            prefix = "_".join(common) + "_"
        else:
            if len(common) < 2:
                raise ParseError(f"{path.name}: enum {names} has no common KVT_<FAMILY>_")
            prefix = "_".join(common) + "_"
            fam = "_".join(common[1:])
            cls = ENUM_NAMES.get(fam, camel(fam))
        mem = [(n[len(prefix):], v) for n, v in members if "__" not in n]
        self.enums.append((cls, prefix, mem))
        for n, _ in members:
            if "__" not in n:
                self.enum_of[n] = cls

    def ctype(self, t: str, where: str) -> str:
        t = " ".join(t.split())
        if t in CTYPES:
            return CTYPES[t]
        m = re.fullmatch(r"struct (kvt_\w+)", t)
        if m and m.group(1) in self.struct_class:
            return self.struct_class[m.group(1)]
        raise ParseError(f"{where}: type {t!r}")

    def fields(self, cname: str, cls: str, body: str, unions: list) -> list:
        out = []
        i = 0
        body = body.strip()
        while i < len(body):
            rest = body[i:].lstrip()
            i = len(body) - len(rest)
            if not rest:
                break
            if rest.startswith("union"):
                o = body.index("{", i)
                c = body.index("}", o)
                if "{" in body[o + 1:c]:
                    raise ParseError(f"{cname}: nested union")
                members = self.fields(cname, cls, body[o + 1:c], unions)
                semi = body.index(";", c)
                first = members[0][0]
                ucls = f"_{cls}{camel(first)}"
                unions.append((ucls, members))
                out.append((f"_{first}", ucls, True))
                i = semi + 1
                continue
            semi = body.index(";", i)
            decl = " ".join(body[i:semi].split())
            i = semi + 1
            if "alignas" in decl or "(" in decl:
                raise ParseError(f"{cname}: {decl!r}")
            m = re.fullmatch(r"((?:const )?(?:struct )?\w+(?: \*)?)\s*(\*?)\s*(.+)", decl)
            if not m:
                raise ParseError(f"{cname}: {decl!r}")
            base = m.group(1) + (" *" if m.group(2) else "")
            for d in (x.strip() for x in m.group(3).split(",")):
                a = re.fullmatch(r"(\w+)\s*(?:\[(.+)\])?", d)
                if not a:
                    raise ParseError(f"{cname}: {decl!r}")
                t = self.ctype(base, f"{cname}.{a.group(1)}")
                if a.group(2):
                    n = c_int_expr(a.group(2), self.consts)
                    if n is None:
                        raise ParseError(f"{cname}.{a.group(1)}: array length {a.group(2)!r}")
                    t = f"{t} * {n}"
                out.append((a.group(1), t, False))
        return out

    def struct(self, cname: str, body: str, path: Path) -> None:
        cls = STRUCT_NAMES.get(cname, camel(cname.removeprefix("kvt_")))
        unions: list = []
        fields = self.fields(cname, cls, body, unions)
        self.struct_class[cname] = cls
        self.structs.append((cname, cls, fields, unions, path.name))

    def prep(self, name: str, params: str) -> None:
        out = []
        for p in (x.strip() for x in params.split(",")):
            m = re.fullmatch(r"(.+?)\s*(\*?)\s*(\w+)", p)
            if not m:
                raise ParseError(f"{name}: parameter {p!r}")
            t = " ".join(m.group(1).split())
            if m.group(2):
                s = re.fullmatch(r"struct (kvt_\w+)", t)
                if not s or s.group(1) not in self.struct_class:
                    raise ParseError(f"{name}: parameter {p!r}")
                out.append((m.group(3), f"ctypes.POINTER({self.struct_class[s.group(1)]})"))
            else:
                out.append((m.group(3), self.ctype(t, f"{name}({m.group(3)})")))
        if not out or out[0][1] != "ctypes.POINTER(Sqe)":
            raise ParseError(f"{name}: the first parameter must be the struct kvt_sqe *")
        self.preps.append((name, out))


def render(abi: Abi) -> str:
    L: list[str] = []
    w = L.append
    w("# SPDX-License-Identifier: MIT")
    w("# Generated by tools/gen-pyabi.py from proto/kvt_abi.h, proto/kvt_ctl.h and")
    w("# client/include/kvtier.h. Do not edit: change the headers and run the script")
    w("# (tests/test_abi.py fails while this file is stale).")
    w('"""The raw kvtier ABI: the wire constants, enums and flags, the ctypes structs, and')
    w("``Sqe.prep_*()``, which call libkvtier's exported kvt_prep_*() helpers.")
    w("")
    w("Every name is the header's without its ``KVT_`` prefix; enums are ``IntEnum`` and the")
    w("``KVT_<FAMILY>_F_*`` bits ``IntFlag`` classes. The high-level client (``kvtier.Client``,")
    w('``Sequence``, ...) is the public surface; this module is for code that drives the ring."""')
    w("from __future__ import annotations")
    w("")
    w("import ctypes")
    w("from ctypes import (c_char, c_char_p, c_double, c_float, c_int, c_int8, c_int16, c_int32,")
    w("                    c_int64, c_uint, c_uint8, c_uint16, c_uint32, c_uint64)")
    w("from enum import IntEnum, IntFlag")
    w("from typing import Any")
    w("")
    w("# ---- enums and flags ----")
    for cls, prefix, mem in abi.enums:
        w("")
        w("")
        w(f"class {cls}(IntEnum):")
        w(f'    """{prefix}* (enum)."""')
        w("")
        for n, v in mem:
            w(f"    {n} = {v}")
    for cls, mem in abi.flags.items():
        w("")
        w("")
        w(f"class {cls}(IntFlag):")
        fam = [n for n, c in abi.flag_of.items() if c == cls][0]
        w(f'    """{fam[:fam.index("_F_") + 3]}* bits."""')
        w("")
        for n, v in mem:
            w(f"    {n} = {v}")
    w("")
    w("")
    w("# ---- constants (every KVT_ name, prefix dropped) ----")
    w("")
    for name, v in abi.consts.items():
        short = name.removeprefix("KVT_")
        if name in abi.enum_of:
            cls = abi.enum_of[name]
            prefix = [p for c, p, _ in abi.enums if c == cls][0]
            w(f"{short} = {cls}.{name[len(prefix):]}")
        elif name in abi.flag_of:
            w(f"{short} = {abi.flag_of[name]}.{name.split('_F_', 1)[1]}")
        else:
            w(f"{short} = {v}")
    for name, v in abi.strings.items():
        w(f"{name.removeprefix('KVT_')} = {v!r}")
    w("")
    w("")
    w("# ---- structs ----")
    for cname, cls, fields, unions, hdr in abi.structs:
        for ucls, members in unions:
            w("")
            w("")
            w(f"class {ucls}(ctypes.Union):")
            w(f"    _fields_ = [{', '.join(f'({n!r}, {t})' for n, t, _ in members)}]")
        w("")
        w("")
        w(f"class {cls}(ctypes.Structure):")
        w(f'    """struct {cname} ({hdr})."""')
        w("")
        anon = [n for n, _, a in fields if a]
        if anon:
            w(f"    _anonymous_ = ({', '.join(repr(n) for n in anon)},)")
        w("    _fields_ = [")
        for n, t, _ in fields:
            w(f"        ({n!r}, {t}),")
        w("    ]")
        if cname == "kvt_sqe":
            for pname, params in abi.preps:
                args = [p for p, _ in params[1:]]
                sig = "".join(f", {a}: int" for a in args)
                call = "".join(f", {a}" for a in args)
                w("")
                head = f"    def {pname.removeprefix('kvt_')}(self{sig}) -> None:"
                if len(head) > 99:
                    head = (f"    def {pname.removeprefix('kvt_')}(\n        self"
                            + "".join(f",\n        {a}: int" for a in args) + ",\n    ) -> None:")
                w(head)
                w(f'        """{pname}() (kvtier.h), libkvtier\'s exported copy."""')
                line = f"        _prep({pname!r})(self{call})"
                if len(line) > 99:
                    line = f"        _prep({pname!r})(\n            self{call},\n        )"
                w(line)
    w("")
    w("")
    w("# ---- the prep helpers libkvtier exports (client/ffi.c) ----")
    w("")
    w("PREP_ARGTYPES: dict[str, list[Any]] = {")
    for pname, params in abi.preps:
        w(f"    {pname!r}: [{', '.join(t for _, t in params)}],")
    w("}")
    w('"""kvt_prep_*() -> its ctypes argument types (kvtier.h)."""')
    w("_PREP_FNS: dict[str, Any] = {}")
    w("")
    w("")
    w("def _prep(name: str) -> Any:")
    w('    """libkvtier\'s @name, declared (the library is loaded on first use)."""')
    w("    fn = _PREP_FNS.get(name)")
    w("    if fn is None:")
    w("        from . import _lib")
    w("")
    w("        fn = _PREP_FNS[name] = _lib.prep_function(name)")
    w("    return fn")
    w("")
    w("")
    w("def retier_out_size(t0_slots: int) -> int:")
    w('    """KVT_RETIER_OUT_SIZE(): bytes that always hold a RETIER answer."""')
    w("    return ctypes.sizeof(RetierResultC) + t0_slots * 2 * ctypes.sizeof(SlotChange)")
    w("")
    w("")
    w("def topk_out_size(kv_heads: int, stride: int) -> int:")
    w('    """KVT_TOPK_OUT_SIZE(): bytes of a TOPK answer."""')
    w("    return kv_heads * 4 + kv_heads * stride * 8")
    w("")
    w("")
    w("STRUCTS: dict[str, type[ctypes.Structure]] = {")
    for cname, cls, *_ in abi.structs:
        w(f"    {cname!r}: {cls},")
    w("}")
    w('"""C struct name -> its mirror, for the layout probe."""')
    w("")
    w("CONSTANTS: dict[str, int] = {")
    for name in abi.consts:
        w(f"    {name!r}: {name.removeprefix('KVT_')},")
    w("}")
    w('"""C macro or enum name -> its value here, for the layout probe."""')
    w("")
    w("CTL_STATUS_LINES: list[tuple[str, str, str]] = [")
    for row in abi.ctl_tables.pop("status"):
        w(f"    {row!r},")
    w("]")
    w('"""kvtierctl status: (label, key path, kind) per line (KVT_CTL_STATUS_LINES)."""')
    w("")
    w("CTL_COLUMNS: dict[str, list[tuple[str, str, str, int]]] = {")
    for name, rows in abi.ctl_tables.items():
        w(f"    {name!r}: [")
        for row in rows:
            w(f"        {row!r},")
        w("    ],")
    w("}")
    w('"""kvtierctl clients|seqs|blocks: (heading, key, kind, index) per column')
    w('(KVT_CTL_*_COLS)."""')
    return "\n".join(L) + "\n"


def generate() -> str:
    abi = Abi()
    for h in HEADERS:
        abi.parse(h)
    return render(abi)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    a = ap.parse_args()
    try:
        text = generate()
    except ParseError as e:
        print(f"gen-pyabi: cannot mirror {e}: keep the headers to the contract tier's rules "
              "or teach tools/gen-pyabi.py the new form", file=sys.stderr)
        return 2
    if a.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"gen-pyabi: {OUT.relative_to(ROOT)} is stale: run tools/gen-pyabi.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
