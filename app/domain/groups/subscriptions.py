"""The subscriptions of a consumer group of the next-generation protocol (KIP-848): the topics
each member subscribes to, by name or by a regular expression matched as Kafka's RE2/J matches it;
the metadata of the subscribed topics, whose change bumps the group epoch; and the server assignor
the members ask for. Pure, as ``app.domain.groups.consumer_group``, whose members these read."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Mapping, Protocol

from app.domain.groups.assignors import ASSIGNORS
from app.domain.share_groups import TopicMetadata
from app.errors import ErrorCode, TxlogError


class Subscription(Protocol):
    """What a member subscribes to (``ConsumerMember`` has it)."""

    @property
    def subscribed_topic_names(self) -> frozenset[str]: ...
    @property
    def subscribed_topic_regex(self) -> str | None: ...
    @property
    def server_assignor(self) -> str | None: ...


# What Kafka's RE2/J reads but Python's ``re`` reads otherwise or not at all: refused rather than
# matched differently (Unicode classes, POSIX classes, \Q..\E quoting, \z, \C).
_UNSERVED = re.compile(r"\\[pPQEzC]|\[\[:")
# What RE2/J refuses itself (and Kafka answers INVALID_REGULAR_EXPRESSION): lookarounds and
# backreferences.
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]")


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> re.Pattern[str]:
    """A subscription's regular expression, matched against whole topic names as Kafka matches
    them; INVALID_REGULAR_EXPRESSION when it does not compile or uses syntax txlog cannot serve
    as Kafka's RE2/J does."""
    problem = None
    if _UNSERVED.search(pattern) or _NOT_RE2.search(pattern):
        problem = "unsupported syntax"
    else:
        try:
            return re.compile(pattern)
        except re.error as exc:
            problem = str(exc)
    raise TxlogError(
        ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex `{pattern}` is not a valid regular expression: {problem}."
    )


def member_topics(member: Subscription, topics: Iterable[str]) -> frozenset[str]:
    """The topic names the member subscribes to among ``topics`` (its names, and those its
    regular expression matches whole)."""
    names = set(member.subscribed_topic_names)
    if member.subscribed_topic_regex:
        pattern = compile_regex(member.subscribed_topic_regex)
        names |= {t for t in topics if pattern.fullmatch(t)}
    return frozenset(names)


def subscription_metadata(members: Iterable[Subscription], topics: Mapping[str, TopicMetadata]) -> dict[str, TopicMetadata]:
    """The metadata of every existing topic some member subscribes to (a topic that does not exist
    is left out: it is assigned once it is created, at the heartbeat that sees it)."""
    names: set[str] = set()
    for m in members:
        names |= member_topics(m, topics)
    return {name: topics[name] for name in sorted(names) if name in topics}


def preferred_assignor(members: Iterable[Subscription]) -> str:
    """The server assignor most members ask for (ties by name), else the default."""
    counts: dict[str, int] = {}
    for m in members:
        if m.server_assignor:
            counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
    if not counts:
        return ASSIGNORS[0]
    return min(counts, key=lambda name: (-counts[name], name))
