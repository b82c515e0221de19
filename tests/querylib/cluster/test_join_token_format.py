"""The join token's text (querylib/cluster/_join.py, DESIGN §12 "Joining a host"): it carries
the coordinator's CURVE public key when the coordinator is a CURVE server, and parses back."""

import os

import pytest

from querylib.cluster import BadJoinTokenError, format_token, parse_token
from querylib.rpc import coordinator_public_key


def test_a_token_carries_the_coordinators_curve_key_and_parses_back() -> None:
    key = coordinator_public_key(os.urandom(32))
    secret = os.urandom(32)
    text = format_token(["tcp://10.0.0.1:7400", "tcp://10.0.0.2:7400"], 7, secret, key)
    assert text.count(".") == 4
    parsed = parse_token(text)
    assert parsed.coordinators == ("tcp://10.0.0.1:7400", "tcp://10.0.0.2:7400")
    assert (parsed.token_id, parsed.secret, parsed.coordinator_key) == (7, secret, key)
    plain = parse_token(format_token(["tcp://127.0.0.1:7400"], 8, secret))
    assert plain.coordinator_key == "" and plain.token_id == 8


def test_a_damaged_coordinator_key_is_a_damaged_token() -> None:
    text = format_token(["tcp://10.0.0.1:7400"], 7, os.urandom(32),
                        coordinator_public_key(os.urandom(32)))
    with pytest.raises(BadJoinTokenError, match="damaged"):
        parse_token(text[:-6])
