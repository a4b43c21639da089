"""Group -> offsets partition, Kafka-identical: abs(javaHashCode(group_id)) % n."""
import itertools
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.partitioning import INT32_MIN, java_string_hash, kafka_abs, shard_for


def reference_hash(s: str) -> int:
    """Java String.hashCode written the obvious way: s[0]*31^(n-1) + ... over UTF-16 units."""
    units = s.encode("utf-16-be")
    codes = [int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2)]
    h = sum(c * 31 ** (len(codes) - 1 - i) for i, c in enumerate(codes)) % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_known_java_values():
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    # the famous string whose hashCode is Integer.MIN_VALUE
    assert java_string_hash("polygenelubricants") == INT32_MIN


def test_min_value_maps_to_shard_zero():
    assert kafka_abs(INT32_MIN) == 0  # Math.abs would stay negative
    for n in (1, 7, 50, 1000):
        assert shard_for("polygenelubricants", n) == 0


def test_brute_force_min_value_and_negative_hashes():
    """Search short strings for Integer.MIN_VALUE and for negative hashes; both must land where
    Kafka would put them."""
    found_negative = False
    alphabet = string.ascii_letters + string.digits + "-_."
    for n in (5, 6):
        for chars in itertools.islice(itertools.product(alphabet, repeat=n), 200_000):
            s = "".join(chars)
            h = java_string_hash(s)
            if h < 0:
                found_negative = True
                assert shard_for(s, 50) == (-h) % 50
                break
        if found_negative:
            break
    assert found_negative


def test_negative_hash_example():
    s = "consumer-group-with-a-long-name"
    h = java_string_hash(s)
    assert h == reference_hash(s)
    assert h < 0
    assert shard_for(s, 50) == abs(h) % 50


def test_non_bmp_characters_count_as_two_code_units():
    emoji = "\U0001F600"  # UTF-16: D83D DE00
    assert java_string_hash(emoji) == 31 * 0xD83D + 0xDE00
    assert java_string_hash("a" + emoji + "b") == reference_hash("a" + emoji + "b")
    # not the same as hashing the code point once
    assert java_string_hash(emoji) != 0x1F600


@given(st.text(max_size=40))
def test_matches_reference(s):
    assert java_string_hash(s) == reference_hash(s)
    assert 0 <= shard_for(s, 50) < 50
    assert shard_for(s, 50) == kafka_abs(reference_hash(s)) % 50


def test_never_python_hash():
    # deterministic across calls and independent of PYTHONHASHSEED by construction
    assert shard_for("my-group", 50) == kafka_abs(java_string_hash("my-group")) % 50


def test_bad_partition_count():
    with pytest.raises(ValueError):
        shard_for("g", 0)
