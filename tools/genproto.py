#!/usr/bin/env python3
"""genproto: generate herd's wire codec from Kafka's JSON message schemas.

Reads ``../shared/kafka-spec/messages/*.json`` and ``records/*.json`` (Kafka's own message
definitions) and ``errors.tsv``, and writes:

* ``protocol/messages.py``: one class per struct and, for every version of every message, a
  decoder and an encoder specialised to that version: consecutive fixed-width fields are read and
  written with one precompiled ``struct.Struct``, nothing is interpreted per field at run time.
  It also carries ``SCHEMA``: the schema facts it was generated from (fields, types, version
  ranges, defaults) as plain data, so tests can build independent oracles without ../shared.
* ``protocol/errors.py``: Kafka's error codes.

Usage: ``python -m tools.genproto [--spec DIR] [--out DIR]`` (defaults: ../shared/kafka-spec and
this repository's protocol/).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import keyword
import os
import pprint
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO.parent / "shared" / "kafka-spec"

# The message files herd generates code for (request/response pairs, headers, data structs).
FIXED = {
    # type: (struct format char, size)
    "int8": ("b", 1), "int16": ("h", 2), "int32": ("i", 4), "int64": ("q", 8),
    "uint16": ("H", 2), "uint32": ("I", 4), "float64": ("d", 8), "bool": ("?", 1),
    "uuid": ("16s", 16),
}
PRIMITIVES = set(FIXED) | {"string", "bytes", "records"}


# --------------------------------------------------------------------------------------------
# schema model
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Versions:
    lo: int
    hi: int | None  # None: open-ended

    @staticmethod
    def parse(text: str | None) -> Versions | None:
        if text is None:
            return None
        text = text.strip()
        if text == "none":
            return None
        if text.endswith("+"):
            return Versions(int(text[:-1]), None)
        if "-" in text:
            a, b = text.split("-")
            return Versions(int(a), int(b))
        return Versions(int(text), int(text))

    def __contains__(self, v: int) -> bool:
        return v >= self.lo and (self.hi is None or v <= self.hi)

    def as_tuple(self):
        return (self.lo, self.hi)


def contains(vs: Versions | None, v: int) -> bool:
    return vs is not None and v in vs


def snake(name: str) -> str:
    s = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()
    if keyword.iskeyword(s):
        s += "_"
    return s


@dataclass
class Field:
    name: str
    py: str
    type: str  # as written in the schema, e.g. "[]int32", "string", "JoinGroupRequestProtocol"
    versions: Versions | None
    nullable: Versions | None
    tag: int | None
    tagged: Versions | None
    default: object  # the raw JSON value (string, number or None)
    ignorable: bool
    flexible: Versions | None | str  # "inherit" or an override range
    struct: Struct | None = None

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def elem_is_struct(self) -> bool:
        return self.elem not in PRIMITIVES


@dataclass
class Struct:
    name: str  # Kafka's name
    py: str  # Python class name (unique in the module)
    fields: list[Field] = field(default_factory=list)


@dataclass
class Message:
    name: str
    kind: str  # request, response, header, data
    api_key: int | None
    valid: Versions
    flexible: Versions | None
    root: Struct
    structs: list[Struct]
    source: str


def strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        i, in_str = 0, False
        while i < len(line):
            c = line[i]
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                line = line[:i]
                break
            i += 1
        out.append(line)
    return "\n".join(out)


def load_message(path: Path) -> Message:
    spec = json.loads(strip_comments(path.read_text()))
    name = spec["name"]
    kind = spec["type"]
    structs: dict[str, Struct] = {}
    common = {c["name"]: c for c in spec.get("commonStructs", [])}

    def struct_py(sname: str) -> str:
        return sname if sname.startswith(name) else name + sname

    def build_struct(sname: str, fields_json) -> Struct:
        if sname in structs:
            return structs[sname]
        st = Struct(sname, struct_py(sname))
        structs[sname] = st
        st.fields = [build_field(f) for f in fields_json]
        return st

    def build_field(fj) -> Field:
        ftype = fj["type"]
        versions = Versions.parse(fj.get("versions")) if "versions" in fj else Versions.parse(
            fj.get("taggedVersions"))
        flex = fj.get("flexibleVersions", "inherit")
        f = Field(
            name=fj["name"], py=snake(fj["name"]), type=ftype, versions=versions,
            nullable=Versions.parse(fj.get("nullableVersions")),
            tag=fj.get("tag"), tagged=Versions.parse(fj.get("taggedVersions")),
            # Kafka's FieldSpec reads a JSON null default as "no default" (not as "null").
            default="__none__" if fj.get("default") is None else fj["default"],
            ignorable=bool(fj.get("ignorable", False)),
            flexible=flex if flex == "inherit" else Versions.parse(flex),
        )
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        if elem not in PRIMITIVES:
            if "fields" in fj:
                f.struct = build_struct(elem, fj["fields"])
            elif elem in common:
                f.struct = build_struct(elem, common[elem]["fields"])
            elif elem in structs:
                f.struct = structs[elem]
            else:
                raise SystemExit(f"{path.name}: unknown struct type {elem}")
        return f

    root = Struct(name, name)
    structs[name] = root
    root.fields = [build_field(f) for f in spec["fields"]]
    # common structs that no field references are still part of the schema
    for cname, c in common.items():
        build_struct(cname, c["fields"])
    return Message(
        name=name, kind=kind, api_key=spec.get("apiKey"),
        valid=Versions.parse(spec["validVersions"]),
        flexible=Versions.parse(spec.get("flexibleVersions", "none")),
        root=root, structs=list(structs.values()), source=path.name,
    )


# --------------------------------------------------------------------------------------------
# defaults
# --------------------------------------------------------------------------------------------

def default_literal(f: Field) -> str:
    """Python expression for the field's default value (a fresh object for mutable ones)."""
    d = f.default
    if f.is_array:
        return "None" if d in ("null", None) else "[]"
    if f.struct is not None:
        return "None" if d in ("null", None) else f"{f.struct.py}()"
    t = f.type
    if t in ("string",):
        if d in ("null", None):
            return "None"
        return repr("" if d == "__none__" else d)
    if t in ("bytes", "records"):
        if d in ("null", None):
            return "None"
        return "b''" if t == "bytes" else "None"
    if t == "bool":
        return "True" if str(d).lower() == "true" else "False"
    if t == "uuid":
        return "_ZERO_UUID"
    if t == "float64":
        return repr(float(d)) if d != "__none__" else "0.0"
    if d == "__none__":
        return "0"
    return str(int(str(d), 0))


def nondefault_expr(f: Field, x: str) -> str:
    lit = default_literal(f)
    if lit == "None":
        return f"{x} is not None"
    if lit == "[]":
        return f"{x}"
    if f.type in ("bytes",):
        return f"{x}"
    if f.type == "string" and lit == "''":
        return f"{x} != ''"
    return f"{x} != {lit}"


# --------------------------------------------------------------------------------------------
# code emission
# --------------------------------------------------------------------------------------------

class Emitter:
    def __init__(self):
        self.structs: dict[str, str] = {}  # format -> Struct constant name
        self.funcs: list[str] = []
        self.by_body: dict[str, str] = {}  # body hash -> function name (dedupe)

    def st(self, fmt: str) -> str:
        if fmt not in self.structs:
            self.structs[fmt] = f"_S_{len(self.structs)}"
        return self.structs[fmt]

    def add_func(self, name: str, body_lines: list[str], header: str) -> str:
        body = "\n".join(body_lines)
        key = hashlib.sha1((header + "\n" + body).encode()).hexdigest()
        if key in self.by_body:
            return self.by_body[key]
        self.by_body[key] = name
        self.funcs.append(f"def {name}({header}):\n{body}\n")
        return name


def is_compact(f: Field, flexible: bool) -> bool:
    if not flexible:
        return False
    if f.flexible == "inherit":
        return True
    return False if f.flexible is None else True


def null_error(f: Field) -> str:
    return f"raise ProtocolError('non-nullable field {f.py} was serialized as null')"


class Generator:
    def __init__(self, messages: list[Message]):
        self.messages = messages
        self.em = Emitter()
        self.dec_names: dict[tuple[str, int], str] = {}
        self.enc_names: dict[tuple[str, int], str] = {}

    # ---------------- reading ----------------

    def read_len(self, compact: bool, wide: bool, ind: str) -> list[str]:
        """Lines that leave the length (or -1 for null) in ``n``."""
        if compact:
            return [
                f"{ind}n = buf[pos]",
                f"{ind}if n < 128:",
                f"{ind}    pos += 1",
                f"{ind}else:",
                f"{ind}    n, pos = _ruv(buf, pos)",
                f"{ind}n -= 1",
            ]
        s = "_I32" if wide else "_I16"
        w = 4 if wide else 2
        return [f"{ind}n, = {s}.unpack_from(buf, pos)", f"{ind}pos += {w}"]

    def read_value(self, f: Field, elem: str, var: str, v: int, flexible: bool, nullable: bool,
                   ind: str, tagged: bool = False) -> list[str]:
        """Read one value of primitive/struct type ``elem`` into ``var``."""
        compact = is_compact(f, flexible)
        L: list[str] = []
        if elem in FIXED:
            fmt, size = FIXED[elem]
            L.append(f"{ind}{var}, = {self.em.st('>' + fmt)}.unpack_from(buf, pos)")
            L.append(f"{ind}pos += {size}")
            return L
        if elem in ("string", "bytes", "records"):
            L += self.read_len(compact, elem != "string", ind)
            L.append(f"{ind}if n < 0:")
            L.append(f"{ind}    {var} = None" if nullable else f"{ind}    {null_error(f)}")
            L.append(f"{ind}else:")
            if elem == "string" and compact:
                L.append(f"{ind}    if n > 0x7fff:")
                L.append(f"{ind}        raise ProtocolError('string field {f.py} had invalid length %d' % n)")
            L.append(f"{ind}    end = pos + n")
            L.append(f"{ind}    if end > len(buf):")
            L.append(f"{ind}        raise ProtocolError('field {f.py} runs past the end of the buffer')")
            if elem == "string":
                L.append(f"{ind}    {var} = buf[pos:end].decode()")
            else:
                L.append(f"{ind}    {var} = buf[pos:end]")
            L.append(f"{ind}    pos = end")
            return L
        # struct
        st = f.struct
        fn = self.decoder(st, v, flexible)
        # A nullable struct's marker: int8 (-1 null, 1 present), except inside a tagged field,
        # where it is an unsigned varint (0 null, 1 present).
        if nullable:
            if tagged:
                L.append(f"{ind}m = buf[pos]")
            else:
                L.append(f"{ind}m, = _I8.unpack_from(buf, pos)")
            L.append(f"{ind}pos += 1")
            L.append(f"{ind}if {'m == 0' if tagged else 'm < 0'}:")
            L.append(f"{ind}    {var} = None")
            L.append(f"{ind}else:")
            L.append(f"{ind}    {var}, pos = {fn}(buf, pos)")
        else:
            L.append(f"{ind}{var}, pos = {fn}(buf, pos)")
        return L

    def read_field(self, f: Field, v: int, flexible: bool, ind: str, tagged: bool = False) -> list[str]:
        var = f"f_{f.py}"
        nullable = contains(f.nullable, v)
        compact = is_compact(f, flexible)
        if not f.is_array:
            return self.read_value(f, f.elem, var, v, flexible, nullable, ind, tagged)
        L = self.read_len(compact, True, ind)
        L.append(f"{ind}if n < 0:")
        L.append(f"{ind}    {var} = None" if nullable else f"{ind}    {null_error(f)}")
        L.append(f"{ind}else:")
        i2 = ind + "    "
        elem = f.elem
        if elem in FIXED and elem != "uuid":
            fmt, size = FIXED[elem]
            L.append(f"{i2}end = pos + n * {size}")
            L.append(f"{i2}if end > len(buf):")
            L.append(f"{i2}    raise ProtocolError('array {f.py} runs past the end of the buffer')")
            L.append(f"{i2}{var} = list(_unpack_from('>%d{fmt}' % n, buf, pos))")
            L.append(f"{i2}pos = end")
            return L
        L.append(f"{i2}if n > len(buf) - pos:")
        L.append(f"{i2}    raise ProtocolError('array {f.py} has more elements than bytes left')")
        L.append(f"{i2}{var} = []")
        L.append(f"{i2}for _ in range(n):")
        if elem_struct := f.struct:
            fn = self.decoder(elem_struct, v, flexible)
            L.append(f"{i2}    e, pos = {fn}(buf, pos)")
        else:
            # elements of a primitive array are never nullable
            L += self.read_value(f, elem, "e", v, flexible, False, i2 + "    ")
        L.append(f"{i2}    {var}.append(e)")
        return L

    def decoder(self, st: Struct, v: int, flexible: bool) -> str:
        key = (st.py, v)
        if key in self.dec_names:
            return self.dec_names[key]
        name = f"_d_{st.py}_{v}"
        self.dec_names[key] = name  # reserve (recursion is impossible in Kafka schemas)
        ind = "    "
        L: list[str] = []
        present = [f for f in st.fields if contains(f.versions, v)]
        positional = [f for f in present if not (flexible and f.tag is not None and contains(f.tagged, v))]
        tagged = [f for f in present if f not in positional]
        i = 0
        while i < len(positional):
            f = positional[i]
            if not f.is_array and f.type in FIXED:
                group = []
                while i < len(positional) and not positional[i].is_array and positional[i].type in FIXED:
                    group.append(positional[i])
                    i += 1
                fmt = ">" + "".join(FIXED[g.type][0] for g in group)
                size = sum(FIXED[g.type][1] for g in group)
                names = ", ".join(f"f_{g.py}" for g in group)
                if len(group) == 1:
                    names += ","
                L.append(f"{ind}{names} = {self.em.st(fmt)}.unpack_from(buf, pos)")
                L.append(f"{ind}pos += {size}")
                continue
            L += self.read_field(f, v, flexible, ind)
            i += 1
        for f in tagged:
            L.append(f"{ind}f_{f.py} = {default_literal(f)}")
        if flexible:
            L.append(f"{ind}u = None")
            if not tagged:
                L.append(f"{ind}if buf[pos] == 0:")
                L.append(f"{ind}    pos += 1")
                L.append(f"{ind}else:")
                L.append(f"{ind}    u, pos = _read_tagged_fields(buf, pos)")
            else:
                L.append(f"{ind}if buf[pos] == 0:")
                L.append(f"{ind}    pos += 1")
                L.append(f"{ind}else:")
                L.append(f"{ind}    nt, pos = _ruv(buf, pos)")
                L.append(f"{ind}    for _ in range(nt):")
                L.append(f"{ind}        tag, pos = _ruv(buf, pos)")
                L.append(f"{ind}        size, pos = _ruv(buf, pos)")
                L.append(f"{ind}        tend = pos + size")
                L.append(f"{ind}        if tend > len(buf):")
                L.append(f"{ind}            raise ProtocolError('tagged field runs past the end of the buffer')")
                kw = "if"
                for f in sorted(tagged, key=lambda f: f.tag):
                    L.append(f"{ind}        {kw} tag == {f.tag}:")
                    L += self.read_field(f, v, flexible, ind + "            ", tagged=True)
                    L.append(f"{ind}            if pos > tend:")
                    L.append(f"{ind}                raise ProtocolError('tagged field {f.py} overran its size')")
                    kw = "elif"
                L.append(f"{ind}        else:")
                L.append(f"{ind}            if u is None:")
                L.append(f"{ind}                u = []")
                L.append(f"{ind}            u.append((tag, buf[pos:tend]))")
                L.append(f"{ind}        pos = tend")
        args = []
        for f in st.fields:
            args.append(f"f_{f.py}" if f in present else default_literal(f))
        args.append("u" if flexible else "None")
        L.append(f"{ind}return {st.py}({', '.join(args)}), pos")
        real = self.em.add_func(name, L, "buf, pos")
        self.dec_names[key] = real
        return real

    # ---------------- writing ----------------

    def write_len(self, compact: bool, wide: bool, expr: str, ind: str) -> list[str]:
        if compact:
            return [f"{ind}n = {expr} + 1", f"{ind}out += _UV[n] if n < 128 else _uvb(n)"]
        return [f"{ind}out += {'_I32' if wide else '_I16'}.pack({expr})"]

    def write_null(self, compact: bool, wide: bool, ind: str) -> list[str]:
        if compact:
            return [f"{ind}out += b'\\x00'"]
        ff = repr(b"\xff" * (4 if wide else 2))
        return [f"{ind}out += {ff}"]

    def write_value(self, f: Field, elem: str, x: str, v: int, flexible: bool, nullable: bool,
                    ind: str, tagged: bool = False) -> list[str]:
        compact = is_compact(f, flexible)
        L: list[str] = []
        if elem in FIXED:
            fmt, _ = FIXED[elem]
            L.append(f"{ind}out += {self.em.st('>' + fmt)}.pack({x})")
            return L
        if elem in ("string", "bytes", "records"):
            wide = elem != "string"
            L.append(f"{ind}if {x} is None:")
            if nullable:
                L += self.write_null(compact, wide, ind + "    ")
            else:
                L.append(f"{ind}    raise EncodeError('non-nullable field {f.py} is None')")
            L.append(f"{ind}else:")
            b = f"{x}.encode()" if elem == "string" else x
            L.append(f"{ind}    b = {b}")
            if elem == "string" and compact:
                L.append(f"{ind}    if len(b) > 0x7fff:")
                L.append(f"{ind}        raise EncodeError('string field {f.py} is too long')")
            L += self.write_len(compact, wide, "len(b)", ind + "    ")
            L.append(f"{ind}    out += b")
            return L
        fn = self.encoder(f.struct, v, flexible)
        if nullable:
            L.append(f"{ind}if {x} is None:")
            null_marker = repr(b"\x00" if tagged else b"\xff")
            L.append(f"{ind}    out += {null_marker}")
            L.append(f"{ind}else:")
            L.append(f"{ind}    out += b'\\x01'")
            L.append(f"{ind}    {fn}({x}, out)")
        else:
            L.append(f"{ind}if {x} is None:")
            L.append(f"{ind}    raise EncodeError('non-nullable field {f.py} is None')")
            L.append(f"{ind}{fn}({x}, out)")
        return L

    def write_field(self, f: Field, v: int, flexible: bool, ind: str, tagged: bool = False) -> list[str]:
        x = f"o.{f.py}"
        nullable = contains(f.nullable, v)
        compact = is_compact(f, flexible)
        if not f.is_array:
            return self.write_value(f, f.elem, x, v, flexible, nullable, ind, tagged)
        L = [f"{ind}x = {x}", f"{ind}if x is None:"]
        if nullable:
            L += self.write_null(compact, True, ind + "    ")
        else:
            L.append(f"{ind}    raise EncodeError('non-nullable field {f.py} is None')")
        L.append(f"{ind}else:")
        i2 = ind + "    "
        L += self.write_len(compact, True, "len(x)", i2)
        elem = f.elem
        if elem in FIXED and elem != "uuid":
            fmt, _ = FIXED[elem]
            L.append(f"{i2}out += _pack('>%d{fmt}' % len(x), *x)")
            return L
        L.append(f"{i2}for e in x:")
        if f.struct:
            fn = self.encoder(f.struct, v, flexible)
            L.append(f"{i2}    {fn}(e, out)")
        else:
            L += self.write_value(f, elem, "e", v, flexible, False, i2 + "    ")
        return L

    def encoder(self, st: Struct, v: int, flexible: bool) -> str:
        key = (st.py, v)
        if key in self.enc_names:
            return self.enc_names[key]
        name = f"_e_{st.py}_{v}"
        self.enc_names[key] = name
        ind = "    "
        L: list[str] = []
        present = [f for f in st.fields if contains(f.versions, v)]
        positional = [f for f in present if not (flexible and f.tag is not None and contains(f.tagged, v))]
        tagged = [f for f in present if f not in positional]
        # Kafka's ignorable rule: a non-default value in a field this version lacks is an error
        # unless the field is ignorable.
        for f in st.fields:
            if f not in present and not f.ignorable:
                L.append(f"{ind}if {nondefault_expr(f, 'o.' + f.py)}:")
                L.append(f"{ind}    raise EncodeError('field {f.py} cannot be written at version {v}')")
        i = 0
        while i < len(positional):
            f = positional[i]
            if not f.is_array and f.type in FIXED:
                group = []
                while i < len(positional) and not positional[i].is_array and positional[i].type in FIXED:
                    group.append(positional[i])
                    i += 1
                fmt = ">" + "".join(FIXED[g.type][0] for g in group)
                L.append(f"{ind}out += {self.em.st(fmt)}.pack({', '.join('o.' + g.py for g in group)})")
                continue
            L += self.write_field(f, v, flexible, ind)
            i += 1
        if flexible:
            if not tagged:
                L.append(f"{ind}u = o.unknown_tagged_fields")
                L.append(f"{ind}if u:")
                L.append(f"{ind}    _write_tagged_fields(out, u)")
                L.append(f"{ind}else:")
                L.append(f"{ind}    out += b'\\x00'")
            else:
                L.append(f"{ind}tg = []")
                for f in sorted(tagged, key=lambda f: f.tag):
                    L.append(f"{ind}if {nondefault_expr(f, 'o.' + f.py)}:")
                    L.append(f"{ind}    t = bytearray()")
                    body = self.write_field(f, v, flexible, ind + "    ", tagged=True)
                    L += [ln.replace("out +=", "t +=").replace(", out)", ", t)") for ln in body]
                    L.append(f"{ind}    tg.append(({f.tag}, t))")
                L.append(f"{ind}u = o.unknown_tagged_fields")
                L.append(f"{ind}if u:")
                L.append(f"{ind}    tg.extend(u)")
                L.append(f"{ind}if tg:")
                L.append(f"{ind}    _write_tagged_fields(out, tg)")
                L.append(f"{ind}else:")
                L.append(f"{ind}    out += b'\\x00'")
        if not L:
            L.append(f"{ind}pass")
        real = self.em.add_func(name, L, "o, out")
        self.enc_names[key] = real
        return real

    # ---------------- classes ----------------

    def class_code(self, msg: Message, st: Struct) -> str:
        is_root = st is msg.root
        base = "_Message" if is_root else "_Struct"
        slots = [f.py for f in st.fields] + ["unknown_tagged_fields"]
        L = [f"class {st.py}({base}):"]
        L.append(f"    __slots__ = {tuple(slots)!r}")
        L.append(f"    NAME = {st.name!r}")
        L.append(f"    FIELDS = {tuple(f.py for f in st.fields)!r}")
        if is_root:
            L.append(f"    TYPE = {msg.kind!r}")
            L.append(f"    API_KEY = {msg.api_key!r}")
            L.append(f"    MIN_VERSION = {msg.valid.lo}")
            L.append(f"    MAX_VERSION = {msg.valid.hi}")
            L.append(f"    FLEXIBLE_VERSION = {msg.flexible.lo if msg.flexible else None}")
        params = []
        assigns = []
        for f in st.fields:
            lit = default_literal(f)
            if lit in ("[]",) or lit.endswith("()"):
                params.append(f"{f.py}=_UNSET")
                assigns.append(f"        self.{f.py} = {lit} if {f.py} is _UNSET else {f.py}")
            else:
                params.append(f"{f.py}={lit}")
                assigns.append(f"        self.{f.py} = {f.py}")
        params.append("unknown_tagged_fields=None")
        assigns.append("        self.unknown_tagged_fields = unknown_tagged_fields")
        L.append(f"    def __init__(self, {', '.join(params)}):")
        L += assigns
        return "\n".join(L) + "\n"

    def generate(self) -> str:
        classes = []
        tables = []
        for msg in self.messages:
            for st in reversed(msg.structs):
                classes.append(self.class_code(msg, st))
            # decoders/encoders for every version, for every struct reachable at that version
            lo, hi = msg.valid.lo, msg.valid.hi
            dec = []
            enc = []
            for v in range(0, hi + 1):
                if v < lo:
                    dec.append("None")
                    enc.append("None")
                    continue
                flexible = contains(msg.flexible, v)
                dec.append(self.decoder(msg.root, v, flexible))
                enc.append(self.encoder(msg.root, v, flexible))
            tables.append(f"{msg.name}._DEC = ({', '.join(dec)},)")
            tables.append(f"{msg.name}._ENC = ({', '.join(enc)},)")
            for st in msg.structs:
                if st is not msg.root:
                    tables.append(f"{msg.name}.{st.name} = {st.py}")
        parts = [HEADER]
        parts.append("\n".join(f"{n} = _Struct_({fmt!r})" for fmt, n in self.em.structs.items()))
        parts.append("\n\n# ---- classes " + "-" * 80 + "\n")
        parts.append("\n\n".join(classes))
        parts.append("\n# ---- per-version decoders and encoders " + "-" * 55 + "\n")
        parts.append("\n\n".join(self.em.funcs))
        parts.append("\n# ---- dispatch tables " + "-" * 72 + "\n")
        parts.append("\n".join(tables))
        parts.append("\n")
        reqs = {m.api_key: m.name for m in self.messages if m.kind == "request"}
        resps = {m.api_key: m.name for m in self.messages if m.kind == "response"}
        parts.append("REQUESTS = {" + ", ".join(f"{k}: {v}" for k, v in sorted(reqs.items())) + "}")
        parts.append("RESPONSES = {" + ", ".join(f"{k}: {v}" for k, v in sorted(resps.items())) + "}")
        others = [m.name for m in self.messages if m.kind not in ("request", "response")]
        parts.append("DATA = {" + ", ".join(f"{n!r}: {n}" for n in others) + "}")
        parts.append("MESSAGES = {" + ", ".join(f"{m.name!r}: {m.name}" for m in self.messages) + "}")
        parts.append("\n# The schema facts this module was generated from (for test oracles).")
        parts.append("SCHEMA = " + pprint.pformat(self.schema_data(), width=110, sort_dicts=False))
        return "\n".join(parts) + "\n"

    def schema_data(self):
        def vt(vs):
            return vs.as_tuple() if vs else None

        def fdata(f: Field):
            d = {
                "name": f.name, "py": f.py, "type": f.type, "versions": vt(f.versions),
                "nullable": vt(f.nullable), "tag": f.tag, "tagged": vt(f.tagged),
                "default": None if f.default == "__none__" else f.default,
                "ignorable": f.ignorable,
            }
            if f.flexible != "inherit":
                d["flexible"] = vt(f.flexible)
            if f.struct:
                d["struct"] = f.struct.py
            return d

        out = {}
        for m in self.messages:
            out[m.name] = {
                "kind": m.kind, "api_key": m.api_key, "valid": vt(m.valid),
                "flexible": vt(m.flexible), "source": m.source,
                "structs": {st.py: [fdata(f) for f in st.fields] for st in m.structs},
            }
        return out


HEADER = '''\
# GENERATED by tools/genproto.py from ../shared/kafka-spec -- DO NOT EDIT.
# Regenerate with: python -m tools.genproto
"""Kafka message classes with per-version specialised decoders and encoders.

Each message class has ``encode(version) -> bytes`` and ``decode(buf, version)``; nested structs
are classes too. Field names are the schema's names in snake_case. ``uuid`` fields are 16-byte
``bytes``; ``bytes``/``records`` fields are ``bytes`` (records are not parsed). Fields a version
lacks decode to their schema default. Unknown tagged fields are kept in ``unknown_tagged_fields``
and written back on encode.
"""
# ruff: noqa
from struct import Struct as _Struct_, pack as _pack, unpack_from as _unpack_from

from protocol._base import _Struct, _Message, _UNSET, _ZERO_UUID
from protocol.wire import (
    ProtocolError, EncodeError, read_uvarint as _ruv, uvarint_bytes as _uvb,
    UVARINT_SMALL as _UV, read_tagged_fields as _read_tagged_fields,
    write_tagged_fields as _write_tagged_fields,
)

_I8 = _Struct_('>b')
_I16 = _Struct_('>h')
_I32 = _Struct_('>i')
'''


# --------------------------------------------------------------------------------------------
# errors.py
# --------------------------------------------------------------------------------------------

def generate_errors(tsv: Path) -> str:
    rows = []
    for line in tsv.read_text().splitlines()[1:]:
        if not line.strip():
            continue
        code, name, retriable, message, exc = (line.split("\t") + [""] * 5)[:5]
        rows.append((int(code), name, retriable == "true", message, exc))
    L = [
        "# GENERATED by tools/genproto.py from ../shared/kafka-spec/errors.tsv -- DO NOT EDIT.",
        '"""Kafka error codes: module constants (fast), an IntEnum (names), and a table with the',
        'retriable flag and Kafka\'s default message for each code."""',
        "# ruff: noqa",
        "from enum import IntEnum",
        "from typing import NamedTuple",
        "",
        "",
        "class ErrorInfo(NamedTuple):",
        "    code: int",
        "    name: str",
        "    retriable: bool",
        "    message: str",
        "    exception: str",
        "",
        "",
    ]
    for code, name, *_ in rows:
        L.append(f"{name} = {code}")
    L += ["", "", "class Errors(IntEnum):"]
    for code, name, *_ in rows:
        L.append(f"    {name} = {code}")
    L += ["", "", "ERRORS = {"]
    for code, name, retriable, message, exc in rows:
        L.append(f"    {code}: ErrorInfo({code}, {name!r}, {retriable!r}, {message!r}, {exc!r}),")
    L += ["}", "", "",
          "def error_name(code: int) -> str:",
          "    info = ERRORS.get(code)",
          "    return info.name if info else f'UNKNOWN_ERROR_CODE_{code}'",
          "",
          "",
          "def is_retriable(code: int) -> bool:",
          "    info = ERRORS.get(code)",
          "    return bool(info and info.retriable)",
          ""]
    return "\n".join(L)


def load_all(spec: Path) -> list[Message]:
    files = sorted((spec / "messages").glob("*.json")) + sorted((spec / "records").glob("*.json"))
    msgs = [load_message(p) for p in files]
    names = {}
    for m in msgs:
        for st in m.structs:
            if st.py in names and names[st.py] is not st:
                raise SystemExit(f"duplicate class name {st.py}")
            names[st.py] = st
    return msgs


def render(spec: Path) -> dict[str, str]:
    msgs = load_all(spec)
    return {
        "messages.py": Generator(msgs).generate(),
        "errors.py": generate_errors(spec / "errors.tsv"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=Path(os.environ.get("HERD_KAFKA_SPEC", DEFAULT_SPEC)))
    ap.add_argument("--out", type=Path, default=REPO / "protocol")
    args = ap.parse_args(argv)
    if not (args.spec / "messages").is_dir():
        print(f"genproto: no Kafka schemas at {args.spec}/messages", file=sys.stderr)
        return 2
    for name, text in render(args.spec).items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
