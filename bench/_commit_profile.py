"""Where an OffsetCommit's time goes on the loop thread, from a py-spy profile of bench.edge_micro.

``py-spy record -r 1000 -f raw -o FILE -- python -m bench.edge_micro --kinds commit --batches 32
--commits 30000 --rounds 3`` then ``python -m bench._commit_profile FILE [--us 60]``: the loop
thread's samples (those under ``asyncio.Runner.run``, the joins and checks before the timing
left out) put in one bucket each by the first marker of :data:`BUCKETS` found in the stack;
printed as a share and, given ``--us`` (the measured µs per request), as µs. JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from bench import _profile

# (bucket, a function in the stack); the first that matches wins, so nested ones come first
BUCKETS = [
    ("decode request body", "_decode_whole"),
    ("decode request body", "decode_offset_commit_request"),
    ("header + framing", "read_request_header"),
    ("header + framing", "FrameDecoder.split"),
    ("core: validate (member/generation)", "validate_commit"),
    ("core: offset records + replies", "Offsets.offset_commit"),
    ("core: routing (coordinator.handle)", "GroupCoordinator.handle"),
    ("runtime.apply (+store.submit)", "Runtime.apply"),
    ("log: encode_entries (framing, CRC32C)", "encode_entries"),
    ("log: pwrite", "_pwrite_all"),
    ("log: other (_account, staging)", "Writer.flush"),
    ("response encode", "_encode_body"),
    ("settle + send_response other", "Runtime._settle"),
    ("runtime.dispatch other", "Runtime.dispatch"),
    ("edge other (Reply, handle, flush, write)", "Connection.data_received"),
    ("loop turn / other", ""),
]
_SETUP = ("_call (bench", "_check (bench", "_join (bench", "_cg_join (bench")


def buckets(path: str) -> tuple[dict[str, float], int]:
    stacks = [(frames, n) for frames, n in _profile.load(path)
              if any("Runner.run" in f for f in frames) and not any(s in f for f in frames for s in _SETUP)]
    total = sum(n for _, n in stacks)
    counts: Counter = Counter()
    for frames, n in stacks:
        joined = ";".join(frames)
        for name, marker in BUCKETS:
            if marker in joined:
                counts[name] += n
                break
    order = list(dict.fromkeys(name for name, _ in BUCKETS))
    return {name: (counts[name] / total if total else 0.0) for name in order}, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench._commit_profile")
    ap.add_argument("file")
    ap.add_argument("--us", type=float, default=None, help="measured µs per request, to print µs per bucket")
    args = ap.parse_args(argv)
    shares, samples = buckets(args.file)
    for name, share in shares.items():
        us = f"  {share * args.us:6.1f} µs" if args.us else ""
        print(f"{name:42s} {100 * share:5.1f} %{us}", file=sys.stderr)
    print(json.dumps({"benchmark": "commit_profile", "file": args.file, "samples": samples, "us": args.us,
                      "shares": {k: round(v, 4) for k, v in shares.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
