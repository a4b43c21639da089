"""The ``herd groups`` argument parser: each command's options, and ``run(args)``."""
from __future__ import annotations

import argparse
import os
import sys

from admin.commands import STATES, cmd_delete, cmd_delete_offsets, cmd_describe, cmd_list, cmd_offsets
from admin.errors import CliError
from admin.history import cmd_history
from admin.reset import INT64_MAX, cmd_reset
from admin.session import DEFAULT_BOOTSTRAP


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("HERD_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
                   help="the coordinator's cluster (default: $HERD_BOOTSTRAP or %(default)s)")
    p.add_argument("--data-bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("HERD_DATA_BOOTSTRAP") or None,
                   help="the cluster holding the partitions, asked for log-end/earliest offsets and "
                        "timestamps (default: $HERD_DATA_BOOTSTRAP or the bootstrap server). herd holds no "
                        "data: point this at your Kafka cluster to see real lag")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS",
                   help="give up after this long (the whole command; default %(default)s)")
    p.add_argument("--output", choices=("table", "json"), default="table",
                   help="table (aligned columns, default) or json (stable keys, for scripts)")
    p.add_argument("--command-config", metavar="FILE", default=None,
                   help="client properties for every connection (TLS, SASL), as Kafka's tool: "
                        "security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location "
                        "(PEM), or librdkafka's ssl.ca.location, sasl.username, ...")


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 86400 seconds, got {text}")
    return v


def _offset_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"out of range: {text} (offsets are 64-bit, at most {INT64_MAX})")
    return v


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line and exit 2 (argparse prints the usage first by default), also
    for unrecognized arguments (which argparse would hand up to the top-level parser)."""

    def error(self, message):
        self.exit(2, f"herd: error: {self.prog}: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def add_parser(sub) -> None:
    groups = sub.add_parser(
        "groups", help="list, describe, reset and delete consumer groups (any Kafka-compatible server)",
        description="Operate on the consumer groups of herd or of any Kafka cluster, like "
                    "kafka-consumer-groups.sh. See docs/operating.md.")
    groups.error = lambda message: _Parser.error(groups, message)  # one line here too
    gsub = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND",
                                 parser_class=_Parser)

    p = gsub.add_parser("list", help="list groups", description="List the groups of every broker.")
    p.add_argument("--state", nargs="*", metavar="STATE", default=None,
                   help="show each group's state; with states, only groups in those states "
                        f"({', '.join(STATES[:-1])})")
    p.add_argument("--type", nargs="*", metavar="TYPE", default=None,
                   help="show each group's type; with types, only groups of those types (classic, consumer)")
    _common(p)
    p.set_defaults(func=cmd_list)

    p = gsub.add_parser("describe", help="offsets, lag and owners of each partition; --members; --state",
                        description="Describe groups: by default one row per partition with the "
                                    "committed offset, log-end offset, lag and the member that owns it.")
    _group_args(p)
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="one row per member")
    view.add_argument("--state", action="store_true", help="the group's coordinator, strategy, state, size")
    view.add_argument("--offsets", action="store_true", help="one row per partition (the default)")
    p.add_argument("--verbose", action="store_true", help="with --members: each member's partitions")
    p.add_argument("--http", metavar="HOST:PORT", default=os.environ.get("HERD_HTTP") or None,
                   help="herd's HTTP endpoint (herd serve --metrics-port; default $HERD_HTTP): adds each "
                        "partition's commit age and, when herd reads the data cluster, its lag in seconds "
                        "(LAG-SECONDS, COMMIT-AGE, in seconds)")
    _http_credential_args(p)
    _common(p)
    p.set_defaults(func=cmd_describe)

    p = gsub.add_parser("offsets", help="a group's committed offsets",
                        description="Show a group's committed offsets (no log-end lookups).")
    p.add_argument("group", metavar="GROUP")
    _common(p)
    p.set_defaults(func=cmd_offsets)

    p = gsub.add_parser("reset-offsets", help="plan (default) or --execute new committed offsets",
                        description="Reset the committed offsets of inactive groups (Empty or unknown). "
                                    "Prints the plan; commits it only with --execute.")
    _group_args(p)
    scope = p.add_mutually_exclusive_group()  # required, unless --from-file: checked in cmd_reset
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P,...]",
                       help="a topic, or some of its partitions (repeatable)")
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    spec = p.add_mutually_exclusive_group(required=True)
    spec.add_argument("--to-earliest", action="store_true", help="the earliest offset")
    spec.add_argument("--to-latest", action="store_true", help="the log-end offset")
    spec.add_argument("--to-offset", type=_offset_arg, metavar="N", help="offset N")
    spec.add_argument("--shift-by", type=_offset_arg, metavar="N",
                      help="the committed offset plus N (may be < 0)")
    spec.add_argument("--to-datetime", metavar="ISO8601",
                      help="the first offset at or after this time, e.g. 2024-05-01T12:00:00.000 "
                           "(no zone: local time)")
    spec.add_argument("--by-duration", metavar="PnDTnHnMnS",
                      help="the first offset at or after now minus this duration")
    spec.add_argument("--to-current", action="store_true", help="the committed offset (log end where none)")
    spec.add_argument("--from-file", metavar="FILE.csv",
                      help="the offsets in FILE: TOPIC,PARTITION,OFFSET lines for one group, "
                           "GROUP,TOPIC,PARTITION,OFFSET for several (as written by --export)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only print the plan (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the plan")
    p.add_argument("--export", action="store_true",
                   help="print the plan as CSV (TOPIC,PARTITION,OFFSET; with GROUP first unless one "
                        "group is named), for --from-file")
    p.add_argument("--no-clamp", action="store_true",
                   help="keep --to-offset/--shift-by/--from-file offsets outside [earliest, log end]")
    _common(p)
    p.set_defaults(func=cmd_reset)

    p = gsub.add_parser("delete", help="delete inactive groups and their offsets",
                        description="Delete groups (only Empty groups can be deleted).")
    p.add_argument("--group", action="append", required=True, metavar="GROUP", help="repeatable")
    _common(p)
    p.set_defaults(func=cmd_delete)

    p = gsub.add_parser("delete-offsets", help="delete a group's committed offsets of some topics",
                        description="Delete committed offsets of topics the group does not consume.")
    p.add_argument("--group", required=True, metavar="GROUP")
    p.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,P,...]", help="repeatable")
    _common(p)
    p.set_defaults(func=cmd_delete_offsets)

    p = gsub.add_parser("history", help="herd's rebalance flight recorder for a group",
                        description="Why did the group rebalance, and who was slow? Reads the flight "
                                    "recorder of a herd daemon from its HTTP endpoint (--metrics-port).")
    p.add_argument("group", metavar="GROUP")
    p.add_argument("--http", metavar="HOST:PORT", default=os.environ.get("HERD_HTTP") or None,
                   help="the daemon's HTTP endpoint (herd serve --metrics-port; default $HERD_HTTP)")
    _http_credential_args(p)
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS")
    p.add_argument("--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_history)


def add_acls_parser(sub) -> None:
    from admin import acls

    top = sub.add_parser(
        "acls", help="list, add and remove Kafka ACLs (herd with --authorizer acl, or any Kafka cluster)",
        description="Manage ACLs like kafka-acls.sh (CreateAcls, DescribeAcls, DeleteAcls). See the "
                    "'Authorization' section of docs/operating.md.")
    top.error = lambda message: _Parser.error(top, message)
    asub = top.add_subparsers(dest="acls_command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, func, text in (("list", acls.cmd_list, "list ACLs (all, or of --topic/--group/--cluster)"),
                             ("add", acls.cmd_add, "add ACLs (--allow-principal/--deny-principal, --operation)"),
                             ("remove", acls.cmd_remove, "remove the ACLs matching the flags")):
        p = asub.add_parser(name, help=text, description=text)
        _common(p)
        acls.add_arguments(p, name)
        p.set_defaults(func=func)


def _http_credential_args(p) -> None:
    """The credential for herd's HTTP port when it has an http_auth_file (admin.history.http_credential)."""
    p.add_argument("--http-token", metavar="TOKEN", default=None,
                   help="send this bearer token to the --http port (default $HERD_HTTP_TOKEN; prefer the "
                        "variable: a flag shows in ps)")
    p.add_argument("--http-user", metavar="USER", default=None,
                   help="send HTTP basic auth as USER to the --http port (default $HERD_HTTP_USER), the "
                        "password from $HERD_HTTP_PASSWORD (asked for on a terminal)")


def _group_args(p) -> None:
    p.add_argument("groups", nargs="*", metavar="GROUP", help="group ids (several allowed)")
    p.add_argument("--group", dest="more_groups", action="append", default=[], metavar="GROUP",
                   help="another group (repeatable; as kafka-consumer-groups.sh)")
    p.add_argument("--all-groups", action="store_true", help="every group")


def run(args) -> int:
    """Run the ``herd groups`` command parsed into ``args``: its exit code; a ``CliError`` is
    printed as one line (exit 2)."""
    try:
        return args.func(args)
    except CliError as exc:
        print(f"herd: error: {exc}", file=sys.stderr)
        return 2
