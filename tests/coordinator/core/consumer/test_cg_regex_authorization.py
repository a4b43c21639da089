"""Regex subscriptions with ``authorizer = acl`` (ConsumerGroupConfig.authorize_regex): as Kafka 4
(KAFKA-18813) a group's regexes resolve to the topics the member whose heartbeat resolves them may
DESCRIBE; topics it may not describe are not assigned. Without the setting, nothing changes."""
from __future__ import annotations

from coordinator.core.consumer.groups import ConsumerGroupConfig
from tests.coordinator.core.consumer.cg_harness import Client, Harness, run_rounds, tid

SECURED = ConsumerGroupConfig(authorize_regex=True)


class AuthHarness(Harness):
    """Each heartbeat carries its client's TOPIC DESCRIBE (the gate's ``topic_filter``)."""

    def __init__(self, topics, config=SECURED):
        super().__init__(topics, config)
        self.allowed: dict[str, set[str]] = {}  # client id -> topics it may describe
        self.sender = None

    def send(self, req, version: int = 1, client_id: str = "c", client_host: str = "/127.0.0.1"):
        names = self.allowed.get(self.sender)
        may = None if names is None else names.__contains__
        recs, resp = self.groups.heartbeat(req, version, self.now, self.clock.wall_ms(), client_id, client_host,
                                           may_describe=may)
        self.log.extend(recs)
        return resp


class AuthClient(Client):
    def __init__(self, h: AuthHarness, name: str, **kw):
        super().__init__(h, name, **kw)
        self.name = name

    def join(self):
        self.h.sender = self.name
        return super().join()

    def heartbeat(self):
        self.h.sender = self.name
        return super().heartbeat()


def names(c: Client) -> set[bytes]:
    return {t for t, ps in c.owned.items() if ps}


def test_a_regex_is_resolved_to_the_topics_the_member_may_describe():
    h = AuthHarness({"orders.eu": 2, "orders.secret": 2, "payments": 1})
    h.allowed["a"] = {"orders.eu", "orders.us"}
    a = AuthClient(h, "a", topics=[], regex=r"orders\..*")
    a.join()
    run_rounds(h, [a])
    assert names(a) == {tid("orders.eu")}
    assert set(h.group().subscription_metadata) == {"orders.eu"}
    d = h.groups.describe(["g"])[0]
    assert [tp.topic_name for tp in d.members[0].assignment.topic_partitions] == ["orders.eu"]
    h.set_topic("orders.us", 1)  # a new match it may describe: assigned (the last resolver's ACLs)
    h.set_topic("orders.secret2", 1)  # one it may not: left out
    run_rounds(h, [a])
    assert names(a) == {tid("orders.eu"), tid("orders.us")}
    h.assert_replay_equivalent()


def test_the_refreshing_member_s_acls_apply_to_the_group_s_regexes():
    h = AuthHarness({"orders.eu": 2, "orders.secret": 2})
    h.allowed.update(a={"orders.eu"}, b={"orders.eu", "orders.secret"})
    a = AuthClient(h, "a", topics=[], regex=r"orders\..*")
    a.join()
    run_rounds(h, [a])
    assert set(h.group().subscription_metadata) == {"orders.eu"}
    b = AuthClient(h, "b", topics=[], regex=r"orders\..*")  # b joins: its heartbeat resolves the regexes
    b.join()
    run_rounds(h, [a, b])
    assert set(h.group().subscription_metadata) == {"orders.eu", "orders.secret"}
    assert {t for c in (a, b) for t in names(c)} == {tid("orders.eu"), tid("orders.secret")}


def test_explicit_names_are_not_filtered_here():
    """SubscribedTopicNames are checked by the gate (TOPIC_AUTHORIZATION_FAILED): the core keeps them."""
    h = AuthHarness({"t": 2, "orders.x": 1})
    h.allowed["a"] = set()
    a = AuthClient(h, "a", topics=["t"], regex=r"orders\..*")
    a.join()
    run_rounds(h, [a])
    assert names(a) == {tid("t")}


def test_after_a_restart_a_regex_keeps_what_it_had_until_a_member_resolves_it():
    h = AuthHarness({"orders.eu": 2, "orders.secret": 1})
    h.allowed["a"] = {"orders.eu", "orders.us"}
    a = AuthClient(h, "a", topics=[], regex=r"orders\..*")
    a.join()
    run_rounds(h, [a])
    h.groups = h.replayed()  # a restart: nobody's ACLs are known
    h.topics.topics["orders.us"] = (tid("orders.us"), 1)
    h.log.extend(h.groups.topics_changed(h.now, h.clock.wall_ms()))
    assert set(h.group().subscription_metadata) == {"orders.eu"}  # not widened without a resolver
    a.join()  # (a rejoin: a full heartbeat with its ACLs) resolves it again
    run_rounds(h, [a])
    assert set(h.group().subscription_metadata) == {"orders.eu", "orders.us"}


def test_without_the_setting_every_match_is_assigned():
    h = AuthHarness({"orders.eu": 2, "orders.secret": 2}, config=ConsumerGroupConfig())
    h.allowed["a"] = {"orders.eu"}
    a = AuthClient(h, "a", topics=[], regex=r"orders\..*")
    a.join()
    run_rounds(h, [a])
    assert names(a) == {tid("orders.eu"), tid("orders.secret")}


class Acls:
    """A may_describe as the gate makes it: with the authorizer generation it answers for."""

    def __init__(self, names, generation):
        self.names, self.generation = set(names), generation

    def __call__(self, topic):
        return topic in self.names


def test_a_change_of_acls_is_resolved_at_the_next_full_heartbeat():
    h = AuthHarness({"orders.eu": 2, "orders.secret": 1})
    a = AuthClient(h, "a", topics=[], regex=r"orders\..*")
    acls = Acls({"orders.eu"}, generation=1)
    h.send = lambda req, version=1, client_id="c", client_host="/127.0.0.1": _send(h, req, version, acls)
    a.join()
    run_rounds(h, [a])
    assert names(a) == {tid("orders.eu")}
    acls = Acls({"orders.eu", "orders.secret"}, generation=2)  # DESCRIBE granted on orders.secret
    a.heartbeat()
    run_rounds(h, [a])
    assert names(a) == {tid("orders.eu"), tid("orders.secret")}
    h.assert_replay_equivalent()


def _send(h, req, version, acls):
    recs, resp = h.groups.heartbeat(req, version, h.now, h.clock.wall_ms(), "c", "/127.0.0.1", may_describe=acls)
    h.log.extend(recs)
    return resp
