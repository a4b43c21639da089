"""``herd groups list | describe | offsets | delete | delete-offsets``, and what they share with
``reset-offsets`` (the clusters of a command, the groups and partitions it names)."""
from __future__ import annotations

import time

from admin.errors import CliError
from admin.output import _note, print_json, print_table
from admin.session import LATEST, Cluster, Deadline, _addr, _error_text, parse_servers
from protocol import errors as E
from protocol.client_security import SecurityConfig
from protocol.consumer import decode_assignment
from protocol.wire import ProtocolError

# classic group states, then KIP-848 consumer group states (Assigning, Reconciling), then Dead
STATES = ("Empty", "Stable", "PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling", "Dead")
TYPES = ("classic", "consumer")
INACTIVE = ("Empty", "Dead")


def command_security(path: str | None) -> SecurityConfig:
    """``--command-config FILE`` -> the connections' TLS / SASL settings (PLAINTEXT without one)."""
    if path is None:
        return SecurityConfig()
    from protocol.client_properties import load_command_config

    try:
        security, ignored = load_command_config(path)
    except OSError as exc:
        raise CliError(f"--command-config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if ignored:
        _note(f"--command-config {path}: not used by herd groups: {', '.join(ignored)}")
    return security


def _clusters(args):
    deadline = Deadline(args.timeout)
    security = command_security(args.command_config)  # one config for every connection, as Kafka's tool
    groups = Cluster(parse_servers(args.bootstrap_server, protocol=security.protocol), deadline, security)
    if args.data_bootstrap_server:
        data = Cluster(parse_servers(args.data_bootstrap_server, "--data-bootstrap-server", security.protocol),
                       deadline, security)
    else:
        data = groups
    return groups, data


def _close(*clusters) -> None:
    for c in clusters:
        c.close()


def _selected_groups(args, cluster: Cluster) -> list[str]:
    names = list(dict.fromkeys([*args.groups, *args.more_groups]))
    if args.all_groups:
        if names:
            raise CliError("give group names or --all-groups, not both")
        return [g["group"] for g in cluster.list_groups([])]
    if not names:
        raise CliError("which group? give GROUP (or --group GROUP, or --all-groups)")
    for n in names:
        if not n:
            raise CliError("the group id must not be empty")
    return names


def _parse_topic(spec: str) -> tuple[str, list[int] | None]:
    topic, sep, parts = spec.partition(":")
    if not topic:
        raise CliError(f"invalid --topic {spec!r}: expected TOPIC or TOPIC:P,P,...")
    if not sep:
        return topic, None
    try:
        ps = sorted({int(x) for x in parts.split(",")})
    except ValueError:
        raise CliError(f"invalid --topic {spec!r}: partitions are numbers (TOPIC:0,1,2)") from None
    if any(p < 0 for p in ps):
        raise CliError(f"invalid --topic {spec!r}: partitions are not negative")
    return topic, ps


def known_partitions(topics, data: Cluster, cluster: Cluster) -> dict[str, set[int] | None]:
    """The partitions of each topic, from the data cluster, else from the coordinator's (herd's
    catalog); None for a topic neither knows."""
    out: dict[str, set[int] | None] = {}
    todo = sorted(set(topics))
    for source in dict.fromkeys([data, cluster]):  # the same cluster once
        if not todo:
            break
        md = source.metadata(todo)
        for t in todo:
            info = md.get(t)
            if info is None or info["error"] == E.UNKNOWN_TOPIC_OR_PARTITION:
                out[t] = None
            elif info["error"] != E.NONE:
                raise CliError(f"cannot read the metadata of topic '{t}': {_error_text(info['error'])}")
            else:
                out[t] = set(info["partitions"])
        todo = [t for t in todo if out[t] is None]
    return out


def _resolve_topics(specs: list[str], data: Cluster, cluster: Cluster) -> list[tuple[str, int]]:
    """The partitions ``--topic`` names: every partition of a bare topic, the given ones of
    TOPIC:P,P (which must exist where the topic is known)."""
    parsed = [_parse_topic(s) for s in specs]
    known = known_partitions([t for t, _ in parsed], data, cluster)
    out = set()
    for t, ps in parsed:
        if ps is None:
            if known[t] is None:
                raise CliError(f"topic '{t}' does not exist")
            ps = known[t]
        out.update((t, p) for p in ps)
    check_partitions(out, known, _where(data, cluster))
    return sorted(out)


def _where(data: Cluster, cluster: Cluster) -> str:
    return " or ".join(dict.fromkeys(c.any().address for c in (data, cluster)))


def check_partitions(tps, known: dict[str, set[int] | None], where: str) -> None:
    """Kafka's check that every partition to reset exists. A topic no cluster knows is let through
    with a warning: herd keeps offsets for any topic (the data may live anywhere)."""
    missing = sorted((t, p) for t, p in tps if known.get(t) is not None and p not in known[t])
    if missing:
        raise CliError('The partitions "' + ",".join(f"{t}-{p}" for t, p in missing) + '" do not exist')
    for t in sorted({t for t, _ in tps if known.get(t) is None}):
        _note(f"warning: topic '{t}' does not exist on {where}: its partitions are not checked")


def _canonical_state(text: str) -> str:
    for s in STATES:
        if s.lower() == text.lower():
            return s
    raise CliError(f"unknown group state {text!r} (one of {', '.join(STATES)})")


def _canonical_type(text: str) -> str:
    if text.lower() in TYPES:
        return text.lower()
    raise CliError(f"unknown group type {text!r} (one of {', '.join(TYPES)})")


def cmd_list(args) -> int:
    states = [_canonical_state(s) for s in (args.state or [])]
    types = [_canonical_type(t) for t in (args.type or [])]
    cluster, _ = _clusters(args)
    try:
        listed = cluster.list_groups(states, types)
        want_states = args.state is not None or args.output == "json"
        if want_states and any(g["state"] is None for g in listed):
            for g in listed:  # ListGroups < v4 has no states: ask each coordinator
                g["state"] = cluster.describe_group(g["group"])[0].group_state
            if states:
                listed = [g for g in listed if g["state"] in states]
    finally:
        cluster.close()
    if args.output == "json":
        print_json({"groups": listed})
    elif args.state is not None or args.type is not None:
        # as kafka-consumer-groups.sh --list [--state] [--type]: GROUP, then what was asked for
        headers = ["GROUP"] + (["STATE"] if args.state is not None else []) + \
            (["TYPE"] if args.type is not None else [])
        print_table(headers, [[g["group"]] + ([g["state"]] if args.state is not None else []) +
                              ([g["type"] or "-"] if args.type is not None else []) for g in listed])
    else:
        for g in listed:
            print(g["group"])
    return 0


def _assignment(member) -> list[tuple[str, int]]:
    try:
        _, asg = decode_assignment(member.member_assignment)
    except ProtocolError:
        return []
    return sorted((tp.topic, p) for tp in asg.assigned_partitions for p in tp.partitions)


def _lag(current, log_end):
    if current is None or log_end is None or log_end < current:
        return None
    return log_end - current


def _consumer_assignment(assignment) -> list[tuple[str, int]]:
    parts = assignment.topic_partitions if assignment else []
    return sorted((tp.topic_name, p) for tp in parts for p in tp.partitions)


def _by_topic(tps) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    return [{"topic": t, "partitions": ps} for t, ps in sorted(by_topic.items())]


def _partition_rows(group: str, committed, owner, data: Cluster, http: str | None, timeout: float) -> list[dict]:
    """One row per committed or owned partition. With ``http`` (herd's HTTP endpoint), herd's own
    view adds each partition's commit age and, when herd reads the data cluster, its lag in seconds
    (and the log end, where this command has none of its own)."""
    tps = sorted(set(committed) | set(owner))
    # a server holding no records (herd) knows no log ends: LOG-END-OFFSET and LAG are unknown
    holds = bool(tps) and data.holds_records()
    log_end = data.list_offsets(tps, LATEST) if holds else {}
    herd_view, now_ms = {}, None
    if http is not None:
        from admin.history import fetch_group_view

        view = fetch_group_view(http, group, timeout)
        if view is not None:
            now_ms = view.get("now_ms")
            herd_view = {(v["topic"], v["partition"]): v for v in view.get("partitions", [])}
    # lag in seconds from the data cluster: how old the next record to consume is (when it was
    # written, the log end passed the committed offset); herd's own estimate (--http) comes first
    behind = {}
    if holds:
        behind = {tp: committed[tp]["offset"] for tp in tps if tp in committed and log_end.get(tp) is not None
                  and committed[tp]["offset"] < log_end[tp]
                  and herd_view.get(tp, {}).get("lag_seconds") is None}
    written = data.record_times(behind) if behind else {}
    wall_ms = time.time() * 1000
    rows = []
    for t, p in tps:
        cur = committed.get((t, p), {}).get("offset")
        end = log_end.get((t, p))
        mem = owner.get((t, p))
        seen = herd_view.get((t, p), {})
        fresh = seen.get("log_end") is not None and seen.get("stale") is False
        if end is None and fresh and seen.get("committed") == cur:
            end = seen["log_end"]  # herd's own sample of the data cluster
        commit_ms = seen.get("commit_ms")
        rows.append({"topic": t, "partition": p, "current_offset": cur, "log_end_offset": end,
                     "lag": _lag(cur, end), "consumer_id": mem["consumer_id"] if mem else None,
                     "group_instance_id": mem["group_instance_id"] if mem else None,
                     "host": mem["host"] if mem else None, "client_id": mem["client_id"] if mem else None,
                     "commit_age_seconds": (None if commit_ms is None or now_ms is None
                                            else round(max(0, now_ms - commit_ms) / 1000, 3)),
                     "lag_seconds": _lag_seconds(cur, end, seen if fresh and seen.get("committed") == cur else {},
                                                 written.get((t, p)), wall_ms)})
    return rows


def describe_consumer_one(group: str, d, conn, cluster: Cluster, data: Cluster, http: str | None = None,
                          timeout: float = 10.0) -> dict:
    """A KIP-848 consumer group (from ConsumerGroupDescribe): members with their epochs, current
    and target assignments, the group and target assignment epochs."""
    committed = cluster.committed(group)
    members, owner = [], {}
    for mem in d.members:
        current = _consumer_assignment(mem.assignment)
        target = _consumer_assignment(mem.target_assignment)
        info = {"consumer_id": mem.member_id, "group_instance_id": mem.instance_id, "host": mem.client_host,
                "client_id": mem.client_id, "partitions": len(current), "member_epoch": mem.member_epoch,
                "assignment": _by_topic(current), "target_assignment": _by_topic(target)}
        members.append(info)
        for tp in current:
            owner[tp] = info
    return {"group": group, "type": "consumer", "state": d.group_state, "protocol_type": "consumer",
            "assignment_strategy": d.assignor_name or None, "group_epoch": d.group_epoch,
            "target_assignment_epoch": d.assignment_epoch,
            "coordinator": {"id": conn.node_id, "host": conn.host, "port": conn.port},
            "member_count": len(d.members), "members": members,
            "partitions": _partition_rows(group, committed, owner, data, http, timeout)}


def describe_one(group: str, cluster: Cluster, data: Cluster, http: str | None = None,
                 timeout: float = 10.0) -> dict | None:
    """Everything describe shows about one group; None when it does not exist. ``http``: herd's
    HTTP endpoint, for commit ages and herd's lag in seconds (see :func:`_partition_rows`)."""
    cd, conn = cluster.describe_consumer_group(group)
    if cd is not None:
        return describe_consumer_one(group, cd, conn, cluster, data, http, timeout)
    d, conn = cluster.describe_group(group)
    committed = cluster.committed(group)
    if d.group_state == "Dead" and not committed:
        return None
    consumer = d.protocol_type in ("consumer", "")
    members, owner = [], {}
    for mem in d.members:
        tps = _assignment(mem) if consumer else []
        info = {"consumer_id": mem.member_id, "group_instance_id": mem.group_instance_id,
                "host": mem.client_host, "client_id": mem.client_id, "partitions": len(tps),
                "assignment": _by_topic(tps)}
        members.append(info)
        for tp in tps:
            owner[tp] = info
    rows = _partition_rows(group, committed, owner, data, http, timeout)
    return {"group": group, "type": "classic", "state": d.group_state, "protocol_type": d.protocol_type,
            "assignment_strategy": d.protocol_data or None,
            "coordinator": {"id": conn.node_id, "host": conn.host, "port": conn.port},
            "member_count": len(d.members), "members": members, "partitions": rows}


def _lag_seconds(cur, end, herds: dict, written_ms, wall_ms: float):
    """herd's estimate when it has one; else 0 when caught up; else the age of the record at the
    committed offset; None when unknown (as LAG, also for a committed offset past the log end)."""
    if herds.get("lag_seconds") is not None:
        return herds["lag_seconds"]
    if cur is None or end is None or cur > end:  # past the log end: unknown, as LAG
        return None
    if cur == end:
        return 0.0
    if written_ms is None:
        return None
    return round(max(0.0, wall_ms - written_ms) / 1000, 3)


def cmd_describe(args) -> int:
    if args.verbose and not args.members:
        raise CliError("--verbose goes with --members")
    http = None
    if getattr(args, "http", None):
        from admin.history import _http_base

        http = _http_base(args.http, "describe", args)
    cluster, data = _clusters(args)
    try:
        names = _selected_groups(args, cluster)
        described, missing = [], []
        for g in names:
            info = describe_one(g, cluster, data, http, args.timeout)
            if info is None:
                missing.append(g)
            else:
                described.append(info)
        # LAG-SECONDS is shown when it can be known: herd's view, or a data cluster holding records
        lag_seconds = http is not None or (any(i["partitions"] for i in described) and data.holds_records())
    finally:
        _close(cluster, data)
    if args.output == "json":
        print_json({"groups": described})
    else:
        printed = [False]

        def separate():  # a blank line between the tables of two groups, none before the first
            if printed[0]:
                print()
            printed[0] = True
        for info in described:
            _print_describe(info, args, separate, with_ages=http is not None, with_lag_seconds=lag_seconds)
    if missing:
        if len(missing) == 1:
            raise CliError(f"Consumer group '{missing[0]}' does not exist.")
        raise CliError("Consumer groups " + ", ".join(f"'{g}'" for g in missing) + " do not exist.")
    return 0


def _seconds_cell(v):
    return None if v is None else f"{v:.1f}"


def _print_describe(info: dict, args, separate=lambda: None, with_ages: bool = False,
                    with_lag_seconds: bool = False) -> None:
    """One group's table, as Kafka's kafka-consumer-groups prints it (same columns, same notes on
    stderr; docs/compatibility.md lists what differs and why), plus herd's LAG-SECONDS and
    COMMIT-AGE after LAG when they can be known."""
    g, state = info["group"], info["state"]
    consumer = info.get("type") == "consumer"
    if state == "Empty" or state == "Dead":
        _note(f"Consumer group '{g}' has no active members.")
    elif state in ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"):
        _note(f"Warning: Consumer group '{g}' is rebalancing.")
    if args.state:
        separate()
        c = info["coordinator"]
        headers = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE"]
        row = [g, f"{_addr(c['host'], c['port'])} ({c['id']})", info["assignment_strategy"], state]
        if consumer:  # as kafka-consumer-groups.sh 4.x for a consumer group
            headers += ["GROUP-EPOCH", "TARGET-ASSIGNMENT-EPOCH"]
            row += [info["group_epoch"], info["target_assignment_epoch"]]
        print_table(headers + ["#MEMBERS"], [row + [info["member_count"]]])
        return
    if args.members:
        _print_members(g, info["members"], args.verbose, separate,
                       target_epoch=info.get("target_assignment_epoch") if consumer else None)
        return
    if info["partitions"]:
        separate()
        headers = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                   "HOST", "CLIENT-ID"]
        rows = [[g, r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"],
                 r["consumer_id"], r["host"], r["client_id"]] for r in info["partitions"]]
        # herd's additions after Kafka's LAG, Kafka's columns otherwise unchanged
        extra = (["LAG-SECONDS"] if with_lag_seconds or with_ages else []) + (["COMMIT-AGE"] if with_ages else [])
        headers[6:6] = extra
        for row, r in zip(rows, info["partitions"], strict=True):
            row[6:6] = [_seconds_cell(r[{"LAG-SECONDS": "lag_seconds", "COMMIT-AGE": "commit_age_seconds"}[h]])
                        for h in extra]
        print_table(headers, rows)


def _print_members(g: str, members: list[dict], verbose: bool, separate, target_epoch=None) -> None:
    """Kafka's --members table: GROUP-INSTANCE-ID only when a member has one; --verbose adds
    Kafka 4's CURRENT-EPOCH, CURRENT-ASSIGNMENT (``t:0,1;u:2``), TARGET-EPOCH and TARGET-ASSIGNMENT
    (the epochs and the target belong to KIP-848 groups, ``target_epoch`` given: "-" for a classic
    group). The header is printed for a group without members too, as Kafka does."""
    with_instance = any(mem["group_instance_id"] for mem in members)
    headers = ["GROUP", "CONSUMER-ID", *(["GROUP-INSTANCE-ID"] if with_instance else []), "HOST", "CLIENT-ID",
               "#PARTITIONS"]
    if verbose:
        headers += ["CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"]
    rows = []
    for mem in members:
        row = [g, mem["consumer_id"], *([mem["group_instance_id"]] if with_instance else []), mem["host"],
               mem["client_id"], mem["partitions"]]
        if verbose and target_epoch is not None:  # a consumer group (KIP-848)
            row += [mem.get("member_epoch"), member_assignment_text(mem["assignment"]), target_epoch,
                    member_assignment_text(mem.get("target_assignment") or [])]
        elif verbose:
            row += [None, member_assignment_text(mem["assignment"]), None, None]
        rows.append(row)
    separate()
    print_table(headers, rows)


def member_assignment_text(assignment: list[dict]) -> str | None:
    """Kafka 4's CURRENT-ASSIGNMENT: ``topic:0,1,2`` per topic, topics joined by ``;``."""
    return ";".join(f"{a['topic']}:{','.join(map(str, a['partitions']))}" for a in assignment) or None


def cmd_offsets(args) -> int:
    cluster, data = _clusters(args)
    try:
        d, _ = cluster.describe_group(args.group)
        committed = cluster.committed(args.group)
    finally:
        _close(cluster, data)
    if d.group_state == "Dead" and not committed:
        raise CliError(f"Consumer group '{args.group}' does not exist.")
    rows = [{"topic": t, "partition": p, **v} for (t, p), v in sorted(committed.items())]
    if args.output == "json":
        print_json({"group": args.group, "state": d.group_state, "offsets": rows})
    elif rows:
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LEADER-EPOCH", "METADATA"],
                    [[args.group, r["topic"], r["partition"], r["offset"], r["leader_epoch"], r["metadata"]]
                     for r in rows])
    else:
        _note(f"Consumer group '{args.group}' has no committed offsets.")
    return 0


def cmd_delete(args) -> int:
    cluster, _ = _clusters(args)
    results = []
    try:
        for group in dict.fromkeys(args.group):
            code = cluster.delete_group(group)
            results.append({"group": group, "deleted": code == E.NONE,
                            "error": None if code == E.NONE else E.error_name(code)})
    finally:
        cluster.close()
    failed = [r for r in results if not r["deleted"]]
    if args.output == "json":
        print_json({"groups": results})
    else:
        ok = [r["group"] for r in results if r["deleted"]]
        if ok:
            names = ", ".join(f"'{g}'" for g in ok)
            print(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        msgs = [_delete_error(r["group"], r["error"]) for r in failed]
        if len(msgs) == 1:
            raise CliError(msgs[0])
        raise CliError(f"{len(msgs)} groups could not be deleted: " + "; ".join(msgs))
    return 0


def _delete_error(group: str, name: str) -> str:
    if name == "NON_EMPTY_GROUP":
        return f"Group '{group}' could not be deleted: the group is not empty (it has active members)."
    if name == "GROUP_ID_NOT_FOUND":
        return f"Group '{group}' could not be deleted: Consumer group '{group}' does not exist."
    code = getattr(E, name, None)
    return f"Group '{group}' could not be deleted: {_error_text(code) if code is not None else name}"


def cmd_delete_offsets(args) -> int:
    cluster, data = _clusters(args)
    try:
        parsed = [_parse_topic(s) for s in args.topic]
        whole = [t for t, ps in parsed if ps is None]
        if whole:  # all partitions: those the cluster knows, else those the group has offsets for
            committed = cluster.committed(args.group)
            md = data.metadata(sorted(set(whole)))
        parts: dict[str, set[int]] = {}
        for t, ps in parsed:
            if ps is None:
                info = md.get(t)
                known = set(info["partitions"]) if info and info["error"] == E.NONE else set()
                known |= {p for (ct, p) in committed if ct == t}
                if not known:
                    raise CliError(f"topic '{t}' does not exist and group '{args.group}' has no offsets "
                                   "for it")
                ps = known
            parts.setdefault(t, set()).update(ps)
        top, codes = cluster.delete_offsets(args.group, {t: sorted(ps) for t, ps in sorted(parts.items())})
    finally:
        _close(cluster, data)
    if top == E.GROUP_ID_NOT_FOUND:
        raise CliError(f"Consumer group '{args.group}' does not exist.")
    if top == E.NON_EMPTY_GROUP or top == E.GROUP_SUBSCRIBED_TO_TOPIC:
        pass  # reported per partition below
    elif top != E.NONE:
        raise CliError(f"cannot delete offsets of group '{args.group}': {_error_text(top)}")
    rows = []
    for t, ps in sorted(parts.items()):
        for p in sorted(ps):
            code = codes.get((t, p), top)
            rows.append({"topic": t, "partition": p, "deleted": code == E.NONE,
                         "error": None if code == E.NONE else E.error_name(code)})
    if args.output == "json":
        print_json({"group": args.group, "partitions": rows})
    else:
        if all(r["deleted"] for r in rows):  # Kafka's tool: this line before the table when all went well
            print(f"Request succeeded for deleting offsets from group {args.group}.")
        print_table(["TOPIC", "PARTITION", "STATUS"],
                    [[r["topic"], r["partition"], "Successful" if r["deleted"] else f"Error: {r['error']}"]
                     for r in rows])
    bad = [r for r in rows if not r["deleted"]]
    if bad:
        r = bad[0]
        why = ("the group is subscribed to the topic" if r["error"] == "GROUP_SUBSCRIBED_TO_TOPIC"
               else _error_text(getattr(E, r["error"], E.UNKNOWN_SERVER_ERROR)))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CliError(f"could not delete the offset of {r['topic']}-{r['partition']} for group "
                       f"'{args.group}': {why}{more}")
    return 0

