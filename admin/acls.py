"""``herd acls list|add|remove``: Kafka's ACLs on herd (or any Kafka-compatible server), with
kafka-acls' flags where they apply: ``--allow-principal``/``--deny-principal``,
``--allow-host``/``--deny-host``, ``--operation`` (repeatable), ``--topic``/``--group``/``--cluster``,
``--resource-pattern-type`` (literal, prefixed; any and match for list and remove), ``--principal``
(list). It speaks CreateAcls, DescribeAcls and DeleteAcls to one broker of ``--bootstrap-server``."""
from __future__ import annotations

import argparse

from admin.commands import command_security
from admin.errors import CliError
from admin.output import print_json, print_table
from admin.session import Cluster, Deadline, parse_servers
from protocol import acls as W
from protocol import errors as E

RESOURCE = {"ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
RESOURCE_NAME = {v: k for k, v in RESOURCE.items()}
PATTERN = {"ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
PATTERN_NAME = {v: k for k, v in PATTERN.items()}
OPERATION = {"ANY": 1, "ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
             "CLUSTERACTION": 9, "DESCRIBECONFIGS": 10, "ALTERCONFIGS": 11, "IDEMPOTENTWRITE": 12}
OPERATION_NAME = {3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE", 2: "ALL",
                  9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE"}
PERMISSION = {"ANY": 1, "DENY": 2, "ALLOW": 3}
PERMISSION_NAME = {2: "DENY", 3: "ALLOW"}


def add_arguments(p: argparse.ArgumentParser, action: str) -> None:
    res = p.add_argument_group("resource (one of)")
    res.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="repeatable; '*' for every topic")
    res.add_argument("--group", action="append", default=[], metavar="GROUP", help="repeatable; '*' for every group")
    res.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    kinds = ("literal", "prefixed") if action == "add" else ("literal", "prefixed", "any", "match")
    default = "literal" if action == "add" else ("any" if action == "list" else "literal")
    p.add_argument("--resource-pattern-type", type=str.lower, choices=kinds, default=default,
                   help=f"how the resource name matches (default: {default})")
    if action == "list":
        p.add_argument("--principal", action="append", default=[], metavar="TYPE:NAME",
                       help="only the ACLs of this principal (repeatable)")
        return
    p.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME", help="e.g. User:alice")
    p.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST", help="default: * (every host)")
    p.add_argument("--deny-host", action="append", default=[], metavar="HOST", help="default: * (every host)")
    p.add_argument("--operation", action="append", default=[], metavar="OP",
                   help="Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs, "
                        "ClusterAction, IdempotentWrite, All (repeatable; default All)")


def _resources(args) -> list[tuple[int, str | None]]:
    out = [(RESOURCE["TOPIC"], t) for t in args.topic] + [(RESOURCE["GROUP"], g) for g in args.group]
    if args.cluster:
        out.append((RESOURCE["CLUSTER"], "kafka-cluster"))
    return out


def _operations(args) -> list[int]:
    ops = []
    for text in args.operation or ["All"]:
        code = OPERATION.get(text.replace("_", "").replace("-", "").upper())
        if code is None or code == 1:
            raise CliError(f"--operation {text}: not an operation (Read, Write, Create, Delete, Alter, Describe, "
                           f"DescribeConfigs, AlterConfigs, ClusterAction, IdempotentWrite, All)")
        ops.append(code)
    return list(dict.fromkeys(ops))


def _entries(args) -> list[tuple[str, str, int]]:
    """(principal, host, permission) from the --allow/--deny flags."""
    for p in args.allow_principal + args.deny_principal:
        kind, sep, _ = p.partition(":")
        if not sep or not kind:
            raise CliError(f"principal {p!r} is not TYPE:NAME (e.g. User:alice)")
    out = []
    for principals, hosts, perm in ((args.allow_principal, args.allow_host, PERMISSION["ALLOW"]),
                                    (args.deny_principal, args.deny_host, PERMISSION["DENY"])):
        for principal in principals:
            for host in hosts or ["*"]:
                out.append((principal, host, perm))
    return out


def _broker(args):
    security = command_security(args.command_config)
    cluster = Cluster(parse_servers(args.bootstrap_server, protocol=security.protocol), Deadline(args.timeout),
                      security)
    return cluster


def _error(code: int, message: str | None) -> str:
    name = E.error_name(code)
    hint = {E.CLUSTER_AUTHORIZATION_FAILED: " (managing ACLs needs ALTER on the cluster, listing DESCRIBE)",
            E.SECURITY_DISABLED: " (the server runs without an authorizer: start herd with --authorizer acl)"}
    return f"{name}: {message or ''}{hint.get(code, '')}".replace(": (", " (")


def cmd_add(args) -> int:
    resources, entries, ops = _resources(args), _entries(args), _operations(args)
    if not resources:
        raise CliError("name a resource: --topic, --group or --cluster")
    if not entries:
        raise CliError("name a principal: --allow-principal or --deny-principal")
    pattern = PATTERN[args.resource_pattern_type.upper()]
    creations = [W.AclBindingData(rtype, name, pattern, principal, host, op, perm)
                 for rtype, name in resources for principal, host, perm in entries for op in ops]
    cluster = _broker(args)
    try:
        resp, _ = cluster.any().call(lambda v: W.CreateAclsRequest(creations))
    finally:
        cluster.close()
    answers = list(zip(creations, resp.results, strict=False))
    added = [_row(c) for c, r in answers if not r.error_code]
    failed = [(c, r) for c, r in answers if r.error_code]
    if args.output == "json":
        print_json({"added": added, "errors": [{**_row(c), "error": _error(r.error_code, r.error_message)}
                                               for c, r in failed]})
    elif added:
        print("Added ACLs:")
        print_table(HEADERS, [list(r.values()) for r in added])
    if failed:
        raise CliError("; ".join(_error(r.error_code, r.error_message) for _, r in failed[:3]))
    return 0


def _filter(args, rtype: int, name: str | None, principal=None, host=None, op=1, perm=1):
    return W.AclBindingData(rtype, name, PATTERN[args.resource_pattern_type.upper()], principal, host, op, perm)


def cmd_list(args) -> int:
    filters = [_filter(args, rtype, name) for rtype, name in _resources(args)] or [_filter(args, 1, None)]
    if args.principal:
        filters = [W.AclBindingData(f.resource_type, f.resource_name, f.pattern_type, p, None, 1, 1)
                   for f in filters for p in args.principal]
    cluster = _broker(args)
    rows: list[dict] = []
    try:
        conn = cluster.any()
        for f in filters:
            resp, _ = conn.call(lambda v, f=f: W.DescribeAclsRequest(f))
            if resp.error_code:
                raise CliError(_error(resp.error_code, resp.error_message))
            for res in resp.resources:
                for a in res.acls:
                    rows.append(_row(W.AclBindingData(res.resource_type, res.resource_name, res.pattern_type,
                                                      a.principal, a.host, a.operation, a.permission_type)))
    finally:
        cluster.close()
    rows = list({tuple(r.values()): r for r in rows}.values())
    if args.output == "json":
        print_json({"acls": rows})
    else:
        print_table(HEADERS, [list(r.values()) for r in rows])
    return 0


def cmd_remove(args) -> int:
    resources = _resources(args)
    if not resources:
        raise CliError("name a resource: --topic, --group or --cluster (remove never guesses 'everything')")
    entries = _entries(args)
    ops = _operations(args) if args.operation else [1]
    filters = []
    for rtype, name in resources:
        if not entries:
            filters.append(_filter(args, rtype, name))
        for principal, host, perm in entries:
            for op in ops:
                filters.append(_filter(args, rtype, name, principal, None if host == "*" and not
                                       (args.allow_host or args.deny_host) else host, op, perm))
    cluster = _broker(args)
    try:
        resp, _ = cluster.any().call(lambda v: W.DeleteAclsRequest(filters))
    finally:
        cluster.close()
    removed, errors = [], []
    for fr in resp.filter_results:
        if fr.error_code:
            errors.append(_error(fr.error_code, fr.error_message))
        removed += [_row(ma.acl) for ma in fr.matching_acls if not ma.error_code]
        errors += [_error(ma.error_code, ma.error_message) for ma in fr.matching_acls if ma.error_code]
    if args.output == "json":
        print_json({"removed": removed, "errors": errors})
    else:
        print(f"Removed {len(removed)} ACL{'s' if len(removed) != 1 else ''}:" if removed else "No ACL matched.")
        if removed:
            print_table(HEADERS, [list(r.values()) for r in removed])
    if errors:
        raise CliError("; ".join(errors[:3]))
    return 0


HEADERS = ["RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"]


def _row(b: W.AclBindingData) -> dict:
    return {"resource_type": RESOURCE_NAME.get(b.resource_type, str(b.resource_type)), "name": b.resource_name,
            "pattern_type": PATTERN_NAME.get(b.pattern_type, str(b.pattern_type)), "principal": b.principal,
            "host": b.host, "operation": OPERATION_NAME.get(b.operation, str(b.operation)),
            "permission": PERMISSION_NAME.get(b.permission_type, str(b.permission_type))}
