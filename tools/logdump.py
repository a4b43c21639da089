"""Print the entries of a herd data directory's logs, decoded.

    python -m tools.logdump DATA_DIR [--shard N] [--json] [--decoder auto|construct|generated]

One line per entry: shard, byte position in the shard's file, and the ``__consumer_offsets`` record:
key = int16 record type + key struct at that version (OffsetCommitKey for 0/1, GroupMetadataKey for
2, ...), value = int16 version + value struct, ``None`` = tombstone. Records of an unknown type (or
that do not decode) are printed as hex.

Decoders: ``generated`` is the codec in ``protocol/messages.py`` (record types 0-2, ~7 µs a
record); ``construct`` is the independent decoder in ``tools/construct_codec.py`` (needs the
``construct`` package, a test extra; ~100 µs a record; also knows the ConsumerGroup* types 3-8), a
second opinion when the generated codec is in doubt. ``auto`` (default) tries the generated classes,
then construct if it is installed, then prints hex.

Read-only: a torn tail is reported (open() would cut it), never cut. Exit status: 0, or 1 when a
shard has damage that would make herd refuse to start (or cannot be read at all), 2 for a usage
mistake (one line on stderr).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import struct
import sys
import uuid
from pathlib import Path

from coordinator.store.logformat import LOG_NAME, LogError, read_log_file

_I16 = struct.Struct(">h")
_SHARD_DIR = re.compile(r"shard-(\d+)")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tools.logdump", description="Print the entries of a herd data directory.")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--shard", type=int, metavar="N", help="only this shard")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--decoder", choices=("auto", "construct", "generated"), default="auto")
    return p


# ---- decoding ------------------------------------------------------------------------------------


@functools.cache
def _generated_types() -> dict[int, tuple[type, type]]:
    from protocol import messages as m
    return {0: (m.OffsetCommitKey, m.OffsetCommitValue), 1: (m.OffsetCommitKey, m.OffsetCommitValue),
            2: (m.GroupMetadataKey, m.GroupMetadataValue)}


def _decode_generated(key: bytes, value: bytes | None) -> dict:
    rtype = _I16.unpack_from(key, 0)[0]
    types = _generated_types().get(rtype)
    if types is None:
        raise LookupError(f"unknown record type {rtype}")
    key_cls, value_cls = types
    out = {"type": rtype, "key_schema": key_cls.NAME, "key": key_cls.decode(key, rtype, 2).to_dict(),
           "value_schema": value_cls.NAME, "value_version": None, "value": None}
    if value is not None:
        version = _I16.unpack_from(value, 0)[0]
        out["value_version"] = version
        out["value"] = value_cls.decode(value, version, 2).to_dict()
    return out


def _decode_construct(key: bytes, value: bytes | None) -> dict:
    from tools import construct_codec as cc
    rec = cc.parse_offsets_record(key, value)
    if rec["key_schema"] is None:
        raise LookupError(f"unknown record type {rec['type']}")
    names = cc.record_types()[rec["type"]]
    return {"type": rec["type"], "key_schema": rec["key_schema"], "key": rec["key"],
            "value_schema": names[1], "value_version": rec["value_version"], "value": rec["value"]}


@functools.cache
def _construct_available() -> bool:
    try:
        import tools.construct_codec  # noqa: F401
    except ImportError:
        return False
    return True


def decode_record(key: bytes, value: bytes | None, decoder: str = "auto") -> dict:
    """-> {"type", "key_schema", "key", "value_schema", "value_version", "value"}; for a record that
    cannot be decoded: {"type", "key_hex", "value_hex", "error"}."""
    if decoder == "auto":
        decoders = [_decode_generated, _decode_construct] if _construct_available() else [_decode_generated]
    elif decoder == "construct":
        decoders = [_decode_construct]
    else:
        decoders = [_decode_generated]
    error = "record key shorter than its type"
    from coordinator.core.catalog import TOPIC_RECORD, decode_topic_record, is_topic_record
    if is_topic_record(key):  # herd's own record: a topic of the catalog (shard 0)
        try:
            name, topic = decode_topic_record(key, value)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        else:
            return {"type": TOPIC_RECORD, "key_schema": "HerdTopicKey", "key": {"name": name},
                    "value_schema": "HerdTopicValue", "value_version": None if topic is None else 0,
                    "value": None if topic is None else {
                        "partitions": topic.partitions, "topic_id": str(uuid.UUID(bytes=topic.topic_id))}}
    elif len(key) >= 2:
        for dec in decoders:
            try:
                return dec(key, value)
            except LookupError as exc:
                error = str(exc).strip("'")
            except Exception as exc:  # any decoder failure: fall back, finally to hex
                error = f"{type(exc).__name__}: {exc}"
    return {"type": _I16.unpack_from(key, 0)[0] if len(key) >= 2 else None, "key_hex": key.hex(),
            "value_hex": None if value is None else value.hex(), "error": error}


# ---- output --------------------------------------------------------------------------------------


def _jsonable(x):
    if isinstance(x, (bytes, bytearray)):
        return x.hex()
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _text(x) -> str:
    if isinstance(x, dict):
        return " ".join(f"{k}={_text_inner(v)}" for k, v in x.items() if k != "unknown_tagged_fields" or v)
    return _text_inner(x)


def _text_inner(x) -> str:
    if isinstance(x, (bytes, bytearray)):
        return "0x" + x.hex() if x else "b''"
    if isinstance(x, dict):
        return "{" + _text(x) + "}"
    if isinstance(x, list):
        return "[" + ", ".join(_text_inner(v) for v in x) + "]"
    return repr(x)


def format_text(shard: int, pos: int, rec: dict) -> str:
    head = f"shard {shard} @{pos}"
    if "key_hex" in rec:
        value = "<tombstone>" if rec["value_hex"] is None else "0x" + rec["value_hex"]
        return f"{head} type={rec['type']} key=0x{rec['key_hex']} => {value}  ({rec['error']})"
    key = f"{rec['key_schema']}[{rec['type']}] {_text(rec['key'])}"
    if rec["value"] is None:
        return f"{head} {key} => <tombstone>"
    return f"{head} {key} => {rec['value_schema']} v{rec['value_version']} {_text(rec['value'])}"


# ---- main ----------------------------------------------------------------------------------------


def _shards(data_dir: Path, only: int | None) -> list[tuple[int, Path]]:
    if not data_dir.is_dir():
        raise UsageError(f"{data_dir}: no such directory")
    found = []
    for p in data_dir.iterdir():
        m = _SHARD_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    found.sort()
    if not found:
        raise UsageError(f"{data_dir}: not a herd data directory (no shard-NN directories)")
    if only is not None:
        found = [(n, p) for n, p in found if n == only]
        if not found:
            raise UsageError(f"{data_dir}: no shard {only}")
    return found


def dump(data_dir, shard: int | None = None, as_json: bool = False, decoder: str = "auto", out=None) -> int:
    out = out or sys.stdout
    write = out.write
    status = 0
    for n, d in _shards(Path(data_dir), shard):
        path = d / LOG_NAME
        if not path.exists():
            write(json.dumps({"shard": n, "file": str(path), "missing": True}) + "\n" if as_json
                  else f"# shard {n}: {path}: no log file\n")
            continue
        try:
            lf = read_log_file(path, n)
        except (LogError, OSError) as exc:
            status = 1
            write(json.dumps({"shard": n, "file": str(path), "error": str(exc)}) + "\n" if as_json
                  else f"# shard {n}: {path}: cannot read: {exc}\n")
            continue
        if as_json:
            write(json.dumps({"shard": n, "file": str(path), "bytes": lf.size, "entries": len(lf.entries),
                              "durable_end": lf.durable_end}) + "\n")
        else:
            write(f"# shard {n}: {path}: {len(lf.entries)} entries, {lf.size} bytes\n")
        for pos, key, value in lf.entries:
            rec = decode_record(key, value, decoder)
            if as_json:
                write(json.dumps({"shard": n, "position": pos, **_jsonable(rec)}) + "\n")
            else:
                write(format_text(n, pos, rec) + "\n")
        for dmg in (lf.header_damage, lf.damage):
            if dmg is None:
                continue
            if dmg.kind == "corrupt":
                status = 1
            if as_json:
                write(json.dumps({"shard": n, "damage": {"kind": dmg.kind, "offset": dmg.offset,
                                                         "reason": dmg.reason, "evidence": dmg.evidence,
                                                         "file_bytes": dmg.size}}) + "\n")
            elif dmg.kind == "torn":
                write(f"# shard {n}: torn tail at byte {dmg.offset} ({dmg.reason}): herd will cut "
                      f"{dmg.size - dmg.offset} bytes when it opens this log\n")
            else:
                write(f"# shard {n}: CORRUPT at byte {dmg.offset} ({dmg.reason}); {dmg.evidence}: herd "
                      f"refuses to start until --repair cuts the log there\n")
    return status


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.decoder == "construct" and not _construct_available():
            raise UsageError("--decoder construct needs the construct package (pip install construct)")
        return dump(args.data_dir, args.shard, args.json, args.decoder)
    except UsageError as exc:
        print(f"logdump: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
