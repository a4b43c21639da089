"""The ``herd`` command: ``herd serve`` runs the daemon (``coordinator.cli``), ``herd groups``
operates on consumer groups of any Kafka-compatible server (``admin.cli``).

It lives outside both packages so that neither imports the other: ``coordinator/`` (the daemon)
must not import the admin tool, which is a client. Each side is imported only when its command runs
(both for ``herd --help`` or a top-level mistake), so ``herd serve`` never loads the admin tool.
``python -m herd_cli ...`` is the same command; ``python -m coordinator serve ...`` runs the daemon
alone.
"""
from __future__ import annotations

import argparse
import sys

COMMANDS = ("serve", "groups", "acls")


def _one_line_error(parser: argparse.ArgumentParser):
    """argparse prints the whole usage before an argument error; herd prints one line."""
    def error(message):
        parser.exit(2, f"herd: error: {parser.prog}: {message} (see --help)\n")
    return error


def build_parser(commands=COMMANDS) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="herd", description="herd: a Kafka-protocol consumer-group coordinator")
    ap.error = _one_line_error(ap)
    sub = ap.add_subparsers(dest="command", required=True)
    if "serve" in commands:
        from coordinator import cli as serve_cli
        serve_cli.add_parser(sub)
    if "groups" in commands:
        from admin import cli as admin_cli
        admin_cli.add_parser(sub)
    if "acls" in commands:
        from admin import cli as admin_cli
        admin_cli.add_acls_parser(sub)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser((first,) if first in COMMANDS else COMMANDS).parse_args(argv)
    try:
        if args.command == "serve":
            from coordinator import cli as serve_cli
            return serve_cli.run(args)
        from admin import cli as admin_cli
        return admin_cli.run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
