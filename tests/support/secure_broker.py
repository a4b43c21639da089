"""A scripted broker on 127.0.0.1 with TLS and SASL (``ssl`` and ``protocol.sasl``'s server side),
for the clients' tests of their TLS / SASL paths without a daemon."""

from __future__ import annotations

import socket
import ssl
import threading

from protocol import errors as E
from protocol import messages as m
from protocol.client_connection import CLIENT_VERSIONS
from protocol.framing import FrameDecoder, frame
from protocol.headers import decode_request_header, encode_response_header
from protocol.sasl import SaslError, Users, server_mechanism

# low versions, so that the scripted answers stay simple
VERSIONS = {k: (lo, lo) for k, (lo, _) in CLIENT_VERSIONS.items()}
VERSIONS.update({18: (0, 0), 17: (0, 1), 36: (0, 2), 10: (1, 1), 9: (1, 1)})


class Broker:
    """Accepts connections until closed; each: TLS (``tls``), ApiVersions, SASL (``users``),
    FindCoordinator (itself), OffsetFetch (offset 42 for every partition)."""

    def __init__(self, tls: ssl.SSLContext | None = None, users: Users | None = None):
        self.tls, self.users = tls, users
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.authenticated: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        self._thread.join(10)
        self.listener.close()

    def _serve(self):
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()

    def _handle(self, sock):
        sock.settimeout(5.0)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            self._talk(sock)
        except Exception as exc:  # a TLS failure, a client that gave up, a TLS client on plaintext
            self.errors.append(repr(exc))
        finally:
            sock.close()

    def _talk(self, sock):
        decoder, mech, authenticated = FrameDecoder(), None, self.users is None
        while not self._stop.is_set():
            data = sock.recv(65536)
            if not data:
                return
            for payload in decoder.feed(data):
                h, pos = decode_request_header(payload)
                req = m.REQUESTS[h.api_key].decode(payload, h.api_version, pos)
                if h.api_key == 18:
                    resp = m.ApiVersionsResponse(api_keys=[
                        m.ApiVersionsResponseApiVersion(api_key=k, min_version=lo, max_version=hi)
                        for k, (lo, hi) in VERSIONS.items()])
                elif h.api_key == 17:
                    mech = server_mechanism(req.mechanism, self.users)
                    resp = m.SaslHandshakeResponse(mechanisms=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
                elif h.api_key == 36:
                    try:
                        token = mech.step(req.auth_bytes)
                    except SaslError as exc:
                        sock.sendall(self._answer(h, m.SaslAuthenticateResponse(
                            error_code=E.SASL_AUTHENTICATION_FAILED, error_message=str(exc))))
                        return  # as Kafka: the connection closes after a failed authentication
                    resp = m.SaslAuthenticateResponse(auth_bytes=token)
                    if mech.done:
                        authenticated = True
                        self.authenticated.append(mech.username)
                elif not authenticated:
                    return
                elif h.api_key == 10:
                    resp = m.FindCoordinatorResponse(node_id=1, host="127.0.0.1", port=self.port)
                elif h.api_key == 9:
                    resp = m.OffsetFetchResponse(topics=[m.OffsetFetchResponseTopic(name=t.name, partitions=[
                        m.OffsetFetchResponsePartition(partition_index=p, committed_offset=42, metadata="")
                        for p in t.partition_indexes]) for t in req.topics])
                else:
                    return
                sock.sendall(self._answer(h, resp))

    @staticmethod
    def _answer(h, resp):
        v = h.api_version
        return frame(encode_response_header(h.correlation_id, h.api_key, v) + resp.encode(v))
