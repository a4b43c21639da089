"""herd's thin Kafka consumer-group client (group membership and offsets, no fetching).

``from client import GroupConsumer, TopicPartition`` -- see ``client/consumer.py`` for the API;
``from client import KafkaGroupConsumer, Record`` (records from a Kafka data cluster, with herd
coordinating: ``client/kafka_consumer.py``, needs ``pip install herd[kafka]``).

Layout: ``connection`` (sans-IO Kafka connection), ``heartbeat`` (timers taking ``now``),
``coordinator`` (the pure group state machine returning actions), ``assignors`` (range, roundrobin,
sticky, cooperative-sticky, and the registry), ``network`` (the one background thread that owns the
sockets), ``consumer`` (the blocking user API, talking to that thread only through queues and
futures), ``errors``, ``config``, ``security`` (TLS / SASL settings, the sans-IO TLS layer),
``types``.
"""

from client.assignors import (
    Assignor,
    CooperativeStickyAssignor,
    MemberAssignment,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    create_assignor,
    register_assignor,
    registered_assignors,
)
from client.consumer import GroupConsumer, RebalanceListener
from client.errors import *  # noqa: F403
from client.errors import __all__ as _errors_all
from client.kafka_consumer import KafkaGroupConsumer, Record
from client.types import COOPERATIVE, EAGER, OffsetAndMetadata, TopicPartition

__all__ = [
    "GroupConsumer",
    "KafkaGroupConsumer",
    "Record",
    "RebalanceListener",
    "TopicPartition",
    "OffsetAndMetadata",
    "Assignor",
    "MemberSubscription",
    "MemberAssignment",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "CooperativeStickyAssignor",
    "register_assignor",
    "registered_assignors",
    "create_assignor",
    "EAGER",
    "COOPERATIVE",
    *_errors_all,
]
