"""A minimal blocking Kafka protocol client for tests, built on herd's codec."""
from __future__ import annotations

import socket
import ssl
import struct

from protocol import acls
from protocol import messages as m
from protocol.framing import frame
from protocol.headers import decode_response_header, encode_request_header

_RESPONSES = {**m.RESPONSES, **acls.RESPONSES}


class RawClient:
    def __init__(self, address, client_id="herd-test", timeout=10.0, ssl_context=None):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=address[0])
        self.client_id = client_id
        self.correlation_id = 0

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def send(self, request, version: int) -> int:
        self.correlation_id += 1
        out = bytearray()
        encode_request_header(out, request.API_KEY, version, self.correlation_id, self.client_id)
        request.encode_into(out, version)
        self.send_raw(bytes(out))
        return self.correlation_id

    def recv_frame(self) -> bytes:
        size, = struct.unpack(">i", self._read(4))
        return self._read(size)

    def receive(self, api_key: int, version: int, correlation_id: int):
        data = self.recv_frame()
        cid, pos = decode_response_header(data, api_key, version)
        assert cid == correlation_id, (cid, correlation_id)
        return _RESPONSES[api_key].decode(data, version, pos)

    def call(self, request, version: int):
        cid = self.send(request, version)
        return self.receive(request.API_KEY, version, cid)

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by herd")
            buf += chunk
        return bytes(buf)

    def closed_by_peer(self, timeout=5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
            return True
        except TimeoutError:
            return False

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
