"""CreateAcls (30), DescribeAcls (29) and DeleteAcls (31), v1-v3, written by hand: Kafka's schemas
for them are not among the files herd generates from. v2+ are flexible (compact strings and
arrays, tagged fields); v1 is the oldest with a pattern type (Kafka 4 serves v2-v3, herd serves v1
too for older clients). The classes have the generated ones' interface (``API_KEY``,
``MIN_VERSION``, ``MAX_VERSION``, ``FLEXIBLE_VERSION``, ``NAME``, ``decode_from``, ``encode``,
``encode_into``), so the edge handles them like every other API.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from protocol.wire import ProtocolError, read_tagged_fields, read_uvarint, uvarint_bytes

MIN_VERSION, MAX_VERSION, FLEXIBLE_VERSION = 1, 3, 2
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
CLUSTER_AUTHORIZATION_FAILED = 31

_B = struct.Struct(">b")
_H = struct.Struct(">h")
_I = struct.Struct(">i")
_HB = struct.Struct(">hb")


class _Reader:
    __slots__ = ("buf", "pos", "flexible", "what")

    def __init__(self, buf, pos, version, what):
        if not MIN_VERSION <= version <= MAX_VERSION:
            raise ProtocolError(f"{what} has no version {version} here")
        self.buf, self.pos, self.flexible, self.what = buf, pos, version >= FLEXIBLE_VERSION, what

    def int8(self) -> int:
        if self.pos + 1 > len(self.buf):
            raise ProtocolError(f"{self.what}: truncated")
        v = _B.unpack_from(self.buf, self.pos)[0]
        self.pos += 1
        return v

    def string(self, nullable: bool) -> str | None:
        if self.flexible:
            n, self.pos = read_uvarint(self.buf, self.pos)
            n -= 1
        else:
            if self.pos + 2 > len(self.buf):
                raise ProtocolError(f"{self.what}: truncated string length")
            n = _H.unpack_from(self.buf, self.pos)[0]
            self.pos += 2
        if n < 0:
            if nullable:
                return None
            raise ProtocolError(f"{self.what}: null string")
        end = self.pos + n
        if end > len(self.buf):
            raise ProtocolError(f"{self.what}: string runs past the end")
        try:
            s = bytes(self.buf[self.pos:end]).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what}: string is not UTF-8") from None
        self.pos = end
        return s

    def count(self) -> int:
        if self.flexible:
            n, self.pos = read_uvarint(self.buf, self.pos)
            n -= 1
        else:
            if self.pos + 4 > len(self.buf):
                raise ProtocolError(f"{self.what}: truncated array length")
            n = _I.unpack_from(self.buf, self.pos)[0]
            self.pos += 4
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(f"{self.what}: bad array length {n}")
        return n

    def tags(self) -> None:
        if self.flexible:
            _, self.pos = read_tagged_fields(self.buf, self.pos)


def _w_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is None:
        out += b"\x00" if flexible else b"\xff\xff"
        return
    raw = s.encode()
    out += uvarint_bytes(len(raw) + 1) if flexible else _H.pack(len(raw))
    out += raw


def _w_count(out: bytearray, n: int, flexible: bool) -> None:
    out += uvarint_bytes(n + 1) if flexible else _I.pack(n)


def _w_tags(out: bytearray, flexible: bool) -> None:
    if flexible:
        out += b"\x00"


class _Message:
    MIN_VERSION, MAX_VERSION, FLEXIBLE_VERSION = MIN_VERSION, MAX_VERSION, FLEXIBLE_VERSION
    unknown_tagged_fields = None

    @classmethod
    def decode(cls, buf, version: int, pos: int = 0):
        return cls.decode_from(buf, pos, version)[0]

    def encode(self, version: int) -> bytes:
        out = bytearray()
        self.encode_into(out, version)
        return bytes(out)


# ---- filters and bindings ------------------------------------------------------------------------

@dataclass
class AclBindingData:
    """One ACL on the wire: CreateAcls' creation, DescribeAcls' and DeleteAcls' filters (names None
    match any), DeleteAcls' matching ACL."""
    resource_type: int = 0
    resource_name: str | None = None
    pattern_type: int = 3
    principal: str | None = None
    host: str | None = None
    operation: int = 0
    permission_type: int = 0


def _read_binding(r: _Reader, nullable: bool) -> AclBindingData:
    b = AclBindingData()
    b.resource_type = r.int8()
    b.resource_name = r.string(nullable)
    b.pattern_type = r.int8()
    b.principal = r.string(nullable)
    b.host = r.string(nullable)
    b.operation = r.int8()
    b.permission_type = r.int8()
    r.tags()
    return b


# ---- CreateAcls ----------------------------------------------------------------------------------

@dataclass
class CreateAclsRequest(_Message):
    API_KEY = CREATE_ACLS
    NAME = "CreateAclsRequest"
    creations: list[AclBindingData] = field(default_factory=list)

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "CreateAcls")
        req = cls([_read_binding(r, False) for _ in range(r.count())])
        r.tags()
        return req, r.pos

    def encode_into(self, out: bytearray, version: int) -> None:
        flex = version >= FLEXIBLE_VERSION
        _w_count(out, len(self.creations), flex)
        for c in self.creations:
            _w_binding(out, c, flex)
        _w_tags(out, flex)

    def cluster_authorization_failed(self, version: int):
        return CreateAclsResponse(results=[CreateAclsResult(CLUSTER_AUTHORIZATION_FAILED,
                                                            "Cluster authorization failed.")
                                           for _ in self.creations])


def _w_binding(out: bytearray, b: AclBindingData, flex: bool) -> None:
    out += _B.pack(b.resource_type)
    _w_string(out, b.resource_name, flex)
    out += _B.pack(b.pattern_type)
    _w_string(out, b.principal, flex)
    _w_string(out, b.host, flex)
    out += _B.pack(b.operation)
    out += _B.pack(b.permission_type)
    _w_tags(out, flex)


@dataclass
class CreateAclsResult:
    error_code: int = 0
    error_message: str | None = None


@dataclass
class CreateAclsResponse(_Message):
    API_KEY = CREATE_ACLS
    NAME = "CreateAclsResponse"
    throttle_time_ms: int = 0
    results: list[CreateAclsResult] = field(default_factory=list)
    error_code: int = 0  # not on the wire: the metrics' view of the whole answer

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "CreateAclsResponse")
        throttle = _read_i32(r)
        results = []
        for _ in range(r.count()):
            code = _read_i16(r)
            results.append(CreateAclsResult(code, r.string(True)))
            r.tags()
        r.tags()
        return cls(throttle, results), r.pos

    def encode_into(self, out: bytearray, version: int) -> None:
        flex = version >= FLEXIBLE_VERSION
        out += _I.pack(self.throttle_time_ms)
        _w_count(out, len(self.results), flex)
        for res in self.results:
            out += _H.pack(res.error_code)
            _w_string(out, res.error_message, flex)
            _w_tags(out, flex)
        _w_tags(out, flex)


def _read_i32(r: _Reader) -> int:
    if r.pos + 4 > len(r.buf):
        raise ProtocolError(f"{r.what}: truncated")
    v = _I.unpack_from(r.buf, r.pos)[0]
    r.pos += 4
    return v


def _read_i16(r: _Reader) -> int:
    if r.pos + 2 > len(r.buf):
        raise ProtocolError(f"{r.what}: truncated")
    v = _H.unpack_from(r.buf, r.pos)[0]
    r.pos += 2
    return v


# ---- DescribeAcls --------------------------------------------------------------------------------

@dataclass
class DescribeAclsRequest(_Message):
    API_KEY = DESCRIBE_ACLS
    NAME = "DescribeAclsRequest"
    filter: AclBindingData = field(default_factory=AclBindingData)

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "DescribeAcls")
        return cls(_read_binding(r, True)), r.pos  # its tags are the request's

    def encode_into(self, out: bytearray, version: int) -> None:
        _w_binding(out, self.filter, version >= FLEXIBLE_VERSION)

    def cluster_authorization_failed(self, version: int):
        return DescribeAclsResponse(error_code=CLUSTER_AUTHORIZATION_FAILED,
                                    error_message="Cluster authorization failed.")


@dataclass
class AclDescription:
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass
class DescribeAclsResource:
    resource_type: int
    resource_name: str
    pattern_type: int
    acls: list[AclDescription] = field(default_factory=list)


@dataclass
class DescribeAclsResponse(_Message):
    API_KEY = DESCRIBE_ACLS
    NAME = "DescribeAclsResponse"
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    resources: list[DescribeAclsResource] = field(default_factory=list)

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "DescribeAclsResponse")
        resp = cls(_read_i32(r), _read_i16(r), r.string(True))
        for _ in range(r.count()):
            res = DescribeAclsResource(r.int8(), r.string(False), r.int8())
            for _ in range(r.count()):
                res.acls.append(AclDescription(r.string(False), r.string(False), r.int8(), r.int8()))
                r.tags()
            r.tags()
            resp.resources.append(res)
        r.tags()
        return resp, r.pos

    def encode_into(self, out: bytearray, version: int) -> None:
        flex = version >= FLEXIBLE_VERSION
        out += _I.pack(self.throttle_time_ms)
        out += _H.pack(self.error_code)
        _w_string(out, self.error_message, flex)
        _w_count(out, len(self.resources), flex)
        for res in self.resources:
            out += _B.pack(res.resource_type)
            _w_string(out, res.resource_name, flex)
            out += _B.pack(res.pattern_type)
            _w_count(out, len(res.acls), flex)
            for a in res.acls:
                _w_string(out, a.principal, flex)
                _w_string(out, a.host, flex)
                out += _B.pack(a.operation)
                out += _B.pack(a.permission_type)
                _w_tags(out, flex)
            _w_tags(out, flex)
        _w_tags(out, flex)


# ---- DeleteAcls ----------------------------------------------------------------------------------

@dataclass
class DeleteAclsRequest(_Message):
    API_KEY = DELETE_ACLS
    NAME = "DeleteAclsRequest"
    filters: list[AclBindingData] = field(default_factory=list)

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "DeleteAcls")
        req = cls([_read_binding(r, True) for _ in range(r.count())])
        r.tags()
        return req, r.pos

    def encode_into(self, out: bytearray, version: int) -> None:
        flex = version >= FLEXIBLE_VERSION
        _w_count(out, len(self.filters), flex)
        for f in self.filters:
            _w_binding(out, f, flex)
        _w_tags(out, flex)

    def cluster_authorization_failed(self, version: int):
        return DeleteAclsResponse(filter_results=[
            DeleteAclsFilterResult(CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
            for _ in self.filters])


@dataclass
class DeleteAclsMatchingAcl:
    error_code: int
    error_message: str | None
    acl: AclBindingData


@dataclass
class DeleteAclsFilterResult:
    error_code: int = 0
    error_message: str | None = None
    matching_acls: list[DeleteAclsMatchingAcl] = field(default_factory=list)


@dataclass
class DeleteAclsResponse(_Message):
    API_KEY = DELETE_ACLS
    NAME = "DeleteAclsResponse"
    throttle_time_ms: int = 0
    filter_results: list[DeleteAclsFilterResult] = field(default_factory=list)
    error_code: int = 0  # not on the wire

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        r = _Reader(buf, pos, version, "DeleteAclsResponse")
        resp = cls(_read_i32(r))
        for _ in range(r.count()):
            fr = DeleteAclsFilterResult(_read_i16(r), r.string(True))
            for _ in range(r.count()):
                code = _read_i16(r)
                msg = r.string(True)
                fr.matching_acls.append(DeleteAclsMatchingAcl(code, msg, _read_binding(r, False)))
            r.tags()
            resp.filter_results.append(fr)
        r.tags()
        return resp, r.pos

    def encode_into(self, out: bytearray, version: int) -> None:
        flex = version >= FLEXIBLE_VERSION
        out += _I.pack(self.throttle_time_ms)
        _w_count(out, len(self.filter_results), flex)
        for fr in self.filter_results:
            out += _H.pack(fr.error_code)
            _w_string(out, fr.error_message, flex)
            _w_count(out, len(fr.matching_acls), flex)
            for ma in fr.matching_acls:
                out += _H.pack(ma.error_code)
                _w_string(out, ma.error_message, flex)
                _w_binding(out, ma.acl, flex)  # its fields and its tags
            _w_tags(out, flex)
        _w_tags(out, flex)


REQUESTS = {c.API_KEY: c for c in (DescribeAclsRequest, CreateAclsRequest, DeleteAclsRequest)}
RESPONSES = {c.API_KEY: c for c in (DescribeAclsResponse, CreateAclsResponse, DeleteAclsResponse)}


# ``FIELDS`` as the generated classes have it (their wire fields, in order), for tools that walk
# messages generically (the differential harness's transcripts).
for _cls in (AclBindingData, CreateAclsRequest, CreateAclsResult, CreateAclsResponse, DescribeAclsRequest,
             AclDescription, DescribeAclsResource, DescribeAclsResponse, DeleteAclsRequest, DeleteAclsMatchingAcl,
             DeleteAclsFilterResult, DeleteAclsResponse):
    _cls.FIELDS = tuple(f for f in _cls.__dataclass_fields__ if not (f == "error_code" and _cls in (
        CreateAclsResponse, DeleteAclsResponse)))
