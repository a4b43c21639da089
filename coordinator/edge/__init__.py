"""The edge: client connections, framing, the fast paths, TLS and SASL. Never imported by the core."""
