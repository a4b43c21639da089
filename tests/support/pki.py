"""A throwaway PKI for the TLS tests (trustme): a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, and a SASL users file."""
from __future__ import annotations

from pathlib import Path


def make_pki(d: Path, users: dict[str, str]) -> Path:
    """Writes server.pem (key + chain), ca.pem, client.crt/client.key, stranger.pem (key + a
    certificate from a CA nobody trusts), other-ca.pem, and users (mode 600) into ``d``."""
    import trustme

    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("client.example")
    client.cert_chain_pems[0].write_to_path(str(d / "client.crt"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    other = trustme.CA()
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    other.issue_cert("client.example").private_key_and_cert_chain_pem.write_to_path(str(d / "stranger.pem"))
    path = d / "users"
    path.write_text("# herd users\n" + "".join(f"{u}:{p}\n" for u, p in users.items()))
    path.chmod(0o600)
    return d
