"""Principals: SASL users, TLS subjects mapped by Kafka's ssl.principal.mapping.rules, ANONYMOUS."""
from __future__ import annotations

import pytest

from coordinator.core.auth.principal import (
    ANONYMOUS,
    MappingRuleError,
    NoMatchingRule,
    map_subject,
    parse_rules,
    sasl_principal,
    subject_name,
    tls_principal,
)

CERT = {"subject": ((("countryName", "US"),), (("organizationName", "Acme"),),
                    (("organizationalUnitName", "ServiceUsers"),), (("commonName", "Alice"),))}


def test_subject_in_rfc2253_order():
    assert subject_name(CERT) == "CN=Alice,OU=ServiceUsers,O=Acme,C=US"
    assert subject_name({"subject": ((("commonName", "a,b"),),)}) == "CN=a\\,b"


def test_default_rule_is_the_whole_subject():
    assert tls_principal(parse_rules(None), CERT) == "User:CN=Alice,OU=ServiceUsers,O=Acme,C=US"
    assert tls_principal(parse_rules("DEFAULT"), CERT) == "User:CN=Alice,OU=ServiceUsers,O=Acme,C=US"


def test_rules_first_match_wins_with_case_flags():
    rules = parse_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/U, DEFAULT")
    assert map_subject(rules, "CN=Alice,OU=ServiceUsers,O=Acme,C=US") == "alice"
    assert map_subject(rules, "CN=Bob,OU=Ops,O=Acme") == "BOB@OPS"
    assert map_subject(rules, "O=Acme") == "O=Acme"


def test_no_matching_rule_is_refused():
    with pytest.raises(NoMatchingRule):
        map_subject(parse_rules("RULE:^CN=(.*)$/$1/"), "O=Acme")


def test_escaped_slash_in_rule():
    assert map_subject(parse_rules(r"RULE:^CN=(.*)\/x$/$1\/y/"), "CN=a/x") == "a/y"


@pytest.mark.parametrize("text", ["NOPE", "RULE:abc", "RULE:(/x/"])
def test_bad_rules_are_one_line_errors(text):
    with pytest.raises(MappingRuleError):
        parse_rules(text)


def test_anonymous_and_sasl():
    assert tls_principal(parse_rules(None), None) == ANONYMOUS == "User:ANONYMOUS"
    assert tls_principal(parse_rules(None), {}) == ANONYMOUS
    assert sasl_principal("alice") == "User:alice"
