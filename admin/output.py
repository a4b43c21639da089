"""How ``herd groups`` prints: aligned tables, JSON, notes on stderr."""
from __future__ import annotations

import json
import sys


def _cell(v) -> str:
    if v is None or v == "":
        return "-"
    s = str(v)
    if s.isprintable():
        return s
    # client-supplied text (metadata, client ids) must not drive the terminal
    return "".join(c if c.isprintable() else ("\\x%02x" % ord(c) if ord(c) < 256 else "\\u%04x" % ord(c))
                   for c in s)


def print_table(headers: list[str], rows: list[list], file=None) -> None:
    file = file or sys.stdout
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    for line in [headers, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=file)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _note(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr)

