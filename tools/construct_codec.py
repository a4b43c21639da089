"""An independent Kafka codec built with `construct` from the schema facts in ``protocol.messages.SCHEMA``.

It shares nothing with herd's generated encoders and decoders except the schema data (field names,
types, version ranges, defaults, tags), and it follows the encoding rules of
``../shared/kafka-spec/README.md`` (and of Kafka's own message generator) independently. Uses:

* a second decoder/encoder for differential tests of ``protocol/messages.py``;
* ``tools/logdump`` (``__consumer_offsets`` keys and values, see :func:`parse_offsets_record`);
* the construct baseline in ``bench/codec.py`` (:func:`compiled`).

Values are plain data: a struct is a ``dict`` with every field of the struct under its snake_case
name (fields the version lacks hold their defaults), arrays are ``list``, strings ``str``,
bytes/records/uuid ``bytes``. Unknown tagged fields, when a struct has any, are kept under the key
``"unknown_tagged_fields"`` as a list of ``(tag, bytes)`` in wire order and are written back.

Public API::

    build(name, version)            -> construct.Construct (parses to / builds from a dict)
    compiled(name, version)         -> the same, construct-compiled (for the benchmark)
    parse(name, version, data)      -> dict          (KafkaConstructError on malformed input)
    parse_prefix(name, v, data, pos) -> (dict, end)
    build_bytes(name, version, d)   -> bytes         (missing keys take their defaults)
    parse_versioned(name, data)     -> (version, dict)   int16 version prefix, as in the
    build_versioned(name, v, d)     -> bytes             consumer-protocol blobs and record values
    parse_offsets_record(key, value) -> dict         one ``__consumer_offsets`` record
    defaults(name, struct=None)     -> dict          every field at its default
    project(name, version, d)       -> dict          what survives an encode/decode at ``version``

Notes on `construct` features:

* ``compile()`` works: the per-struct ``construct.Struct`` sequences, fixed-width integers, arrays,
  nullable-struct markers and the struct adapters are compiled to Python source; the Kafka-specific
  leaves (varints, compact/nullable strings and bytes, tagged-field sections) have no code emitter
  and run as linked (interpreted) instances inside the compiled parser, which construct supports.
* Compiled fixed-width fields read with ``io.read(n)`` without a length check, so compiled mode
  must only be given well-formed input (construct's documented behaviour). :func:`parse` always
  uses the interpreted, fully checked form.
"""
from __future__ import annotations

import io
import struct
from functools import cache

import construct as C

from protocol.messages import SCHEMA

__all__ = [
    "KafkaConstructError", "build", "compiled", "parse", "build_bytes", "parse_versioned",
    "build_versioned", "parse_offsets_record", "record_types", "defaults", "default_of", "project",
    "struct_fields", "parse_prefix", "present_in", "uvarint", "read_uvarint", "UNKNOWN_TAGS",
]

UNKNOWN_TAGS = "unknown_tagged_fields"
_ZERO_UUID = bytes(16)
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class KafkaConstructError(C.ConstructError):
    """Malformed Kafka bytes, or a value that cannot be written at the requested version."""


# ------------------------------------------------------------------------------------------------
# schema helpers (our own reading of the schema facts; nothing from the generated code paths)
# ------------------------------------------------------------------------------------------------

def _in(rng, v: int) -> bool:
    return rng is not None and rng[0] <= v and (rng[1] is None or v <= rng[1])


def present_in(f: dict, version: int) -> bool:
    """Whether field ``f`` (a SCHEMA field dict) exists at ``version``."""
    return _in(f["versions"], version)


def _struct_map() -> dict[str, tuple[str, list]]:
    """struct class name -> (message name, fields)."""
    out = {}
    for mname, m in SCHEMA.items():
        for cls, fields in m["structs"].items():
            out[cls] = (mname, fields)
    return out


_STRUCTS = _struct_map()


def struct_fields(struct_cls: str) -> list[dict]:
    return _STRUCTS[struct_cls][1]


def _message(name: str) -> dict:
    try:
        return SCHEMA[name]
    except KeyError:
        raise KeyError(f"unknown message {name!r}") from None


def _check_version(name: str, version: int) -> dict:
    m = _message(name)
    if not _in(m["valid"], version):
        raise KafkaConstructError(f"{name} has no version {version}")
    return m


def _is_array(f) -> bool:
    return f["type"].startswith("[]")


def _elem(f) -> str:
    return f["type"][2:] if _is_array(f) else f["type"]


def _tagged_at(f, v: int, flexible: bool) -> bool:
    return flexible and f["tag"] is not None and _in(f["tagged"], v)


def _compact(f, flexible: bool, v: int) -> bool:
    if not flexible:
        return False
    if "flexible" in f:  # field-level override (RequestHeader ClientId: "none")
        return _in(f["flexible"], v)
    return True


def default_of(f) -> object:
    """The default of one field, per the schema format (Kafka's FieldSpec rules: a JSON null default
    is the same as no default)."""
    d = f["default"]
    t = f["type"]
    if _is_array(f):
        return None if d == "null" else []
    if "struct" in f:
        return None if d == "null" else defaults_struct(f["struct"])
    if t == "string":
        return None if d == "null" else ("" if d is None else str(d))
    if t == "bytes":
        return None if d == "null" else b""
    if t == "records":
        return None
    if t == "bool":
        return d is not None and str(d).strip().lower() == "true"
    if t == "uuid":
        return _ZERO_UUID
    if t == "float64":
        return 0.0 if d is None else float(d)
    return 0 if d is None else int(str(d).strip(), 0)


def defaults_struct(struct_cls: str) -> dict:
    return {f["py"]: default_of(f) for f in struct_fields(struct_cls)}


def defaults(name: str, struct: str | None = None) -> dict:
    """Every field of message ``name`` (or of its nested struct class ``struct``) at its default."""
    _message(name)
    return defaults_struct(struct or name)


def _fill(struct_cls: str, value: dict | None) -> dict | None:
    """``value`` with missing keys set to defaults, recursively (for comparisons and building)."""
    if value is None:
        return None
    out = {}
    for f in struct_fields(struct_cls):
        x = value.get(f["py"], _MISSING)
        if x is _MISSING:
            x = default_of(f)
        elif "struct" in f and x is not None:
            x = [_fill(f["struct"], e) for e in x] if _is_array(f) else _fill(f["struct"], x)
        out[f["py"]] = x
    u = value.get(UNKNOWN_TAGS)
    if u:
        out[UNKNOWN_TAGS] = [(t, bytes(b)) for t, b in u]
    return out


_MISSING = object()


def project(name: str, version: int, value: dict) -> dict:
    """What decoding ``encode(value, version)`` must give back: fields the version lacks (and all
    nested ones) reset to their defaults, unknown tagged fields dropped in non-flexible versions."""
    m = _check_version(name, version)
    flexible = _in(m["flexible"], version)
    return _project(name, _fill(name, value), version, flexible)


def _project(struct_cls: str, value: dict | None, v: int, flexible: bool):
    if value is None:
        return None
    out = {}
    for f in struct_fields(struct_cls):
        x = value[f["py"]]
        if not _in(f["versions"], v):
            x = default_of(f)
        elif "struct" in f and x is not None:
            if _is_array(f):
                x = [_project(f["struct"], e, v, flexible) for e in x]
            else:
                x = _project(f["struct"], x, v, flexible)
        out[f["py"]] = x
    if flexible and value.get(UNKNOWN_TAGS):
        out[UNKNOWN_TAGS] = list(value[UNKNOWN_TAGS])
    return out


# ------------------------------------------------------------------------------------------------
# Kafka primitives as construct classes
# ------------------------------------------------------------------------------------------------

def _read(stream, n: int, path) -> bytes:
    if n < 0:
        raise KafkaConstructError(f"negative length {n}", path=path)
    data = stream.read(n)
    if len(data) != n:
        raise KafkaConstructError(f"truncated: wanted {n} bytes, got {len(data)}", path=path)
    return data


def read_uvarint(stream, path=None) -> int:
    """Kafka unsigned varint: LEB128, at most 5 bytes, at most 32 bits."""
    value = 0
    for i in range(5):
        b = stream.read(1)
        if not b:
            raise KafkaConstructError("truncated varint", path=path)
        b = b[0]
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            if value > 0xFFFFFFFF:
                raise KafkaConstructError("varint exceeds 32 bits", path=path)
            return value
    raise KafkaConstructError("varint longer than 5 bytes", path=path)


def uvarint(value: int) -> bytes:
    if not 0 <= value <= 0xFFFFFFFF:
        raise KafkaConstructError(f"unsigned varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class UVarInt(C.Construct):
    """Kafka's unsigned 32-bit varint (construct's VarInt is unbounded)."""

    def _parse(self, stream, context, path):
        return read_uvarint(stream, path)

    def _build(self, obj, stream, context, path):
        stream.write(uvarint(obj))
        return obj


class KString(C.Construct):
    """string: int16 length (classic) or uvarint length+1 (compact); null = -1 / 0."""

    def __init__(self, compact: bool, nullable: bool):
        super().__init__()
        self.compact = compact
        self.nullable = nullable

    def _parse(self, stream, context, path):
        if self.compact:
            n = read_uvarint(stream, path) - 1
        else:
            n = _I16.unpack(_read(stream, 2, path))[0]
        if n < 0:
            if not self.nullable:
                raise KafkaConstructError("non-nullable string is null", path=path)
            return None
        if n > 0x7FFF:
            raise KafkaConstructError(f"string length {n} exceeds 32767", path=path)
        data = _read(stream, n, path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaConstructError(f"string is not UTF-8: {exc}", path=path) from None

    def _build(self, obj, stream, context, path):
        if obj is None:
            if not self.nullable:
                raise KafkaConstructError("null in a non-nullable string", path=path)
            stream.write(b"\x00" if self.compact else b"\xff\xff")
            return obj
        data = obj.encode("utf-8")
        if len(data) > 0x7FFF:
            raise KafkaConstructError("string longer than 32767 bytes", path=path)
        stream.write(uvarint(len(data) + 1) if self.compact else _I16.pack(len(data)))
        stream.write(data)
        return obj


class KBytes(C.Construct):
    """bytes/records: int32 length (classic) or uvarint length+1 (compact); null = -1 / 0."""

    def __init__(self, compact: bool, nullable: bool):
        super().__init__()
        self.compact = compact
        self.nullable = nullable

    def _parse(self, stream, context, path):
        if self.compact:
            n = read_uvarint(stream, path) - 1
        else:
            n = _I32.unpack(_read(stream, 4, path))[0]
        if n < 0:
            if not self.nullable:
                raise KafkaConstructError("non-nullable bytes field is null", path=path)
            return None
        return _read(stream, n, path)

    def _build(self, obj, stream, context, path):
        if obj is None:
            if not self.nullable:
                raise KafkaConstructError("null in a non-nullable bytes field", path=path)
            stream.write(b"\x00" if self.compact else b"\xff\xff\xff\xff")
            return obj
        data = bytes(obj)
        stream.write(uvarint(len(data) + 1) if self.compact else _I32.pack(len(data)))
        stream.write(data)
        return obj


def _remaining(stream) -> int | None:
    try:
        pos = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(pos)
        return end - pos
    except (AttributeError, OSError, ValueError):
        return None


class KArray(C.Subconstruct):
    """array: int32 count (classic) or uvarint count+1 (compact); null = -1 / 0."""

    def __init__(self, subcon, compact: bool, nullable: bool):
        super().__init__(subcon)
        self.compact = compact
        self.nullable = nullable

    def _count(self, stream, path=None):
        if self.compact:
            n = read_uvarint(stream, path) - 1
        else:
            n = _I32.unpack(_read(stream, 4, path))[0]
        if n < 0:
            if not self.nullable:
                raise KafkaConstructError("non-nullable array is null", path=path)
            return -1
        left = _remaining(stream)
        if left is not None and n > left:  # every element takes at least one byte here
            raise KafkaConstructError(f"array count {n} exceeds the {left} bytes left", path=path)
        return n

    def _write_count(self, obj, stream, path=None):
        if obj is None:
            if not self.nullable:
                raise KafkaConstructError("null in a non-nullable array", path=path)
            stream.write(b"\x00" if self.compact else b"\xff\xff\xff\xff")
            return False
        stream.write(uvarint(len(obj) + 1) if self.compact else _I32.pack(len(obj)))
        return True

    def _parse(self, stream, context, path):
        n = self._count(stream, path)
        if n < 0:
            return None
        sc = self.subcon
        return [sc._parsereport(stream, context, path) for _ in range(n)]

    def _build(self, obj, stream, context, path):
        if self._write_count(obj, stream, path):
            for e in obj:
                self.subcon._build(e, stream, context, path)
        return obj

    def _emitparse(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"parse_karray_{code.allocateId()}"
        code.append(f"""
            def {fname}(io, this):
                n = linkedinstances[{id(self)}]._count(io)
                if n < 0:
                    return None
                return [{self.subcon._compileparse(code)} for _ in range(n)]
        """)
        return f"{fname}(io, this)"

    def _emitbuild(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"build_karray_{code.allocateId()}"
        code.append(f"""
            def {fname}(items, io, this):
                if linkedinstances[{id(self)}]._write_count(items, io):
                    for obj in items:
                        {self.subcon._compilebuild(code)}
                return items
        """)
        return f"{fname}(obj, io, this)"


class NullableStruct(C.Subconstruct):
    """A nullable (non-array) struct: int8 marker -1 = null / 1 = present; inside a tagged field an
    unsigned-varint marker 0 = null / 1 = present."""

    def __init__(self, subcon, tagged: bool):
        super().__init__(subcon)
        self.tagged = tagged

    def _present(self, stream, path=None) -> bool:
        if self.tagged:
            return read_uvarint(stream, path) > 0
        return _I8.unpack(_read(stream, 1, path))[0] >= 0

    def _marker(self, obj, stream) -> bool:
        if obj is None:
            stream.write(b"\x00" if self.tagged else b"\xff")
            return False
        stream.write(b"\x01")
        return True

    def _parse(self, stream, context, path):
        if not self._present(stream, path):
            return None
        return self.subcon._parsereport(stream, context, path)

    def _build(self, obj, stream, context, path):
        if self._marker(obj, stream):
            self.subcon._build(obj, stream, context, path)
        return obj

    def _emitparse(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"parse_nullstruct_{code.allocateId()}"
        code.append(f"""
            def {fname}(io, this):
                if not linkedinstances[{id(self)}]._present(io):
                    return None
                return {self.subcon._compileparse(code)}
        """)
        return f"{fname}(io, this)"

    def _emitbuild(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"build_nullstruct_{code.allocateId()}"
        code.append(f"""
            def {fname}(obj, io, this):
                if linkedinstances[{id(self)}]._marker(obj, io):
                    {self.subcon._compilebuild(code)}
                return obj
        """)
        return f"{fname}(obj, io, this)"


class NonNull(C.Subconstruct):
    """A non-nullable struct value: refuse None when building."""

    def _parse(self, stream, context, path):
        return self.subcon._parsereport(stream, context, path)

    def _build(self, obj, stream, context, path):
        if obj is None:
            raise KafkaConstructError("null in a non-nullable struct field", path=path)
        return self.subcon._build(obj, stream, context, path)

    def _emitparse(self, code):
        return self.subcon._compileparse(code)

    def _emitbuild(self, code):
        return self.subcon._compilebuild(code)


class TaggedSection(C.Construct):
    """The tagged-field section that ends every struct of a flexible version.

    Parses to ``{"known": {py_name: value}, "unknown": [(tag, bytes), ...]}``; builds from the
    same shape, where ``known`` holds only the fields to write (non-default values)."""

    def __init__(self, known: dict[int, tuple[str, C.Construct]]):
        super().__init__()
        self.known = known

    def _parse(self, stream, context, path):
        count = read_uvarint(stream, path)
        left = _remaining(stream)
        if left is not None and count > left:
            raise KafkaConstructError(f"tagged field count {count} exceeds the bytes left", path=path)
        known = {}
        unknown = []
        for _ in range(count):
            tag = read_uvarint(stream, path)
            size = read_uvarint(stream, path)
            data = _read(stream, size, path)
            entry = self.known.get(tag)
            if entry is None:
                unknown.append((tag, data))
                continue
            py, sc = entry
            sub = io.BytesIO(data)
            known[py] = sc._parsereport(sub, context, path)  # reading past `size` raises
        return {"known": known, "unknown": unknown}

    def _build(self, obj, stream, context, path):
        items = []
        by_name = {py: (tag, sc) for tag, (py, sc) in self.known.items()}
        for py, value in obj["known"].items():
            tag, sc = by_name[py]
            sub = io.BytesIO()
            sc._build(value, sub, context, path)
            items.append((tag, sub.getvalue()))
        items.extend((t, bytes(b)) for t, b in obj["unknown"] or ())
        items.sort(key=lambda p: p[0])
        for a, b in zip(items, items[1:], strict=False):
            if a[0] == b[0]:
                raise KafkaConstructError(f"duplicate tag {a[0]}", path=path)
        stream.write(uvarint(len(items)))
        for tag, data in items:
            stream.write(uvarint(tag))
            stream.write(uvarint(len(data)))
            stream.write(data)
        return obj


class KStruct(C.Adapter):
    """Turns the positional ``construct.Struct`` (+ tagged section) of one Kafka struct at one
    version into a plain dict with every field of the struct, and back."""

    def __init__(self, struct_cls: str, version: int, flexible: bool, inner, tagged_fields):
        super().__init__(inner)
        self.struct_cls = struct_cls
        self.version = version
        self.flexible = flexible
        self.fields = struct_fields(struct_cls)
        self.tagged_fields = tagged_fields  # py -> field
        self.layout = []  # (py, kind) with kind "pos" | "tag" | "absent"
        for f in self.fields:
            if not _in(f["versions"], version):
                kind = "absent"
            elif f["py"] in tagged_fields:
                kind = "tag"
            else:
                kind = "pos"
            self.layout.append((f["py"], kind, f))

    def _decode(self, obj, context, path):
        out = {}
        tags = obj["_tagged"] if self.flexible else None
        for py, kind, f in self.layout:
            if kind == "pos":
                out[py] = obj[py]
            elif kind == "tag":
                known = tags["known"]
                out[py] = known[py] if py in known else default_of(f)
            else:
                out[py] = default_of(f)
        if tags is not None and tags["unknown"]:
            out[UNKNOWN_TAGS] = tags["unknown"]
        return out

    def _encode(self, obj, context, path):
        if obj is None:
            raise KafkaConstructError(f"{self.struct_cls}: null struct", path=path)
        value = _fill(self.struct_cls, obj)
        out = {}
        known = {}
        for py, kind, f in self.layout:
            x = value[py]
            if kind == "pos":
                out[py] = x
            elif kind == "tag":
                if x != default_of(f):
                    known[py] = x
            elif not f["ignorable"] and x != default_of(f):
                raise KafkaConstructError(
                    f"{self.struct_cls}.{py} has a non-default value but version {self.version} lacks "
                    "it and it is not ignorable", path=path)
        if self.flexible:
            out["_tagged"] = {"known": known, "unknown": value.get(UNKNOWN_TAGS) or []}
        return out

    def _emitparse(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"parse_kstruct_{code.allocateId()}"
        code.append(f"""
            def {fname}(io, this):
                return linkedinstances[{id(self)}]._decode({self.subcon._compileparse(code)}, this, None)
        """)
        return f"{fname}(io, this)"

    def _emitbuild(self, code):
        code.linkedinstances[id(self)] = self
        fname = f"build_kstruct_{code.allocateId()}"
        code.append(f"""
            def {fname}(orig, io, this):
                obj = linkedinstances[{id(self)}]._encode(orig, this, None)
                {self.subcon._compilebuild(code)}
                return orig
        """)
        return f"{fname}(obj, io, this)"


_FIXED = {
    "int8": C.Int8sb, "int16": C.Int16sb, "int32": C.Int32sb, "int64": C.Int64sb,
    "uint16": C.Int16ub, "uint32": C.Int32ub, "float64": C.Float64b, "bool": C.Flag,
    "uuid": C.Bytes(16),
}


class _Builder:
    """Builds the construct tree of one message at one version."""

    def __init__(self, name: str, version: int):
        m = _check_version(name, version)
        self.name = name
        self.v = version
        self.flexible = _in(m["flexible"], version)
        self.cache: dict[str, KStruct] = {}

    def struct(self, cls: str) -> KStruct:
        if cls in self.cache:
            return self.cache[cls]
        v, flexible = self.v, self.flexible
        positional = []
        tagged = {}
        known = {}
        for f in struct_fields(cls):
            if not _in(f["versions"], v):
                continue
            if _tagged_at(f, v, flexible):
                tagged[f["py"]] = f
                known[f["tag"]] = (f["py"], self.field(f, tagged=True))
            else:
                positional.append(f["py"] / self.field(f, tagged=False))
        if flexible:
            positional.append("_tagged" / TaggedSection(known))
        con = KStruct(cls, v, flexible, C.Struct(*positional), tagged)
        self.cache[cls] = con
        return con

    def value(self, f, elem: str, compact: bool, nullable: bool, tagged: bool):
        if elem in _FIXED:
            return _FIXED[elem]
        if elem == "string":
            return KString(compact, nullable)
        if elem in ("bytes", "records"):
            return KBytes(compact, nullable)
        sc = self.struct(f["struct"])
        return NullableStruct(sc, tagged) if nullable else NonNull(sc)

    def field(self, f, tagged: bool):
        v = self.v
        compact = tagged or _compact(f, self.flexible, v)
        nullable = _in(f["nullable"], v)
        if _is_array(f):
            elem = self.value(f, _elem(f), compact, False, tagged)
            return KArray(elem, compact, nullable)
        return self.value(f, f["type"], compact, nullable, tagged)


@cache
def build(name: str, version: int) -> C.Construct:
    """The construct for message (or header / data struct) ``name`` at ``version``."""
    return _Builder(name, version).struct(name)


@cache
def compiled(name: str, version: int) -> C.Construct:
    """``build(name, version).compile()`` (cached). Give it only well-formed input."""
    return build(name, version).compile()


def parse(name: str, version: int, data, exact: bool = True) -> dict:
    """Decode ``data`` as ``name`` at ``version``. With ``exact``, trailing bytes are an error."""
    stream = io.BytesIO(bytes(data))
    try:
        value = build(name, version).parse_stream(stream)
    except KafkaConstructError:
        raise
    except C.ConstructError as exc:
        raise KafkaConstructError(f"{name} v{version}: {exc}") from None
    if exact and stream.tell() != len(stream.getbuffer()):
        raise KafkaConstructError(
            f"{name} v{version}: {len(stream.getbuffer()) - stream.tell()} trailing bytes")
    return value


def parse_prefix(name: str, version: int, data, pos: int = 0) -> tuple[dict, int]:
    """Decode at ``pos``; return ``(value, end_pos)``."""
    stream = io.BytesIO(bytes(data))
    stream.seek(pos)
    try:
        value = build(name, version).parse_stream(stream)
    except KafkaConstructError:
        raise
    except C.ConstructError as exc:
        raise KafkaConstructError(f"{name} v{version}: {exc}") from None
    return value, stream.tell()


def build_bytes(name: str, version: int, value: dict) -> bytes:
    try:
        return build(name, version).build(value)
    except KafkaConstructError:
        raise
    except C.ConstructError as exc:
        raise KafkaConstructError(f"{name} v{version}: {exc}") from None


def parse_versioned(name: str, data) -> tuple[int, dict]:
    """An int16 version followed by ``name`` at that version (consumer-protocol blobs, record keys
    and values). A version newer than the schema is read with the newest schema, ignoring what
    follows (Kafka only appends fields)."""
    data = bytes(data)
    if len(data) < 2:
        raise KafkaConstructError(f"{name}: missing version")
    version = _I16.unpack_from(data, 0)[0]
    lo, hi = _message(name)["valid"]
    if version < lo:
        raise KafkaConstructError(f"{name}: unknown version {version}")
    if version > hi:
        value, _end = parse_prefix(name, hi, data, 2)
    else:
        value = parse(name, version, data[2:])
    return version, value


def build_versioned(name: str, version: int, value: dict) -> bytes:
    return _I16.pack(version) + build_bytes(name, version, value)


def record_types() -> dict[int, tuple[str, str]]:
    """``__consumer_offsets`` record type -> (key message, value message). The version of each
    ``*Key`` schema is its record type (README)."""
    out = {}
    for name, m in SCHEMA.items():
        if m["kind"] == "data" and name.endswith("Key") and name[:-3] + "Value" in SCHEMA:
            lo, hi = m["valid"]
            for t in range(lo, hi + 1):
                out[t] = (name, name[:-3] + "Value")
    return out


def parse_offsets_record(key: bytes, value: bytes | None) -> dict:
    """One ``__consumer_offsets`` record: ``{"type", "key_schema", "key", "value_version",
    "value"}``; a ``None`` value is a tombstone (``"value": None``). Unknown record types (e.g. the
    ShareGroup* types 9-15, not in our schemas) keep their raw bytes."""
    key = bytes(key)
    if len(key) < 2:
        raise KafkaConstructError("record key shorter than its type")
    rtype = _I16.unpack_from(key, 0)[0]
    names = record_types().get(rtype)
    if names is None:
        return {"type": rtype, "key_schema": None, "key": key[2:], "value_version": None,
                "value": None if value is None else bytes(value)}
    key_name, value_name = names
    out = {"type": rtype, "key_schema": key_name, "key": parse(key_name, rtype, key[2:], exact=False),
           "value_version": None, "value": None}
    if value is not None:
        out["value_version"], out["value"] = parse_versioned(value_name, value)
    return out
