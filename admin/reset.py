"""``herd groups reset-offsets``: argument checks, --from-file plans, one plan per group, then the
commits (only with --execute)."""
from __future__ import annotations

import csv
import datetime as dt
import re
import sys
import time

from admin.commands import (
    INACTIVE,
    _close,
    _clusters,
    _resolve_topics,
    _selected_groups,
    _where,
    check_partitions,
    known_partitions,
)
from admin.errors import CliError
from admin.output import _cell, _note, print_json, print_table
from admin.session import EARLIEST, LATEST, Cluster, _error_text, _strerror
from protocol import errors as E

INT64_MAX = (1 << 63) - 1

_NUM = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"^P(?:{_NUM}D)?(?:T(?:{_NUM}H)?(?:{_NUM}M)?(?:{_NUM}S)?)?$")


def parse_duration(text: str) -> float:
    """ISO-8601 duration (PnDTnHnMnS, as Java's Duration.parse) in seconds."""
    mt = _DURATION.match(text.strip().upper())
    if not mt or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise CliError(f"invalid --by-duration {text!r}: expected an ISO-8601 duration like PT1H30M or P1D")
    d, h, mi, s = (float(x) if x else 0.0 for x in mt.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def parse_datetime(text: str) -> int:
    """ISO-8601 date-time to epoch ms; without a zone it is local time (as kafka-consumer-groups.sh)."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(f"invalid --to-datetime {text!r}: expected e.g. 2024-05-01T12:00:00.000 or "
                       "2024-05-01T12:00:00+02:00") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


class _Refused(Exception):
    """A group this reset leaves alone (active, or no plan can be made for it); the others go on."""


def _no_records(data: Cluster, needs: str) -> str:
    return (f"{needs}, which {data.any().address} does not have: it holds no records (a coordinator "
            "like herd); give --data-bootstrap-server, the Kafka cluster that holds the partitions")


def _check_reset_args(args) -> int | None:
    """Argument checks that need no server; returns the timestamp of --to-datetime/--by-duration."""
    if args.from_file is None and not args.topic and not args.all_topics:
        raise CliError("one of the arguments --topic --all-topics is required (or --from-file)")
    if args.from_file is not None and (args.topic or args.all_topics):
        raise CliError("--from-file takes the partitions from the file: no --topic or --all-topics")
    if args.export and args.output == "json":
        raise CliError("--export prints CSV: it does not go with --output json")
    if args.to_datetime is not None:
        return parse_datetime(args.to_datetime)
    if args.by_duration is not None:
        return int((time.time() - parse_duration(args.by_duration)) * 1000)
    return None


def read_reset_plan(path: str, group: str | None) -> dict[str, dict[tuple[str, int], int]]:
    """A --from-file CSV, as Kafka's tool reads it (and --export writes it): TOPIC,PARTITION,OFFSET
    lines for ``group``, the one group named, or GROUP,TOPIC,PARTITION,OFFSET lines."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise CliError(f"cannot read --from-file {path}: {_strerror(exc)}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CliError(f"cannot read --from-file {path}: {exc}") from None
    expected = ("TOPIC,PARTITION,OFFSET or " if group is not None else "") + "GROUP,TOPIC,PARTITION,OFFSET"
    plan: dict[str, dict[tuple[str, int], int]] = {}
    for n, row in enumerate(rows, 1):
        row = [x.strip() for x in row]
        if not any(row):
            continue
        if len(row) == 3 and group is not None:
            g, (t, p, o) = group, row
        elif len(row) == 4:
            g, t, p, o = row
        elif len(row) == 3:  # a one-group export, and not one group named: as Kafka's tool, ask for it
            raise CliError(f"--from-file {path} line {n} has no group column (TOPIC,PARTITION,OFFSET): name the "
                           f"one group it is for with --group GROUP")
        else:
            raise CliError(f"invalid --from-file {path} line {n}: expected {expected}")
        try:
            p, o = int(p), int(o)
        except ValueError:
            raise CliError(f"invalid --from-file {path} line {n}: partition and offset are numbers") from None
        if not t or p < 0 or not 0 <= o <= INT64_MAX:
            raise CliError(f"invalid --from-file {path} line {n}: expected a topic, a partition and an "
                           f"offset from 0 to {INT64_MAX}")
        plan.setdefault(g, {})[(t, p)] = o
    if not plan:
        raise CliError(f"--from-file {path} has no offsets")
    return plan


def _reset_scope(args, names, file_plan, data: Cluster, cluster: Cluster) -> list[tuple[str, int]]:
    """What holds for every group: whether the data cluster can answer what the reset needs, and
    the partitions of --topic (checked, as those of --from-file)."""
    needs = ("--to-latest needs the log-end offsets" if args.to_latest else
             "--to-datetime needs the records' timestamps" if args.to_datetime is not None else
             "--by-duration needs the records' timestamps" if args.by_duration is not None else None)
    if needs and not data.holds_records():
        raise CliError(_no_records(data, needs))
    tps: list[tuple[str, int]] = []
    if args.topic:
        tps = _resolve_topics(args.topic, data, cluster)
    elif file_plan is not None:
        listed = {tp for g in names for tp in file_plan.get(g, {})}
        check_partitions(listed, known_partitions({t for t, _ in listed}, data, cluster), _where(data, cluster))
    return tps


def _plan_group(args, group: str, cluster: Cluster, data: Cluster, tps, ts, file_plan) -> dict:
    d, _ = cluster.describe_group(group)
    res = {"group": group, "state": d.group_state, "error": None, "committed": False, "partitions": []}
    try:
        if d.group_state not in INACTIVE:
            raise _Refused(f"Assignments can only be reset if the group '{group}' is inactive, but the "
                           f"current state is {d.group_state}.")
        committed = cluster.committed(group)
        requested = None
        if file_plan is not None:
            requested = file_plan.get(group)
            if requested is None:
                raise _Refused(f"No reset plan for group '{group}' found in {args.from_file}.")
            tps = sorted(requested)
        elif args.all_topics:
            tps = sorted(committed)
        res["partitions"] = _plan(args, group, committed, data, tps, ts, requested)
        if not res["partitions"]:
            _note(f"Group '{group}' has no committed offsets to reset.")
    except _Refused as exc:
        res["error"] = str(exc)
    return res


def _plan(args, group: str, committed: dict, data: Cluster, tps, ts, requested) -> list[dict]:
    """The new offset of each of ``tps``; _Refused when one cannot be given."""
    cur = {tp: committed[tp]["offset"] for tp in tps if tp in committed}
    ends_known = data.holds_records()
    new: dict[tuple[str, int], int | None] = {}
    clamp = False
    if requested is not None:
        new = dict(requested)
        clamp = True
    elif args.to_earliest:
        new = data.list_offsets(tps, EARLIEST)
    elif args.to_latest:
        new = data.list_offsets(tps, LATEST)
    elif args.to_offset is not None:
        new = dict.fromkeys(tps, args.to_offset)
        clamp = True
    elif args.shift_by is not None:
        missing = [tp for tp in tps if tp not in cur]
        if missing:
            t, p = missing[0]
            raise _Refused(f"cannot shift the offset of {t}-{p}: group '{group}' has no committed offset "
                           "for it")
        new = {tp: max(0, cur[tp] + args.shift_by) for tp in tps}
        clamp = True
    elif ts is not None:
        new = data.list_offsets(tps, ts)
        no_match = [tp for tp in tps if new.get(tp) is None]
        if no_match:  # no record at or after that time: the log end, as Kafka does
            latest = data.list_offsets(no_match, LATEST)
            for t, p in no_match:
                if latest.get((t, p)) is not None:
                    _note(f"warning: Partition {p} from topic {t} is empty. Falling back to latest known offset.")
                    new[(t, p)] = latest[(t, p)]
    elif args.to_current:
        new = dict(cur)
        rest = [tp for tp in tps if tp not in cur]
        if rest and not ends_known:
            t, p = rest[0]
            raise _Refused(_no_records(data, f"--to-current needs the log-end offset of {t}-{p} (group "
                                             f"'{group}' has no committed offset for it)"))
        if rest:
            new.update(data.list_offsets(rest, LATEST))
    if clamp and not args.no_clamp and tps and ends_known:
        earliest, latest = data.list_offsets(tps, EARLIEST), data.list_offsets(tps, LATEST)
        for tp in tps:
            want, lo, hi = new[tp], earliest.get(tp), latest.get(tp)
            if hi is not None and want > hi:
                new[tp] = hi
            elif lo is not None and want < lo:
                new[tp] = lo
            if new[tp] != want:
                _note(f"warning: {tp[0]}-{tp[1]}: offset {want} is outside the log range "
                      f"[{_cell(lo)}, {_cell(hi)}]; using {new[tp]} (--no-clamp keeps {want})")
    unknown = [tp for tp in tps if new.get(tp) is None]
    if unknown:
        t, p = unknown[0]
        raise _Refused(f"cannot find an offset for {t}-{p}: no such partition, or its leader is unavailable")
    for (t, p) in tps:  # only --no-clamp (or unknown log ends) gets here with such offsets
        if new[(t, p)] < 0:
            raise _Refused(f"cannot reset {t}-{p} to offset {new[(t, p)]}: offsets are not negative")
        if new[(t, p)] > INT64_MAX:
            raise _Refused(f"cannot reset {t}-{p} to offset {new[(t, p)]}: offsets are at most {INT64_MAX}")
    return [{"topic": t, "partition": p, "current_offset": cur.get((t, p)), "new_offset": new[(t, p)]}
            for t, p in tps]


def _commit_plans(cluster: Cluster, results: list[dict]) -> str | None:
    """Commit each planned group in turn; when one fails to answer (deadline, lost connection),
    stop and return what was done, for the final error."""
    for i, res in enumerate(results):
        if res["error"] is not None or not res["partitions"]:
            continue
        for r in res["partitions"]:
            r["error"] = None
        try:
            codes = cluster.commit(res["group"], {(r["topic"], r["partition"]): r["new_offset"]
                                                  for r in res["partitions"]})
        except CliError as exc:
            res["committed"], res["error"] = None, str(exc)  # unknown: the commit may have landed
            for r in results[i + 1:]:
                if r["error"] is None and r["partitions"]:
                    r["error"] = f"not committed: the command stopped at group '{res['group']}'"
            done = [r["group"] for r in results if r["committed"]]
            rest = [r["group"] for r in results if r["committed"] is False]
            return "; ".join([str(exc), "reset: " + (_quoted(done) or "no group"),
                              f"unknown whether '{res['group']}' was reset"]
                             + (["not reset: " + _quoted(rest)] if rest else []))
        failed = []
        for r in res["partitions"]:
            code = codes.get((r["topic"], r["partition"]), E.UNKNOWN_SERVER_ERROR)
            if code != E.NONE:
                r["error"] = E.error_name(code)
                failed.append(f"{r['topic']}-{r['partition']}: {_error_text(code)}")
        res["committed"] = not failed
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            res["error"] = f"could not commit {res['group']} {failed[0]}{more}"
    return None


def _quoted(names) -> str:
    return ", ".join(f"'{n}'" for n in names)


def cmd_reset(args) -> int:
    ts = _check_reset_args(args)
    named = list(dict.fromkeys([*args.groups, *args.more_groups]))
    single = named[0] if len(named) == 1 and not args.all_groups else None  # Kafka's CSV without GROUP
    file_plan = read_reset_plan(args.from_file, single) if args.from_file is not None else None
    cluster, data = _clusters(args)
    stopped = None
    try:
        if file_plan is not None and not named and not args.all_groups:
            names = list(file_plan)  # the groups of the file
        else:
            names = _selected_groups(args, cluster)
        tps = _reset_scope(args, names, file_plan, data, cluster)
        # plan every group before committing any, so that a refused group stops nothing
        results = [_plan_group(args, g, cluster, data, tps, ts, file_plan) for g in names]
        clamps = args.to_offset is not None or args.shift_by is not None or args.from_file is not None
        if clamps and not args.no_clamp and any(res["partitions"] for res in results) and not data.holds_records():
            _note(f"warning: {data.any().address} holds no records, so the log range is unknown: offsets are "
                  "not clamped to it (give --data-bootstrap-server to clamp them)")
        if args.execute:
            stopped = _commit_plans(cluster, results)
    finally:
        _close(cluster, data)
    planned = [res for res in results if res["partitions"]]
    if args.output == "json":
        print_json({"executed": bool(args.execute), "groups": results})
    elif args.export:
        out = csv.writer(sys.stdout, lineterminator="\n")
        for res in planned:
            for r in res["partitions"]:
                out.writerow(([] if single else [res["group"]]) + [r["topic"], r["partition"], r["new_offset"]])
    elif planned:
        # Kafka's columns (the committed offset being replaced is in --output json)
        print_table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                    [[res["group"], r["topic"], r["partition"], r["new_offset"]]
                     for res in planned for r in res["partitions"]])
    if not args.execute and any(res["error"] is None for res in results):
        _note("Dry run: nothing was committed. Add --execute to commit these offsets.")
    if stopped:
        raise CliError(stopped)
    bad = [res for res in results if res["error"] is not None]
    if len(bad) == 1:
        raise CliError(bad[0]["error"])
    if bad:
        for res in bad:
            _note(res["error"])
        raise CliError(f"{len(bad)} of {len(results)} groups were not reset: {_quoted(r['group'] for r in bad)}")
    return 0

