"""Who a client certificate is: its subject as Kafka writes a distinguished name, and Kafka's
``ssl.principal.mapping.rules`` from that name to a principal's name.

- ``distinguished_name`` writes a certificate's subject as Java's ``X500Principal.getName()``
  (RFC 2253): the most specific part first (``CN=alice,OU=eng,O=acme,C=US``), RFC 2253's
  keywords (CN, C, L, ST, O, OU, STREET, DC, UID), special characters escaped. An attribute
  without a keyword keeps the name Python's ``ssl`` gives it (Java would write its OID).
- ``parse_rules`` reads the subset of the rules Kafka's ``SslPrincipalMapper`` reads that txlog
  takes: a comma-separated list of ``DEFAULT`` (the whole name) and ``RULE:pattern/replacement/``
  with an optional ``L`` (lower case) or ``U`` (upper case) flag. A pattern must match the whole
  name (Java's ``Matcher.matches``); ``$1`` in the replacement is the first group, a backslash
  takes the next character as it is (``\\/`` a slash, ``\\,`` a comma).
- ``map_name`` applies them in order: the first that matches gives the principal's name; none
  matching refuses the certificate, as Kafka does ("No rules apply to …").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIAL = set(',+"\\<>;=')


class MappingRuleError(ValueError):
    """A rule Kafka would refuse ("Invalid rule: …")."""


class NoMatchingRule(ValueError):
    """No rule maps this name: the certificate names no principal."""


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in _SPECIAL else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def distinguished_name(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """A certificate's subject (``ssl.SSLSocket.getpeercert()['subject']``: relative distinguished
    names in the certificate's order, each a tuple of (attribute, value)) as Kafka names it."""
    rdns = ["+".join(f"{_KEYWORDS.get(attr, attr)}={_escape(value)}" for attr, value in rdn) for rdn in subject]
    return ",".join(reversed(rdns))


@dataclass(frozen=True)
class Rule:
    """``DEFAULT`` (pattern None), or a pattern, its replacement and a case."""

    pattern: re.Pattern[str] | None = None
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        m = self.pattern.fullmatch(name)
        if m is None:
            return None
        out = _expand(m, self.replacement)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


def _expand(m: re.Match[str], replacement: str) -> str:
    """Java's ``Matcher.replaceAll`` of a whole match: ``$n`` a group, ``\\x`` the character x."""
    out = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
        elif c == "$":
            j = i + 1
            while j < len(replacement) and replacement[j].isdigit():
                j += 1
            if j == i + 1:
                raise MappingRuleError(f"Invalid rule: a $ in {replacement!r} names no group")
            group = int(replacement[i + 1 : j])
            if group > (m.re.groups or 0):
                raise MappingRuleError(f"Invalid rule: no group {group} in {m.re.pattern!r}")
            out.append(m.group(group) or "")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _part(text: str, start: int) -> tuple[str, int]:
    """The rule's text up to the next unescaped slash, and the index after that slash."""
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "/":
            return text[start:i], i + 1
        i += 1
    raise MappingRuleError(f"Invalid rule: {text[start:]!r} lacks its closing /")


def parse_rules(text: str | None) -> list[Rule]:
    """``ssl.principal.mapping.rules``; empty is ``DEFAULT``."""
    text = (text or "").strip()
    if not text:
        return [Rule()]
    rules: list[Rule] = []
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in " \t\n,":
            i += 1
        if i >= len(text):
            break
        if text.startswith("DEFAULT", i):
            rules.append(Rule())
            i += len("DEFAULT")
        elif text.startswith("RULE:", i):
            pattern, i = _part(text, i + len("RULE:"))
            replacement, i = _part(text, i)
            case = ""
            if i < len(text) and text[i] in "LU":
                case, i = text[i], i + 1
            try:
                compiled = re.compile(pattern.replace("\\/", "/"))
            except re.error as exc:
                raise MappingRuleError(f"Invalid rule: {pattern!r}: {exc}") from None
            rules.append(Rule(compiled, replacement, case))
        else:
            end = text.find(",", i)
            raise MappingRuleError(f"Invalid rule: {text[i : end if end >= 0 else None].strip()}")
        rest = text[i:].lstrip(" \t\n")
        if rest and not rest.startswith(","):
            raise MappingRuleError(f"Invalid rule: {text!r}: expected a comma before {rest!r}")
    return rules or [Rule()]


def map_name(rules: Iterable[Rule], name: str) -> str:
    """The principal's name the first matching rule makes of ``name``; ``NoMatchingRule`` if none."""
    rules = list(rules)
    for rule in rules:
        mapped = rule.apply(name)
        if mapped is not None:
            return mapped
    raise NoMatchingRule(f"No rules apply to {name}, rules {len(rules)}")
