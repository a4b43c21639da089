"""``herd groups --command-config``: Kafka's client properties (Java and librdkafka names) -> the
connections' TLS / SASL settings, and one clear line for what herd cannot do."""

from __future__ import annotations

import pytest
import trustme

from admin.commands import command_security
from admin.errors import CliError
from admin.session import parse_servers
from protocol.client_properties import parse_properties, security_from_properties


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pki") / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)


def test_properties_syntax():
    text = "\n".join([
        "# a comment",
        "! another",
        "security.protocol=SASL_SSL",
        "  sasl.mechanism : SCRAM-SHA-256",
        "client.id herd-admin",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
        "    username=\"alice\" \\",
        "    password=\"p=w \\\\\"q\\\\\"\";",
        "a\\=b=c",
        "empty=",
    ])
    props = parse_properties(text)
    assert props["security.protocol"] == "SASL_SSL" and props["sasl.mechanism"] == "SCRAM-SHA-256"
    assert props["client.id"] == "herd-admin" and props["a=b"] == "c" and props["empty"] == ""
    assert props["sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule required "
                                                'username="alice" password=')
    sec, ignored = security_from_properties({k: v for k, v in props.items() if "." in k})
    assert sec.sasl_credentials() == ("SCRAM-SHA-256", "alice", 'p=w "q"') and ignored == ["client.id"]


def test_java_settings(ca_file):
    sec, ignored = security_from_properties({
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
                            'password="s3 \\"cr\\"et";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": ca_file,
        "ssl.truststore.password": "ignored for PEM",
        "client.id": "x",
        "request.timeout.ms": "5000",
    })
    assert sec.protocol == "SASL_SSL" and sec.ca_location == ca_file
    assert sec.sasl_credentials() == ("SCRAM-SHA-512", "alice", 's3 "cr"et')
    assert ignored == ["client.id", "request.timeout.ms"]
    assert "s3" not in repr(sec)
    sec, _ = security_from_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                       "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                                           "required username=bob password=pw;"})
    assert sec.sasl_credentials() == ("PLAIN", "bob", "pw")
    # Java's empty endpoint identification algorithm: no host name check
    sec, _ = security_from_properties({"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                       "ssl.truststore.location": ca_file, "ssl.endpoint.identification.algorithm": ""})
    assert not sec.check_hostname and not sec.ssl_context().check_hostname


def test_librdkafka_settings(ca_file):
    sec, ignored = security_from_properties({"security.protocol": "sasl_ssl", "ssl.ca.location": ca_file,
                                             "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"})
    assert sec.protocol == "SASL_SSL" and sec.sasl_credentials() == ("PLAIN", "u", "p") and ignored == []


@pytest.mark.parametrize(
    "props,message",
    [
        ({"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"},
         "ssl.truststore.location without ssl.truststore.type=PEM: JKS and PKCS12 stores are not supported"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "JKS", "ssl.truststore.location": "/t.jks"},
         "ssl.truststore.type=JKS is not supported: herd reads PEM files only"),
        ({"security.protocol": "SSL", "ssl.keystore.type": "PKCS12"}, "ssl.keystore.type=PKCS12 is not supported"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism=GSSAPI is not supported"),
        ({"security.protocol": "SASL_SSL", "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule "
                                                                "required useKeyTab=true;"},
         "login module com.sun.security.auth.module.Krb5LoginModule is not supported"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
          "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
                              'password="p";'}, "PlainLoginModule does not go with sasl.mechanism=SCRAM-SHA-256"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.jaas.config": "org.apache.kafka.common.security.plain."
                                                                      "PlainLoginModule required username=\"u\";"},
         "needs username=\"...\" and password=\"...\""),
        ({"security.protocol": "SASL_PLAINTEXT"}, "needs sasl.username and sasl.password"),
        # without sasl.mechanism a SCRAM login must not become PLAIN (its password in the clear on
        # SASL_PLAINTEXT); Kafka's tool would use its default, GSSAPI, and fail too
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.jaas.config": "org.apache.kafka.common.security.scram."
                                                                      "ScramLoginModule required username=\"u\" "
                                                                      "password=\"p\";"},
         "ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512"),
        ({"sasl.login.callback.handler.class": "x.Y"}, "sasl.login.callback.handler.class is not supported"),
        ({"security.protocol": "PLAINTEXTX"}, "security.protocol must be one of"),
    ],
)
def test_what_herd_cannot_do_is_one_clear_error(props, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        security_from_properties(props)


def test_command_security_reads_the_file_and_notes_ignored_keys(tmp_path, ca_file, capsys):
    f = tmp_path / "client.properties"
    f.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={ca_file}\n"
                 "client.id=admin\n")
    sec = command_security(str(f))
    assert sec.protocol == "SSL" and sec.ca_location == ca_file
    assert "not used by herd groups: client.id" in capsys.readouterr().err
    assert command_security(None).protocol == "PLAINTEXT"
    with pytest.raises(CliError, match="--command-config .*missing.properties: No such file"):
        command_security(str(tmp_path / "missing.properties"))
    f.write_text("security.protocol=SSL\nssl.truststore.location=/x.jks\n")
    with pytest.raises(CliError, match=r"--command-config .*client.properties: ssl.truststore.location without"):
        command_security(str(f))


def test_listener_urls_in_servers_must_match_the_protocol():
    assert parse_servers("SASL_SSL://h:9093,sasl_ssl://g:1", protocol="SASL_SSL") == [("h", 9093), ("g", 1)]
    assert parse_servers("h:9093", protocol="SSL") == [("h", 9093)]
    with pytest.raises(CliError, match="names SSL but security.protocol is PLAINTEXT"):
        parse_servers("SSL://h:9093")


# -- the admin's blocking connections over TLS and SASL (a scripted loopback broker) ---------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    import ssl

    d = tmp_path_factory.mktemp("srv")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return str(d / "ca.pem"), ctx


@pytest.fixture
def broker(tls_server):
    from protocol.sasl import Users
    from tests.support.secure_broker import Broker

    b = Broker(tls=tls_server[1], users=Users({"alice": "s3cret"}))
    yield b
    b.close()


def _security(ca, password="s3cret", mechanism="SCRAM-SHA-512"):
    sec, _ = security_from_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "ssl.truststore.type": "PEM",
        "ssl.truststore.location": ca,
        "sasl.jaas.config": f'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
                            f'password="{password}";'})
    return sec


def test_admin_connection_over_tls_and_scram(tls_server, broker):
    from admin.session import BrokerConnection, Deadline
    from protocol import messages as m

    conn = BrokerConnection("127.0.0.1", broker.port, Deadline(10), security=_security(tls_server[0]))
    try:
        resp, _ = conn.call(lambda v: m.FindCoordinatorRequest(key="g"))
    finally:
        conn.close()
    assert (resp.host, resp.port) == ("127.0.0.1", broker.port) and broker.authenticated == ["alice"]


def test_admin_wrong_password_is_one_line_and_no_other_server_is_tried(tls_server, broker):
    from admin.session import AuthError, Cluster, Deadline

    cluster = Cluster([("127.0.0.1", broker.port), ("127.0.0.1", broker.port)], Deadline(10),
                      _security(tls_server[0], password="nope"))
    with pytest.raises(AuthError, match=r"127.0.0.1:\d+: SASL SCRAM-SHA-512 authentication of 'alice' failed: "
                                        r"\S"):  # then the broker's reason
        cluster.any()
    assert broker.connections == 1


def test_admin_certificate_that_does_not_verify(tmp_path, broker):
    from admin.session import AuthError, BrokerConnection, Deadline

    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other.pem"))
    with pytest.raises(AuthError, match=r"TLS certificate verification of 127.0.0.1:\d+ failed"):
        BrokerConnection("127.0.0.1", broker.port, Deadline(10), security=_security(str(tmp_path / "other.pem")))
