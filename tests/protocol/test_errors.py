"""protocol.errors: Kafka's error codes, names and retriable flags."""


from protocol import errors
from tests.support.shared import require_shared, shared_path

TSV = shared_path("kafka-spec", "errors.tsv")

# Facts from Kafka's Errors.java that herd's group coordinator relies on.
KNOWN = {
    "UNKNOWN_SERVER_ERROR": (-1, False), "NONE": (0, False), "UNKNOWN_TOPIC_OR_PARTITION": (3, True),
    "REQUEST_TIMED_OUT": (7, True), "OFFSET_METADATA_TOO_LARGE": (12, False),
    "COORDINATOR_LOAD_IN_PROGRESS": (14, True), "COORDINATOR_NOT_AVAILABLE": (15, True),
    "NOT_COORDINATOR": (16, True), "ILLEGAL_GENERATION": (22, False),
    "INCONSISTENT_GROUP_PROTOCOL": (23, False), "INVALID_GROUP_ID": (24, False),
    "UNKNOWN_MEMBER_ID": (25, False), "INVALID_SESSION_TIMEOUT": (26, False),
    "REBALANCE_IN_PROGRESS": (27, False), "INVALID_COMMIT_OFFSET_SIZE": (28, False),
    "GROUP_AUTHORIZATION_FAILED": (30, False), "UNSUPPORTED_VERSION": (35, False),
    "NON_EMPTY_GROUP": (68, False), "GROUP_ID_NOT_FOUND": (69, False),
    "MEMBER_ID_REQUIRED": (79, False), "GROUP_MAX_SIZE_REACHED": (81, False),
    "FENCED_INSTANCE_ID": (82, False), "FENCED_MEMBER_EPOCH": (110, False),
    "UNRELEASED_INSTANCE_ID": (111, False), "STALE_MEMBER_EPOCH": (113, False),
    "INVALID_REGULAR_EXPRESSION": (128, False),
}


def test_well_known_codes():
    assert errors.UNKNOWN_MEMBER_ID == 25
    assert errors.REBALANCE_IN_PROGRESS == 27
    assert errors.is_retriable(errors.COORDINATOR_NOT_AVAILABLE)
    assert not errors.is_retriable(errors.UNKNOWN_MEMBER_ID)
    for name, (code, retriable) in KNOWN.items():
        assert getattr(errors, name) == code, name
        assert errors.Errors[name] == code
        assert errors.ERRORS[code].name == name
        assert errors.is_retriable(code) is retriable, name
        assert errors.error_name(code) == name


def test_table_is_consistent():
    assert set(errors.ERRORS) == set(range(-1, 129))
    assert len(errors.Errors) == len(errors.ERRORS)
    for code, info in errors.ERRORS.items():
        assert info.code == code
        assert getattr(errors, info.name) == code
        assert errors.Errors(code).name == info.name
    assert sum(info.retriable for info in errors.ERRORS.values()) == 31
    assert errors.ERRORS[0].message == ""


def test_unknown_codes():
    assert errors.error_name(9999) == "UNKNOWN_ERROR_CODE_9999"
    assert errors.is_retriable(9999) is False
    assert errors.is_retriable(-2) is False


def test_every_row_of_errors_tsv():
    require_shared("kafka-spec", "errors.tsv")
    lines = TSV.read_text().splitlines()
    assert lines[0].split("\t") == ["code", "name", "retriable", "default_message", "exception_class"]
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    # 130 codes (-1..128); the README's "131 rows" counts the header line
    assert len(rows) == len(errors.ERRORS) == 130
    for code, name, retriable, message, exc in rows:
        info = errors.ERRORS[int(code)]
        assert (info.name, info.retriable, info.message, info.exception) == (
            name, retriable == "true", message, exc), code
        assert getattr(errors, name) == int(code)
