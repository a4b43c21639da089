"""A sans-IO Kafka client connection: bytes in, responses out; no sockets, no clock, no threads.

``Connection`` does the framing, the request/response headers, correlation ids, and the
ApiVersions handshake:

    conn = Connection(client_id="me")
    conn.initiate()                      # queues an ApiVersions request
    sock.send(conn.data_to_send())
    for event in conn.receive(sock.recv(65536)):
        ...                              # Ready(versions) once, then Response(...) per request
    corr = conn.send(request, version)   # after Ready; bytes wait in data_to_send()

Negotiation follows KIP-511: ask ApiVersions at our newest version; a broker that does not know it
answers UNSUPPORTED_VERSION with a v0 body listing its ApiVersions range, and we ask again at the
highest version both know. A response that does not decode at the version asked (some brokers get
the flexible versions wrong) is retried at v0, which every broker answers. The version used per API
afterwards is the highest both sides support (``negotiate``).

With ``sasl=(mechanism, username, password)`` the handshake goes on, as Kafka's clients do, after
ApiVersions: SaslHandshake v1 names the mechanism, then SaslAuthenticate (at the highest version
both sides know) carries the mechanism's tokens (``protocol.sasl``) until the mechanism is done;
only then ``Ready``. A refusal raises :class:`AuthenticationFailed` (a ``ConnectionBroken``) with
the broker's error message: trying again with the same credentials cannot succeed.

Any broken framing, unknown correlation id or failed handshake raises :class:`ConnectionBroken`;
the owner then closes the socket. A single response that does not decode is reported as a
``Response`` whose ``error`` is set, so that one request fails and the connection stays usable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol import acls, messages
from protocol import errors as codes
from protocol.framing import FrameDecoder, frame
from protocol.headers import decode_response_header, encode_request_header
from protocol.wire import ProtocolError

_RESPONSES = {**messages.RESPONSES, **acls.RESPONSES}  # the ACL APIs' codec is hand-written

__all__ = [
    "AuthenticationFailed",
    "CLIENT_VERSIONS",
    "Connection",
    "ConnectionBroken",
    "Ready",
    "Response",
    "negotiate",
    "SOFTWARE_NAME",
    "SOFTWARE_VERSION",
]

SOFTWARE_NAME = "herd-python"
SOFTWARE_VERSION = "0.1.0"
API_VERSIONS = messages.ApiVersionsRequest.API_KEY
SASL_HANDSHAKE = messages.SaslHandshakeRequest.API_KEY
SASL_AUTHENTICATE = messages.SaslAuthenticateRequest.API_KEY

# The APIs the client sends, and the versions whose semantics the coordinator code handles.
CLIENT_VERSIONS: dict[int, tuple[int, int]] = {
    messages.ApiVersionsRequest.API_KEY: (0, messages.ApiVersionsRequest.MAX_VERSION),
    messages.MetadataRequest.API_KEY: (0, messages.MetadataRequest.MAX_VERSION),
    messages.OffsetCommitRequest.API_KEY: (0, messages.OffsetCommitRequest.MAX_VERSION),
    messages.OffsetFetchRequest.API_KEY: (1, messages.OffsetFetchRequest.MAX_VERSION),
    messages.FindCoordinatorRequest.API_KEY: (0, messages.FindCoordinatorRequest.MAX_VERSION),
    messages.JoinGroupRequest.API_KEY: (0, messages.JoinGroupRequest.MAX_VERSION),
    messages.HeartbeatRequest.API_KEY: (0, messages.HeartbeatRequest.MAX_VERSION),
    messages.LeaveGroupRequest.API_KEY: (0, messages.LeaveGroupRequest.MAX_VERSION),
    messages.SyncGroupRequest.API_KEY: (0, messages.SyncGroupRequest.MAX_VERSION),
}


def negotiate(
    broker: dict[int, tuple[int, int]], ours: dict[int, tuple[int, int]] = CLIENT_VERSIONS
) -> dict[int, int]:
    """api key -> the highest version both sides support; APIs without overlap are left out."""
    out = {}
    for key, (lo, hi) in ours.items():
        theirs = broker.get(key)
        if theirs is None:
            continue
        top = min(hi, theirs[1])
        if top >= max(lo, theirs[0]):
            out[key] = top
    return out


class ConnectionBroken(Exception):
    """The connection cannot go on (bad frame, unexpected correlation id, failed handshake).
    ``frame_size`` is the size prefix of a response larger than ``max_frame_size`` (often a server
    that is not Kafka at all), else None."""

    def __init__(self, message: str, frame_size: int | None = None):
        super().__init__(message)
        self.frame_size = frame_size


class AuthenticationFailed(ConnectionBroken):
    """The SASL handshake failed for good: wrong credentials, a mechanism the broker does not
    enable, a broker listener without SASL. ``str()`` says why (the broker's message if it sent one).

    The same facts, for a tool that words them its own way: ``reason`` is one of ``no_sasl`` (the
    broker offers no SaslHandshake v1 / SaslAuthenticate), ``mechanism`` (not enabled; ``enabled``
    lists the broker's), ``not_sasl_listener`` (ILLEGAL_SASL_STATE), ``handshake`` (another
    SaslHandshake error, ``error_code``) or ``refused`` (SaslAuthenticate failed: ``error_code`` and
    the broker's ``broker_message``, or the mechanism's own complaint in ``broker_message`` with
    ``error_code`` None); ``mechanism`` and ``username`` are the ones tried."""

    def __init__(self, message: str, reason: str = "refused", mechanism: str | None = None,
                 username: str | None = None, enabled: tuple[str, ...] = (), error_code: int | None = None,
                 broker_message: str | None = None):
        super().__init__(message)
        self.reason, self.mechanism, self.username = reason, mechanism, username
        self.enabled, self.error_code, self.broker_message = tuple(enabled), error_code, broker_message


@dataclass(frozen=True)
class Ready:
    """The handshake finished: ``versions`` maps api key -> negotiated version."""

    versions: dict
    broker_versions: dict


@dataclass(frozen=True)
class Response:
    correlation_id: int
    api_key: int
    api_version: int
    message: Any = None  # the decoded response, or None when ``error`` is set
    error: Exception | None = None


class Connection:
    """One client connection's protocol state. See the module docstring."""

    def __init__(
        self,
        client_id: str | None = "herd",
        max_frame_size: int = 100 * 1024 * 1024,
        api_versions_version: int = messages.ApiVersionsRequest.MAX_VERSION,
        sasl: tuple[str, str, str] | None = None,
        mechanism_factory=None,
        software: tuple[str, str] = (SOFTWARE_NAME, SOFTWARE_VERSION),
    ):
        self.client_id = client_id
        self._software = software  # ApiVersions v3+: client_software_name, client_software_version
        self._decoder = FrameDecoder(max_frame_size)
        self._out = bytearray()
        self._next_corr = 0
        self._inflight: dict[int, tuple[int, int]] = {}  # corr -> (api_key, version)
        self._handshake_version = api_versions_version
        self._handshake_corr: int | None = None
        self._handshake_attempts = 0
        self.versions: dict[int, int] | None = None
        self.broker_versions: dict[int, tuple[int, int]] | None = None
        self._sasl = sasl  # (mechanism, username, password)
        self._mechanism_factory = mechanism_factory
        self._mechanism = None
        self._sasl_corr: int | None = None
        self._sasl_auth_version = 0
        self._pending_versions: dict[int, int] | None = None

    def __repr__(self) -> str:  # never the password
        mech = f" sasl={self._sasl[0]}" if self._sasl else ""
        return f"<Connection client_id={self.client_id!r}{mech} ready={self.ready}>"

    # -- state -------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.versions is not None

    @property
    def in_flight(self) -> list[int]:
        """Correlation ids of user requests awaiting a response (handshake excluded)."""
        return [c for c in self._inflight if c != self._handshake_corr and c != self._sasl_corr]

    def awaiting(self) -> list[tuple[int, int, int]]:
        """``(correlation id, api key, version)`` of every request sent and not yet answered, the
        handshake's included, oldest first: what a blocking owner is waiting for."""
        return [(c, k, v) for c, (k, v) in self._inflight.items()]

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    # -- sending -----------------------------------------------------------------------------
    def initiate(self) -> None:
        """Queue the ApiVersions handshake request."""
        self._send_handshake(self._handshake_version)

    def _send_handshake(self, version: int) -> None:
        self._handshake_attempts += 1
        if self._handshake_attempts > 4:
            raise ConnectionBroken("ApiVersions negotiation did not converge")
        self._handshake_version = version
        req = messages.ApiVersionsRequest(
            client_software_name=self._software[0], client_software_version=self._software[1]
        )
        self._handshake_corr = self._queue(req, version)

    def send(self, request, version: int) -> int:
        """Queue ``request`` encoded at ``version``; return its correlation id."""
        if not self.ready:
            raise ConnectionBroken("send before the ApiVersions handshake finished")
        return self._queue(request, version)

    def _queue(self, request, version: int) -> int:
        corr = self._next_corr
        self._next_corr = (self._next_corr + 1) & 0x7FFFFFFF
        body = bytearray()
        encode_request_header(body, request.API_KEY, version, corr, self.client_id)
        request.encode_into(body, version)
        self._out += frame(bytes(body))
        self._inflight[corr] = (request.API_KEY, version)
        return corr

    # -- receiving ---------------------------------------------------------------------------
    def receive(self, data: bytes) -> list:
        """Feed bytes read from the socket; return ``Ready`` / ``Response`` events in order."""
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            raise ConnectionBroken(f"bad frame: {exc}", getattr(exc, "size", None)) from None
        events = []
        for payload in frames:
            if len(payload) < 4:
                raise ConnectionBroken("response shorter than its header")
            corr = int.from_bytes(payload[:4], "big", signed=True)
            entry = self._inflight.pop(corr, None)
            if entry is None:
                raise ConnectionBroken(f"response with unknown correlation id {corr}")
            api_key, version = entry
            if corr == self._sasl_corr:
                ev = self._on_sasl(payload, api_key, version)
                if ev is not None:
                    events.append(ev)
                continue
            if corr == self._handshake_corr:
                ev = self._on_handshake(payload, version)
                if ev is not None:
                    events.append(ev)
                continue
            cls = _RESPONSES[api_key]
            try:
                _, pos = decode_response_header(payload, api_key, version)
                msg = cls.decode(payload, version, pos)
            except ProtocolError as exc:
                events.append(Response(corr, api_key, version, None, exc))
            else:
                events.append(Response(corr, api_key, version, msg))
        return events

    def _on_handshake(self, payload: bytes, version: int):
        self._handshake_corr = None
        if len(payload) < 6:
            raise ConnectionBroken("truncated ApiVersions response")
        error_code = int.from_bytes(payload[4:6], "big", signed=True)
        resp = None
        if error_code != codes.UNSUPPORTED_VERSION:
            try:
                resp = messages.ApiVersionsResponse.decode(payload, version, 4)
            except ProtocolError:
                resp = None
        if error_code == codes.UNSUPPORTED_VERSION:
            # KIP-511: the body is v0, listing the broker's ApiVersions range.
            try:
                v0 = messages.ApiVersionsResponse.decode(payload, 0, 4)
                ranges = {k.api_key: k.max_version for k in v0.api_keys}
            except ProtocolError:
                ranges = {}
            retry = min(ranges.get(API_VERSIONS, 0), version - 1) if version > 0 else -1
            if retry < 0:
                raise ConnectionBroken("broker rejected every ApiVersions version")
            self._send_handshake(retry)
            return None
        if resp is None:
            if version == 0:
                raise ConnectionBroken("undecodable ApiVersions v0 response")
            self._send_handshake(0)
            return None
        if resp.error_code != codes.NONE:
            raise ConnectionBroken(f"ApiVersions failed: {codes.error_name(resp.error_code)}")
        self.broker_versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        if self._sasl is not None:
            self._pending_versions = negotiate(self.broker_versions)
            self._start_sasl()
            return None
        self.versions = negotiate(self.broker_versions)
        return Ready(dict(self.versions), dict(self.broker_versions))

    # -- SASL --------------------------------------------------------------------------------
    def _start_sasl(self) -> None:
        hs = self.broker_versions.get(SASL_HANDSHAKE)
        auth = self.broker_versions.get(SASL_AUTHENTICATE)
        if hs is None or hs[1] < 1 or auth is None:
            raise AuthenticationFailed(
                "the broker does not offer SASL authentication (SaslHandshake v1 and SaslAuthenticate): "
                "is its listener SASL_PLAINTEXT or SASL_SSL? (check security.protocol)",
                "no_sasl", self._sasl[0], self._sasl[1],
            )
        self._sasl_auth_version = min(auth[1], messages.SaslAuthenticateRequest.MAX_VERSION)
        self._sasl_corr = self._queue(messages.SaslHandshakeRequest(mechanism=self._sasl[0]), 1)

    def _send_token(self, token: bytes) -> None:
        req = messages.SaslAuthenticateRequest(auth_bytes=token)
        self._sasl_corr = self._queue(req, self._sasl_auth_version)

    def _on_sasl(self, payload: bytes, api_key: int, version: int):
        self._sasl_corr = None
        mech_name, username, password = self._sasl
        try:
            _, pos = decode_response_header(payload, api_key, version)
            resp = _RESPONSES[api_key].decode(payload, version, pos)
        except ProtocolError as exc:
            raise ConnectionBroken(f"undecodable {_RESPONSES[api_key].NAME} v{version}: {exc}") from None
        if api_key == SASL_HANDSHAKE:
            if resp.error_code == codes.UNSUPPORTED_SASL_MECHANISM:
                enabled = ", ".join(resp.mechanisms) or "none"
                raise AuthenticationFailed(
                    f"the broker does not enable SASL mechanism {mech_name} (it enables: {enabled}); "
                    f"check sasl.mechanism",
                    "mechanism", mech_name, username, enabled=tuple(resp.mechanisms), error_code=resp.error_code,
                )
            if resp.error_code == codes.ILLEGAL_SASL_STATE:
                raise AuthenticationFailed(
                    "the broker's listener does not take SASL (SaslHandshake: ILLEGAL_SASL_STATE): check "
                    "security.protocol",
                    "not_sasl_listener", mech_name, username, error_code=resp.error_code,
                )
            if resp.error_code != codes.NONE:
                raise AuthenticationFailed(f"SaslHandshake failed: {codes.error_name(resp.error_code)}",
                                           "handshake", mech_name, username, error_code=resp.error_code)
            factory = self._mechanism_factory
            if factory is None:
                from protocol.sasl import client_mechanism as factory
            self._mechanism = factory(mech_name, username, password)
            self._send_token(self._mechanism.first())
            return None
        if resp.error_code != codes.NONE:
            why = resp.error_message or codes.error_name(resp.error_code)
            raise AuthenticationFailed(f"SASL {mech_name} authentication of {username!r} failed: {why}",
                                       "refused", mech_name, username, error_code=resp.error_code,
                                       broker_message=resp.error_message)
        from protocol.sasl import SaslError

        try:
            token = self._mechanism.step(bytes(resp.auth_bytes or b""))
        except SaslError as exc:
            raise AuthenticationFailed(f"SASL {mech_name} authentication of {username!r} failed: {exc}",
                                       "refused", mech_name, username, broker_message=str(exc)) from None
        if token is not None:
            self._send_token(token)
            return None
        self.versions, self._pending_versions = self._pending_versions, None
        return Ready(dict(self.versions), dict(self.broker_versions))
