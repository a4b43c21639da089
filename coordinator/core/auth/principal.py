"""Who a connection is, as Kafka names it: ``User:<name>``.

* SASL (PLAIN, SCRAM): ``User:<the authenticated user name>``;
* TLS with a client certificate: ``User:<the subject>``, the subject written as Java's
  X500Principal.getName() writes it (RFC 2253: most specific attribute first, ``CN=a,OU=b,O=c``),
  then mapped by Kafka's ``ssl.principal.mapping.rules`` (``RULE:pattern/replacement/[LU]`` and
  ``DEFAULT``, comma-separated, the first rule whose pattern matches the whole subject wins);
* anything else (PLAINTEXT, TLS without a client certificate): ``User:ANONYMOUS``.
"""
from __future__ import annotations

import re

ANONYMOUS = "User:ANONYMOUS"

# Kafka's SslPrincipalMapper grammar: DEFAULT, or RULE:pattern/replacement/ then an optional L or U;
# '/' and '\' inside pattern and replacement are escaped with '\'.
_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)|(.*?)"
_SPLIT = re.compile(r"\s*(?:" + _RULE + r")\s*(?:,\s*|$)")


class MappingRuleError(ValueError):
    """ssl_principal_mapping_rules that cannot be parsed: one line for the operator."""


class NoMatchingRule(Exception):
    """No rule maps this subject: the connection is refused, as Kafka refuses it."""


class Rule:
    __slots__ = ("default", "pattern", "replacement", "case")

    def __init__(self, pattern: str | None = None, replacement: str = "", case: str = ""):
        self.default = pattern is None
        self.pattern = None if pattern is None else re.compile(pattern)
        self.replacement = _python_replacement(replacement)
        self.case = case

    def apply(self, subject: str) -> str | None:
        if self.default:
            return subject
        if self.pattern.fullmatch(subject) is None:
            return None
        name = self.pattern.sub(self.replacement, subject)
        if self.case == "L":
            return name.lower()
        if self.case == "U":
            return name.upper()
        return name


def _python_replacement(text: str) -> str:
    """Java's replacement syntax ($1, \\$ for a dollar) as Python's (\\g<1>)."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("\\\\" if nxt == "\\" else nxt)
            i += 2
            continue
        if c == "$" and i + 1 < len(text) and text[i + 1].isdigit():
            j = i + 1
            while j < len(text) and text[j].isdigit():
                j += 1
            out.append(f"\\g<{text[i + 1:j]}>")
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_rules(text: str | None) -> list[Rule]:
    """``ssl.principal.mapping.rules``: empty or unset is DEFAULT."""
    if text is None or not text.strip():
        return [Rule()]
    rules = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SPLIT.match(text, pos)
        if m is None or m.end() == pos:
            raise MappingRuleError(f"ssl_principal_mapping_rules: invalid rule at {text[pos:]!r}")
        pos = m.end()
        if m.group(1):
            rules.append(Rule())
        elif m.group(5) is not None and m.group(2) is None:
            raise MappingRuleError(f"ssl_principal_mapping_rules: invalid rule: {m.group(5)!r}")
        else:
            pattern = m.group(2).replace("\\/", "/")
            replacement = m.group(3).replace("\\/", "/")
            try:
                rules.append(Rule(pattern, replacement, m.group(4)))
            except re.error as exc:
                raise MappingRuleError(f"ssl_principal_mapping_rules: bad pattern {pattern!r}: {exc}") from None
    return rules


def map_subject(rules: list[Rule], subject: str) -> str:
    for rule in rules:
        name = rule.apply(subject)
        if name is not None:
            return name
    raise NoMatchingRule(f"No rules apply to {subject}")


# RFC 2253 keywords Java prints by name; other attributes Java prints by OID.
_KEYWORDS = {"commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST", "organizationName": "O",
             "organizationalUnitName": "OU", "countryName": "C", "streetAddress": "STREET",
             "domainComponent": "DC", "userId": "UID"}
_OIDS = {"emailAddress": "1.2.840.113549.1.9.1", "serialNumber": "2.5.4.5", "title": "2.5.4.12",
         "surname": "2.5.4.4", "givenName": "2.5.4.42"}


def _escape(value: str) -> str:
    out = []
    for i, c in enumerate(value):
        if c in ',+"\\<>;' or (i == 0 and c in "# ") or (i == len(value) - 1 and c == " "):
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def subject_name(cert: dict) -> str:
    """The subject of a certificate as ``ssl.getpeercert()`` gives it, in RFC 2253 form (the
    order reversed: the last RDN in the certificate comes first)."""
    rdns = []
    for rdn in reversed(cert.get("subject", ())):
        parts = []
        for key, value in rdn:
            name = _KEYWORDS.get(key)
            if name is None:
                oid = _OIDS.get(key, key)
                parts.append(f"{oid}={_escape(value)}")
            else:
                parts.append(f"{name}={_escape(value)}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def tls_principal(rules: list[Rule], cert: dict | None) -> str:
    """The principal of a TLS connection: ANONYMOUS without a client certificate."""
    if not cert or not cert.get("subject"):
        return ANONYMOUS
    return "User:" + map_subject(rules, subject_name(cert))


def sasl_principal(username: str) -> str:
    return "User:" + username
