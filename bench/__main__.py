"""Run the benchmarks: `python -m bench [NAME ...]`.

Every module `bench/<name>.py` that defines `main()` is a benchmark. Its `main()` prints its JSON
itself, or returns a JSON-serialisable object that is printed here as one line. With NAMEs, only
those modules run. Benchmarks are never run as tests.
"""

import importlib
import json
import pkgutil
import sys
import traceback

import bench


def discover() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench.__path__)
        if not info.ispkg and not info.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip(), "\n\nBenchmarks (`python -m bench.NAME --help` for one): " + " ".join(discover()))
        return 0
    names = argv or discover()
    failed = []
    ran = 0
    for name in names:
        try:
            module = importlib.import_module(f"bench.{name}")
            entry = getattr(module, "main", None)
            if not callable(entry):
                if argv:  # asked for by name: say it is not a benchmark
                    failed.append(name)
                    print(f"bench {name} has no main()", file=sys.stderr)
                continue
            ran += 1
            result = entry()
            if result is not None:
                print(json.dumps(result), flush=True)
        except Exception:
            failed.append(name)
            print(f"bench {name} failed:", file=sys.stderr)
            traceback.print_exc()
    if not ran and not failed:
        print("no benchmarks found in bench/", file=sys.stderr)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
