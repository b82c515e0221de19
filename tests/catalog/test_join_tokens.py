"""Join tokens in the catalog (DESIGN §12 "Joining a host"): an admin mints one, it is
redeemed once, before it expires, for a new executor principal; revoked, it joins nobody;
the catalog never holds its secret."""

from __future__ import annotations

import msgspec
import pytest

from catalog import (
    Catalog,
    CreateToken,
    JoinToken,
    JoinTokenError,
    NotAuthorizedError,
    NotFoundError,
    PrincipalExistsError,
    PrincipalKind,
    RedeemToken,
    RevokeToken,
    User,
    join_principal,
    known_principal,
    principal_kind,
    token_of_principal,
)
from catalog.errors import InvalidCommandError

from ._helpers import add_user

HOUR_MS = 3_600_000


def mint(catalog: Catalog, *, name: str = "", ttl_ms: int = HOUR_MS, at_ms: int = 1000,
         requester: str = "admin", salt: int = 12345) -> JoinToken:
    token = catalog.apply(CreateToken(salt=salt, name=name, ttl_ms=ttl_ms, requester=requester,
                                      at_ms=at_ms)).created
    assert isinstance(token, JoinToken)
    return token


def redeem(catalog: Catalog, token: JoinToken, name: str = "host-b",
           at_ms: int = 2000) -> User:
    user = catalog.apply(RedeemToken(token_id=token.token_id, name=name, at_ms=at_ms)).created
    assert isinstance(user, User)
    return user


def test_a_token_is_redeemed_once_for_a_new_executor_principal() -> None:
    catalog = Catalog()
    token = mint(catalog)
    assert token.expires_at_ms == 1000 + HOUR_MS and not token.used
    assert known_principal(catalog, join_principal(token.token_id))
    user = redeem(catalog, token)
    assert (user.principal, user.role, user.generation) == ("executor:host-b", "executor", 0)
    assert catalog.user("executor:host-b") == user
    used = catalog.find_token(token.token_id)
    assert used is not None and used.used and used.used_by == "executor:host-b"
    # The second joiner with the same token (a race: the core applies one after the other)
    # gets nothing, and no second principal is made.
    with pytest.raises(JoinTokenError, match="used already"):
        redeem(catalog, token, name="host-c")
    assert catalog.user("executor:host-c") is None


def test_an_expired_token_joins_nobody() -> None:
    catalog = Catalog()
    token = mint(catalog, ttl_ms=5000, at_ms=1000)
    with pytest.raises(JoinTokenError, match="expired"):
        redeem(catalog, token, at_ms=6000)
    assert catalog.user("executor:host-b") is None
    assert not catalog.find_token(token.token_id).used  # type: ignore[union-attr]


def test_a_revoked_token_joins_nobody_and_its_holder_is_unknown() -> None:
    catalog = Catalog()
    token = mint(catalog)
    catalog.apply(RevokeToken(token_id=token.token_id, requester="admin"))
    assert catalog.find_token(token.token_id) is None
    assert not known_principal(catalog, join_principal(token.token_id))
    with pytest.raises(JoinTokenError, match="revoked"):
        redeem(catalog, token)
    with pytest.raises(NotFoundError):
        catalog.apply(RevokeToken(token_id=token.token_id, requester="admin"))


def test_only_admins_mint_and_revoke_tokens() -> None:
    catalog = Catalog()
    add_user(catalog, "user:alice")
    with pytest.raises(NotAuthorizedError):
        mint(catalog, requester="user:alice")
    token = mint(catalog)
    with pytest.raises(NotAuthorizedError):
        catalog.apply(RevokeToken(token_id=token.token_id, requester="user:alice"))
    with pytest.raises(NotAuthorizedError):
        mint(catalog, requester=join_principal(token.token_id))


def test_a_token_lives_between_one_second_and_a_week() -> None:
    catalog = Catalog()
    for ttl_ms in (0, 999, 7 * 24 * HOUR_MS + 1):
        with pytest.raises(InvalidCommandError):
            mint(catalog, ttl_ms=ttl_ms)
    mint(catalog, ttl_ms=7 * 24 * HOUR_MS)


def test_a_named_token_makes_that_executor_whatever_the_joiner_asks() -> None:
    catalog = Catalog()
    add_user(catalog, "executor:host-a", role="executor")
    with pytest.raises(PrincipalExistsError):
        mint(catalog, name="host-a")
    token = mint(catalog, name="gpu-1")
    assert redeem(catalog, token, name="whatever").principal == "executor:gpu-1"


def test_joining_under_an_existing_name_is_refused_and_keeps_the_token() -> None:
    catalog = Catalog()
    add_user(catalog, "executor:host-b", role="executor")
    token = mint(catalog)
    with pytest.raises(PrincipalExistsError, match="--host"):
        redeem(catalog, token)
    assert redeem(catalog, token, name="host-c").principal == "executor:host-c"


def test_tokens_survive_replay_and_hold_no_secret() -> None:
    catalog = Catalog()
    token = mint(catalog, salt=987654321)
    redeem(catalog, mint(catalog, salt=5))
    replayed = Catalog.replay(catalog.snapshot())
    assert replayed.find_token(token.token_id) == token
    assert sorted(t.token_id for t in replayed.tokens) == [1, 2]
    assert replayed.counters.next_token_id == 3
    # The record's fields: ids, times, names and a salt. The salt alone keys nothing: the
    # token's secret is derived from it with the cluster secret (querylib.rpc.principal_key).
    assert set(msgspec.structs.asdict(token)) == {
        "token_id", "salt", "name", "created_by", "created_at_ms", "expires_at_ms",
        "used_at_ms", "used_by"}


def test_join_principals() -> None:
    assert principal_kind("join:7") is PrincipalKind.JOIN
    assert token_of_principal("join:7") == 7
    assert token_of_principal("query:7") is None
    for bad in ("join:0", "join:x", "join:"):
        with pytest.raises(InvalidCommandError):
            principal_kind(bad)
