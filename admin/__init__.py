"""``herd groups``: operate on the consumer groups of any Kafka-compatible server.

The same information and options as Kafka's ``kafka-consumer-groups.sh``, spoken over the Kafka
protocol, so it works against herd and against a real Kafka cluster alike::

    herd groups list            [--state [STATE ...]]
    herd groups describe        GROUP... | --all-groups  [--members [--verbose] | --state] [--http HOST:PORT]
    herd groups offsets         GROUP
    herd groups reset-offsets   GROUP... | --all-groups  (--topic T[:P,P..]... | --all-topics)
                                (--to-earliest | --to-latest | --to-offset N | --shift-by N |
                                 --to-datetime ISO8601 | --by-duration PnDTnHnMnS | --to-current)
                                [--dry-run | --execute] [--no-clamp] [--export]
    herd groups reset-offsets   [GROUP... | --all-groups] --from-file FILE.csv [--dry-run | --execute]
    herd groups delete          --group G [--group G ...]
    herd groups delete-offsets  --group G --topic T[:P,P..] [--topic ...]
    herd groups history         GROUP --http HOST:PORT

``describe --http`` and ``history`` send a credential when herd's HTTP port asks for one
(``http_auth_file``): ``--http-token``/``$HERD_HTTP_TOKEN`` (bearer) or ``--http-user``/``$HERD_HTTP_USER``
with ``$HERD_HTTP_PASSWORD`` (basic; asked for on a terminal, never a flag).

Common options: ``--bootstrap-server HOST:PORT[,HOST:PORT]`` (default ``$HERD_BOOTSTRAP`` or
127.0.0.1:9092), ``--data-bootstrap-server`` (where the partitions live, for log-end offsets and
timestamp lookups; default: the bootstrap server), ``--timeout SECONDS`` (the whole command,
default 10), ``--output table|json``, ``--command-config FILE`` (TLS and SASL for every
connection, as Kafka's tool: a client properties file, see ``protocol/client_properties.py``).

How it talks to the server, as Kafka's admin client does: bootstrap, ApiVersions on every connection
(each request uses the highest version both sides support), Metadata for the brokers and the
partition leaders, FindCoordinator to route group requests to the group's coordinator, ListGroups to
every broker, DescribeGroups / OffsetFetch / OffsetCommit / DeleteGroups / OffsetDelete to the
coordinator, ListOffsets to the partition leaders. Coordinator moves (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) are retried until the deadline.

herd keeps no partition data. It advertises Fetch and Produce (consumers need them) and answers
ListOffsets as for empty logs, but serves none of the APIs of a server that stores logs
(``holds_records``), so against it log ends are unknown: ``describe`` shows LOG-END-OFFSET and LAG
as "-", and ``reset-offsets`` refuses what needs them (--to-latest, --to-datetime, --by-duration,
--to-current of a partition without a commit) and does not clamp. ``--data-bootstrap-server``
points those lookups at the cluster that holds the data. A log end below the committed offset
(a truncated log) also shows LAG "-", never a negative number.

reset-offsets plans every group before it commits any: a group it refuses (active, or no plan can
be made for it) is reported and the others are reset, as Kafka's tool does; the exit code is 2 if
any group was not reset.

``history`` reads the flight recorder of a herd daemon from its HTTP endpoint
(``herd serve --metrics-port``): per rebalance, what started it, who was waited for and how long,
the protocol, the members and each phase's duration.

The package, by job: ``session`` (the wire: blocking connections on the thin client's sans-IO
``Connection``, a cluster's brokers and coordinators), ``commands`` (list, describe, offsets,
delete, delete-offsets), ``reset`` (reset-offsets plans), ``history``, ``output`` (tables, JSON),
``cli`` (the argument parser). ``herd_cli`` (the ``herd``
command) imports ``admin.cli`` only for ``herd groups``.
"""
