"""The project's layers, read from the source with ``ast``: which package may import which, which
folder of the daemon may import which (``coordinator/core`` is pure: it imports only ``protocol`` and
itself), and no two project modules importing each other (directly or round a longer loop). The
rules hold for what a module imports indirectly too (its transitive imports).

Every import counts, a lazy one inside a function too: a daemon that imports the admin tool "only
when needed" still depends on it.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "coordinator", "client", "admin", "tools", "bench")
TOP_MODULES = ("herd_cli",)
# package -> the project packages it may import (itself always)
ALLOWED = {
    "protocol": set(),
    "coordinator": {"protocol"},
    "client": {"protocol"},
    "admin": {"client", "protocol"},
}
OURS = set(PACKAGES) | set(TOP_MODULES) | {"tests"}

# The daemon's folders. core/ (incl. classic/ and consumer/) is the pure core: no I/O, no clock, no
# daemon settings; it may import only protocol and core. edge/ (connections), ops/ (metrics, console,
# watchers), store/ and cluster/ sit on top of it, as does the daemon at coordinator/'s top level.
CORE = "coordinator.core"
CORE_MAY_IMPORT = ("protocol", CORE)
# Imports of the pure core that break its rule and are to go: none left (issue 28 gave the core
# its own group config instead of the daemon's Config). Not followed when reading indirect imports;
# the test fails when one is gone, so that it is removed here too.
KNOWN_CORE_EXCEPTIONS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in (*PACKAGES, "tests"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "node_modules" not in path.parts:
                out[module_name(path)] = path
    for name in TOP_MODULES:
        out[name] = ROOT / f"{name}.py"
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in it (``from pkg import mod`` names the
    module when ``pkg.mod`` is one)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] not in OURS:
                continue
            while t and t not in known:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@functools.cache  # the files do not change during a run: parsed once (~3 s of CPU each time)
def graph() -> dict[str, set[str]]:
    mods = project_modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def reach(g: dict[str, set[str]], start: str, skip: set[tuple[str, str]] = frozenset()) -> dict[str, str]:
    """Every module ``start`` imports, directly or not: module -> the module that imports it on one
    shortest path (to name the path in a failure). Edges in ``skip`` are not followed."""
    seen, todo = {start: ""}, [start]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(g.get(v, ())):
                if w not in seen and (v, w) not in skip:
                    seen[w] = v
                    nxt.append(w)
        todo = nxt
    del seen[start]
    return seen


def path_to(via: dict[str, str], start: str, end: str) -> str:
    hops = [end]
    while via[hops[-1]] != start:
        hops.append(via[hops[-1]])
    return " -> ".join([start, *reversed(hops)])


def violations(g: dict[str, set[str]], sources, forbidden, skip=frozenset()) -> list[str]:
    """For each module ``name`` with ``sources(name)``, every module it reaches (directly or not) with
    ``forbidden(name, target)``, named with the import path that leads there."""
    bad = []
    for name in sorted(g):
        if not sources(name):
            continue
        via = reach(g, name, skip)
        bad += [path_to(via, name, t) for t in sorted(via) if forbidden(name, t)]
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_each_layer_imports_only_the_layers_below_it():
    def forbidden(name, target):
        pkg, tpkg = name.split(".")[0], target.split(".")[0]
        return tpkg != pkg and tpkg not in ALLOWED[pkg]

    bad = violations(graph(), lambda n: n.split(".")[0] in ALLOWED, forbidden, KNOWN_CORE_EXCEPTIONS)
    assert not bad, "\n".join(bad)


def test_the_core_imports_only_protocol_and_the_core():
    # so edge/, ops/, store/, cluster/ and the daemon's top level (config, clock, runtime...) are
    # never imported by the core, not even through another module
    bad = violations(graph(), lambda n: within(n, CORE),
                     lambda n, t: not any(within(t, p) for p in CORE_MAY_IMPORT), KNOWN_CORE_EXCEPTIONS)
    assert not bad, "\n".join(bad)


def test_the_known_exceptions_of_the_core_still_exist():
    g = graph()
    gone = [f"{a} -> {b}" for a, b in sorted(KNOWN_CORE_EXCEPTIONS) if b not in g.get(a, ())]
    assert not gone, "no longer imported: remove from KNOWN_CORE_EXCEPTIONS: " + ", ".join(gone)


def test_the_daemon_folders_exist():
    # the rules above would pass vacuously if the folders were renamed
    mods = set(project_modules())
    for pkg in ("coordinator.core", "coordinator.core.classic", "coordinator.core.consumer",
                "coordinator.edge", "coordinator.ops", "coordinator.store", "coordinator.cluster"):
        assert pkg in mods, pkg


# protocol/ is shared by the daemon, the thin client and the admin tool (the codec, the sans-IO client
# connection, the client TLS/SASL settings and properties file): it owns no I/O, so each program drives
# it with its own (asyncio, a selector, blocking sockets). ``ssl`` is allowed: a TLS context is built
# there (and the TLS layer is ssl's MemoryBIO), which reads the certificate files once.
NO_IO = {"socket", "asyncio", "selectors", "threading", "subprocess", "uvloop", "urllib", "http"}


def test_protocol_owns_no_io():
    bad = []
    for path in sorted((ROOT / "protocol").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] in NO_IO]
    assert not bad, "\n".join(bad)


def test_benchmarks_and_tools_import_nothing_from_the_tests():
    # tools/ is installed with the package and used by bench/: it cannot need the test suite
    bad = violations(graph(), lambda n: n.split(".")[0] in ("bench", "tools"),
                     lambda n, t: t.split(".")[0] == "tests")
    assert not bad, "\n".join(bad)


def test_no_two_project_modules_import_each_other():
    assert cycles(graph()) == []


def test_the_coordinator_tests_mirror_the_code():
    # tests/coordinator/<folder>/ holds the tests of coordinator/<folder>/: a test folder names a package
    # (the daemon's own modules, runtime.py, config.py ..., are tested at tests/coordinator's top)
    tests = ROOT / "tests" / "coordinator"
    folders = sorted(d.relative_to(tests) for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__"
                     and any(d.glob("*.py")))
    bad = [f"tests/coordinator/{d.as_posix()} names no package coordinator/{d.as_posix()}" for d in folders
           if not (ROOT / "coordinator" / d / "__init__.py").is_file()]
    assert not bad, "\n".join(bad)
    assert {"core", "core/classic", "core/consumer", "edge", "ops", "store"} <= {d.as_posix() for d in folders}


def test_the_checker_sees_lazy_imports_and_cycles(tmp_path):
    # the checks above would pass vacuously if the reader missed an import inside a function
    src = "def f():\n    from client import network\n    import admin.cli\n"
    path = tmp_path / "m.py"
    path.write_text(src)
    assert imports_of("coordinator.m", path, {"client.network", "admin.cli", "client"}) == {
        "client.network", "admin.cli"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # an indirect import is seen, with its path, and a skipped edge is not followed
    g = {"coordinator.core.a": {"coordinator.core.b"}, "coordinator.core.b": {"coordinator.config"},
         "coordinator.config": {"coordinator.cluster.url"}}
    in_core = lambda n: within(n, CORE)  # noqa: E731
    outside = lambda n, t: not within(t, CORE)  # noqa: E731
    assert violations(g, in_core, outside) == [
        "coordinator.core.a -> coordinator.core.b -> coordinator.config -> coordinator.cluster.url",
        "coordinator.core.a -> coordinator.core.b -> coordinator.config",
        "coordinator.core.b -> coordinator.config -> coordinator.cluster.url",
        "coordinator.core.b -> coordinator.config"]
    assert violations(g, in_core, outside, {("coordinator.core.b", "coordinator.config")}) == []
    assert graph()["herd_cli"] >= {"coordinator.cli", "admin.cli"}
