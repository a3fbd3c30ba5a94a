"""A client certificate's subject as Kafka names it, and Kafka's ssl.principal.mapping.rules."""

from __future__ import annotations

import pytest

from app.domain.ssl_principal import MappingRuleError, NoMatchingRule, distinguished_name, map_name, parse_rules

SUBJECT = (
    (("countryName", "US"),),
    (("organizationName", "Acme, Inc."),),
    (("organizationalUnitName", "Eng"),),
    (("commonName", "Alice"),),
)
DN = "CN=Alice,OU=Eng,O=Acme\\, Inc.,C=US"


def test_the_subject_is_written_as_java_writes_an_x500_principal() -> None:
    assert distinguished_name(SUBJECT) == DN
    assert distinguished_name(((("commonName", "a+b"), ("userId", "7")),)) == "CN=a\\+b+UID=7"
    assert distinguished_name(((("commonName", " #x "),),)) == "CN=\\ #x\\ "
    assert distinguished_name(((("emailAddress", "a@example.com"),),)) == "emailAddress=a@example.com"
    assert distinguished_name(()) == ""


def test_default_is_the_whole_name() -> None:
    assert map_name(parse_rules("DEFAULT"), DN) == DN
    assert map_name(parse_rules(""), DN) == DN
    assert map_name(parse_rules(None), DN) == DN


def test_the_first_rule_that_matches_the_whole_name_wins() -> None:
    rules = parse_rules(r"RULE:^CN=([^,]*),OU=Ops,.*$/ops-$1/, RULE:^CN=([^,]*),OU=Eng,.*$/$1/L, DEFAULT")
    assert map_name(rules, DN) == "alice"
    assert map_name(rules, "CN=Bob,OU=Ops,O=x") == "ops-Bob"
    assert map_name(rules, "CN=Carol") == "CN=Carol"  # DEFAULT
    assert map_name(parse_rules("RULE:CN=(.*)/$1/U"), "CN=dave") == "DAVE"
    with pytest.raises(NoMatchingRule, match="No rules apply to CN=Alice,OU=x"):
        map_name(parse_rules("RULE:CN=Alice/alice/"), "CN=Alice,OU=x")  # a pattern matches the whole name or not at all


def test_escapes_in_patterns_and_replacements() -> None:
    rules = parse_rules(r"RULE:^CN=(.*?),OU=(.*?),.*$/$1\/$2/")
    assert map_name(rules, DN) == "Alice/Eng"
    assert map_name(parse_rules(r"RULE:^CN=(.*?),.*$/\$$1\,x/"), DN) == "$Alice,x"


@pytest.mark.parametrize("text", ["RULE:abc", "RULE:a/b", "NOPE", "RULE:(/x/", "RULE:a/$2/", "RULE:a/b/X"])
def test_rules_kafka_refuses(text: str) -> None:
    with pytest.raises(MappingRuleError):
        rules = parse_rules(text)
        map_name(rules, "a")
