"""``herd groups history``: herd's rebalance flight recorder, read from its HTTP endpoint."""
from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from admin.errors import CliError
from admin.output import _cell, print_json
from admin.session import _strerror


class HttpBase(str):
    """herd's HTTP endpoint, ``scheme://host:port``, with the ``Authorization`` header to send
    (None: none; see :func:`http_credential`)."""
    authorization: str | None = None


def _http_base(text: str | None, command: str = "history", args=None) -> HttpBase:
    if not text:
        raise CliError(f"{command} reads herd's HTTP endpoint: give --http HOST:PORT (the --metrics-port of "
                       "herd serve) or set HERD_HTTP")
    if "://" not in text:
        text = "http://" + text
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise CliError(f"invalid --http {text!r}: expected HOST:PORT")
    try:
        _ = u.port
    except ValueError:
        raise CliError(f"invalid --http {text!r}: bad port") from None
    base = HttpBase(f"{u.scheme}://{u.netloc}")
    base.authorization = http_credential(args) if args is not None else None
    return base


def http_credential(args, environ=None, prompt=None) -> str | None:
    """The ``Authorization`` header for herd's HTTP port (``http_auth_file``), or None:
    ``--http-token`` / ``$HERD_HTTP_TOKEN`` (bearer), or ``--http-user`` / ``$HERD_HTTP_USER`` with the
    password from ``$HERD_HTTP_PASSWORD`` (never a flag: it would show in ``ps``), else asked on the
    terminal. CliError for both at once or a user without a password."""
    env = os.environ if environ is None else environ
    token = getattr(args, "http_token", None) or env.get("HERD_HTTP_TOKEN") or None
    user = getattr(args, "http_user", None) or env.get("HERD_HTTP_USER") or None
    if token and user:
        raise CliError("give either a bearer token (--http-token or HERD_HTTP_TOKEN) or a user "
                       "(--http-user or HERD_HTTP_USER), not both")
    if token:
        if any(c in token for c in "\r\n"):
            raise CliError("the HTTP token holds a line break")
        return f"Bearer {token}"
    if not user:
        return None
    if ":" in user:
        raise CliError(f"invalid --http-user {user!r}: a basic-auth user name cannot hold ':'")
    password = env.get("HERD_HTTP_PASSWORD")
    if password is None:
        if prompt is None and sys.stdin is not None and sys.stdin.isatty():
            import getpass

            prompt = getpass.getpass
        if prompt is None:
            raise CliError(f"--http-user {user}: set HERD_HTTP_PASSWORD to the password (it is never a flag; "
                           "on a terminal herd asks for it)")
        try:
            password = prompt(f"Password of {user} for herd's HTTP port: ")
        except (EOFError, KeyboardInterrupt):
            raise CliError("no password given") from None
    cred = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {cred}"


def fetch_history(base: str, group: str, timeout: float):
    return get_json(base, f"/groups/{urllib.parse.quote(group, safe='')}/history", group, timeout)


def fetch_group_view(base: str, group: str, timeout: float) -> dict | None:
    """herd's console view of a group (``GET /api/group``: commit times, and lag when herd reads
    its data cluster); None when herd does not know the group."""
    try:
        view = get_json(base, f"/api/group?id={urllib.parse.quote(group, safe='')}", group, timeout)
    except _Missing:
        return None
    if not isinstance(view, dict):
        raise CliError(f"unexpected answer from {base}/api/group: not an object")
    return view


class _Missing(CliError):
    pass


def get_json(base: str, path: str, group: str, timeout: float):
    url = f"{base}{path}"
    where = urllib.parse.urlsplit(base).netloc
    authorization = getattr(base, "authorization", None)
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise _Missing(f"Consumer group '{group}' does not exist.") from None
        if exc.code == 401:
            if authorization:
                raise CliError(f"{where} refused the credential (HTTP 401): check the token or the user and "
                               "password against the daemon's http_auth_file") from None
            raise CliError(f"{where} asks for a credential (HTTP 401, http_auth_file): give --http-token or "
                           "HERD_HTTP_TOKEN, or --http-user with HERD_HTTP_PASSWORD") from None
        if exc.code == 403:
            raise CliError(f"{where} refused: not authorized to describe group '{group}' (HTTP 403, "
                           "authorizer = acl)") from None
        raise CliError(f"{where} answered HTTP {exc.code} for {url}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise CliError(f"timed out after {timeout:g}s waiting for {where}") from None
        text = _strerror(reason) if isinstance(reason, OSError) else str(reason)
        raise CliError(f"cannot connect to {where}: {text}") from None
    except TimeoutError:
        raise CliError(f"timed out after {timeout:g}s waiting for {where}") from None
    except http.client.HTTPException:
        # e.g. herd's Kafka port: it reads "GET /..." as a frame far over max_frame_size and closes the
        # connection (http.client.RemoteDisconnected, also a ConnectionResetError: caught here first)
        raise CliError(f"{where} is not herd's HTTP port (--http must be the --metrics-port of herd serve, "
                       "not its Kafka port): it closed the connection without an HTTP answer") from None
    except OSError as exc:
        raise CliError(f"cannot read {url}: {_strerror(exc)}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise CliError(f"{url} did not return JSON") from None


def cmd_history(args) -> int:
    base = _http_base(args.http, "history", args)
    hist = fetch_history(base, args.group, args.timeout)
    if args.output == "json":
        print_json(hist)
        return 0
    if not isinstance(hist, list):
        raise CliError(f"unexpected answer from {base}: not a list of rebalances")
    for line in render_history(args.group, hist):
        print(line)
    return 0


def _ms(v) -> str:
    return "?" if v is None else f"{v} ms"


def _when(ms) -> str:
    if ms is None:
        return "?"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _who(e: dict) -> str:
    if "client_id" not in e:
        return f"[{e.get('member_id')}]"
    s = f"{e.get('client_id') or '?'}@{e.get('client_host') or '?'}"
    if e.get("group_instance_id"):
        s += f" (instance {e['group_instance_id']})"
    return s + f" [{e.get('member_id')}]"


def render_consumer_history(group: str, hist: list[dict]) -> list[str]:
    """A KIP-848 consumer group's flight recorder: each move of its group epoch (or of its target
    assignment epoch), why, and the group after it."""
    out = [f"Consumer group '{group}': {len(hist)} epoch move{'s' if len(hist) != 1 else ''} recorded, "
           "oldest first (times UTC)."]
    for e in hist:
        out.append(f"group epoch {e.get('group_epoch')}  {_when(e.get('wall_ms'))}  {e.get('reason')}")
        members = e.get("members")
        out.append(f"  then       target assignment epoch {e.get('assignment_epoch')}, {e.get('state')}, "
                   f"{_cell(members)} member{'' if members == 1 else 's'}")
    return out


def render_history(group: str, hist: list[dict]) -> list[str]:
    """The flight recorder as a readable timeline, oldest first."""
    if not hist:
        return [f"Group '{group}': no rebalances recorded."]
    if all("group_epoch" in e for e in hist):  # a KIP-848 consumer group
        return render_consumer_history(group, hist)
    reasons: dict[str, int] = {}
    people: dict[str, dict] = {}  # member id -> who (client id, host), from every entry
    for e in hist:
        reasons[e.get("reason")] = reasons.get(e.get("reason"), 0) + 1
        trigger = e.get("trigger") or {}
        for x in [trigger, *(trigger.get("members") or []), *(e.get("awaited") or []),
                  *(e.get("joined") or [])]:
            if x.get("member_id") and "client_id" in x:
                people.setdefault(x["member_id"], x)

    def who(mid):
        return _who(people.get(mid, {"member_id": mid}))
    slow = [(e["slowest_member"]["rejoined_after_ms"], e) for e in hist if e.get("slowest_member")]
    out = [f"Group '{group}': {len(hist)} rebalance{'s' if len(hist) != 1 else ''} recorded, oldest first "
           f"(times UTC).",
           "  reasons: " + ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items(),
                                                                    key=lambda x: (-x[1], str(x[0]))))]
    if slow:
        ms, e = max(slow, key=lambda x: x[0])
        mid = e["slowest_member"]["member_id"]
        out.append(f"  slowest to rejoin: {who(mid)} after {ms} ms (generation {e.get('generation')})")
    for e in hist:
        out.append("")
        gen = e.get("generation")
        head = (f"generation {e.get('previous_generation')} -> {gen if gen is not None else '?'}  "
                f"{_when(e.get('started_wall_ms'))}  {e.get('reason')}  {e.get('outcome')}")
        if e.get("duration_ms") is not None:
            head += (" after " if e.get("outcome") != "in_progress" else " for ") + _ms(e["duration_ms"])
        out.append(head)
        if e.get("detail"):
            out.append(f"  why        {e['detail']}")
        if e.get("client_reason"):
            out.append(f"  client     {e['client_reason']}")
        stall = e.get("stall")
        if stall:  # herd itself stalled: the members got the time back (docs/reliability.md)
            if stall.get("when") == "during":
                out.append(f"  stall      herd stalled {_ms(stall.get('stall_ms'))} during this rebalance")
            else:
                out.append(f"  stall      started {_ms(stall.get('started_after_stall_ms'))} after herd stalled "
                           f"{_ms(stall.get('stall_ms'))}")
        awaited = e.get("awaited") or []
        trig = e.get("trigger")
        if trig:
            if trig.get("member_id"):
                out.append(f"  trigger    {who(trig['member_id'])}")
            for mid in trig.get("member_ids") or []:  # several members at once (LeaveGroup)
                out.append(f"  trigger    {who(mid)}")
        if awaited:
            first = True
            for a in sorted(awaited, key=lambda a: (a.get("rejoined_after_ms") is None,
                                                    -(a.get("rejoined_after_ms") or 0))):
                if a.get("rejoined_after_ms") is not None:
                    what = f"rejoined after {a['rejoined_after_ms']} ms"
                    if a.get("replaced_member_id"):
                        what += f" (replacing {a['replaced_member_id']})"
                else:
                    what = "did not rejoin"
                if a.get("outcome") not in (None, "rejoined"):
                    what += f" ({a['outcome']})"
                out.append(f"  {'waited for' if first else '':<10} {_who(a)}: {what}")
                first = False
        else:
            out.append("  waited for nobody")
        for j in e.get("joined") or []:
            out.append(f"  joined     {_who(j)} after {_ms(j.get('joined_after_ms'))}")
        for r in e.get("removed") or []:
            gone = who(r.get("member_id"))
            out.append(f"  removed    {gone}: {r.get('why')} after {_ms(r.get('after_ms'))}")
        ph = e.get("phases") or {}
        line = (f"  phases     preparing {_ms(ph.get('preparing_ms'))}, "
                f"completing {_ms(ph.get('completing_ms'))}")
        syncs = [s for s in e.get("sync") or [] if s.get("synced_after_ms") is not None]
        if syncs:
            worst = max(syncs, key=lambda s: s["synced_after_ms"])
            line += f"; slowest SyncGroup {worst['synced_after_ms']} ms from {who(worst['member_id'])}"
        out.append(line)
        result = f"  result     protocol {e.get('protocol') or '-'}, {_cell(e.get('members'))} member"
        out.append(result + ("" if e.get("members") == 1 else "s"))
    return out

