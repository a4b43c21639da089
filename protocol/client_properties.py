"""Kafka's client properties file (``--command-config`` of Kafka's tools) -> herd's TLS/SASL settings.

One implementation for every herd program that connects to a Kafka cluster as a client: ``herd
groups --command-config FILE`` (as ``kafka-consumer-groups.sh --command-config``, one file for every
connection the command makes, ``--bootstrap-server`` and ``--data-bootstrap-server`` alike) and the
daemon's ``data_command_config`` (its connections to the data cluster). Pure parsing; the only I/O
is reading the file and, when TLS is on, loading the certificate files into the context
(:mod:`protocol.client_security`). Accepted, in a Java
``.properties`` file (``key=value``, ``key: value``, ``#``/``!`` comments, ``\\`` continuations):

- ``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism`` (PLAIN,
  SCRAM-SHA-256, SCRAM-SHA-512);
- Java's ``sasl.jaas.config=<PlainLoginModule|ScramLoginModule> required username="u"
  password="p";``, ``ssl.truststore.type=PEM`` with ``ssl.truststore.location``,
  ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (key and certificate in one file) and
  ``ssl.key.password``, ``ssl.endpoint.identification.algorithm`` (empty: no host name check);
- librdkafka's names: ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
  ``ssl.key.password``, ``ssl.endpoint.identification.algorithm``,
  ``enable.ssl.certificate.verification``, ``sasl.username``, ``sasl.password``.

What would change how the connection is secured but herd cannot do (JKS / PKCS12 stores, other SASL
mechanisms or login modules, callback handlers) fails with one line saying so; other client
settings (``client.id``, ``request.timeout.ms``, ...) do not apply and are returned as ignored (the
caller says so: a note on stderr, a log line).
"""

from __future__ import annotations

import re

from protocol.client_security import SecurityConfig, parse_security

__all__ = ["load_command_config", "parse_properties", "security_from_properties"]

_LIBRDKAFKA = {
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "sasl.username",
    "sasl.password",
}
# Java settings that need nothing from herd (passwords of PEM stores are not used; the others tune
# the TLS session herd's defaults already cover).
_HARMLESS = {
    "ssl.truststore.password",
    "ssl.keystore.password",
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.cipher.suites",
    "ssl.secure.random.implementation",
}
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}
_JAAS = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)\s*(?P<opts>.*?)\s*;?\s*$", re.S
)
_JAAS_OPT = re.compile(r'\s*([\w.]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+?))(?=\s|$)', re.S)


def parse_properties(text: str, source: str = "the command config") -> dict[str, str]:
    """A Java ``.properties`` file -> ``{key: value}`` (the escapes that matter here: ``\\`` line
    continuations, ``\\=``, ``\\:``, ``\\\\``)."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line goes on
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        m = re.match(r"((?:[^\s=:\\]|\\.)+)\s*[=:\s]\s*(.*)$", line, re.S)
        if m is None:
            key, value = line.strip(), ""
        else:
            key, value = m.group(1), m.group(2)
        key = re.sub(r"\\(.)", r"\1", key)
        value = re.sub(r"\\(.)", lambda mm: {"t": "\t", "n": "\n"}.get(mm.group(1), mm.group(1)), value)
        if not key:
            raise ValueError(f"{source}: a line without a key: {line!r}")
        out[key] = value
    return out


def _jaas(value: str, mechanism: str | None) -> tuple[str, str]:
    m = _JAAS.match(value)
    if m is None:
        raise ValueError("sasl.jaas.config: expected '<LoginModule class> required username=\"...\" "
                         "password=\"...\";'")
    module = m.group("module")
    if module not in _JAAS_MODULES:
        raise ValueError(f"sasl.jaas.config: login module {module} is not supported (herd does "
                         f"PlainLoginModule and ScramLoginModule)")
    if mechanism is None and module.endswith(".ScramLoginModule"):
        # not PLAIN, the default otherwise: that would send the password itself (in the clear on
        # SASL_PLAINTEXT); Kafka's tool would take GSSAPI, its default, and fail
        raise ValueError("sasl.jaas.config: ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512")
    if mechanism is not None and mechanism not in _JAAS_MODULES[module]:
        raise ValueError(f"sasl.jaas.config: {module.rsplit('.', 1)[1]} does not go with sasl.mechanism={mechanism}")
    opts = {}
    for o in _JAAS_OPT.finditer(m.group("opts")):
        opts[o.group(1)] = re.sub(r"\\(.)", r"\1", o.group(2)) if o.group(2) is not None else o.group(3)
    if "username" not in opts or "password" not in opts:
        raise ValueError("sasl.jaas.config: needs username=\"...\" and password=\"...\"")
    return opts["username"], opts["password"]


def security_from_properties(props: dict[str, str]) -> tuple[SecurityConfig, list[str]]:
    """The connection settings of a command config, and the keys it ignores (not a TLS / SASL
    setting). ``ValueError`` (one line) for what herd cannot do or what does not fit together."""
    settings: dict[str, object] = {}
    ignored = []
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms"))
    mechanism = mechanism.strip().upper() if mechanism else None
    for key, raw in props.items():
        value = raw.strip()
        if key == "security.protocol":
            settings[key] = value
        elif key in ("sasl.mechanism", "sasl.mechanisms"):
            if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                raise ValueError(f"sasl.mechanism={value} is not supported (herd does PLAIN, SCRAM-SHA-256 "
                                 f"and SCRAM-SHA-512)")
            settings["sasl.mechanism"] = mechanism
        elif key == "sasl.jaas.config":
            settings["sasl.username"], settings["sasl.password"] = _jaas(raw, mechanism)
        elif key == "ssl.endpoint.identification.algorithm":
            settings[key] = value or "none"  # Java: empty turns the host name check off
        elif key in _LIBRDKAFKA:
            settings[key] = value
        elif key in ("ssl.truststore.type", "ssl.keystore.type"):
            if value.upper() != "PEM":
                raise ValueError(f"{key}={value} is not supported: herd reads PEM files only "
                                 f"(convert the store, e.g. keytool -exportcert -rfc, and set {key}=PEM)")
        elif key in ("ssl.truststore.location", "ssl.keystore.location"):
            kind = key.split(".")[1]  # truststore / keystore
            if props.get(f"ssl.{kind}.type", "JKS").strip().upper() != "PEM":
                raise ValueError(f"{key} without ssl.{kind}.type=PEM: JKS and PKCS12 stores are not supported "
                                 f"(give a PEM file with ssl.{kind}.type=PEM)")
            settings["ssl.ca.location" if kind == "truststore" else "ssl.certificate.location"] = value
        elif key in _HARMLESS:
            continue
        elif key.startswith(("ssl.", "sasl.")):
            raise ValueError(f"{key} is not supported by herd")
        else:
            ignored.append(key)
    return parse_security(settings), sorted(ignored)


def load_command_config(path: str, setting: str = "--command-config") -> tuple[SecurityConfig, list[str]]:
    """Read a client properties file: ``(SecurityConfig, ignored keys)``. ``ValueError`` (one line,
    naming ``setting`` and the file) / ``OSError`` on failure."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return security_from_properties(parse_properties(text, path))
    except ValueError as exc:
        raise ValueError(f"{setting} {path}: {exc}") from None
