"""Tokens, scopes and the tokens file (messaging.http.auth)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.errors import TokensFileError, UnauthorizedError
from messaging.http.auth import (
    Principal,
    Scope,
    Tokens,
    hash_token,
    matches,
    new_token,
    parse_scope,
    token_line,
)


def test_scopes_parse_and_match() -> None:
    assert parse_scope("read") == Scope("read")
    assert parse_scope("write=1, chat/*") == Scope("write", ("1", "chat/*"))
    scope = parse_scope("consume=reporter-*")
    assert scope.allows("reporter-1") and not scope.allows("victim")
    assert not parse_scope("read=1").allows("10")  # ids are whole, only * is a prefix
    for bad in ("root", "read=", "admin=1", ""):
        with pytest.raises(ValueError):
            parse_scope(bad)


def test_principal_admin_holds_everything() -> None:
    admin = Principal("ops", (Scope("admin"),))
    assert admin.can("write", "7") and admin.can("consume", "anyone")
    reader = Principal("r", (Scope("read", ("7",)),))
    assert reader.can("read", "7") and not reader.can("read", "8")
    assert not reader.can("write", "7") and not reader.can("admin")


def test_tokens_file_round_trip_and_reload(tmp_path: Path) -> None:
    token = new_token()
    path = tmp_path / "tokens"
    path.write_text("# comment\n\n" + token_line("alice", token, [parse_scope("read=1")]) + "\n")
    assert token not in path.read_text() and hash_token(token) in path.read_text()
    tokens = Tokens(path)
    assert tokens.principal(f"Bearer {token}").name == "alice"
    assert tokens.principal(f"bearer  {token} ").name == "alice"
    for header in (None, "", "Bearer", f"Basic {token}", "Bearer nope"):
        with pytest.raises(UnauthorizedError):
            tokens.principal(header)
    # A broken file keeps the tokens read before.
    path.write_text("alice not-a-hash read\n")
    with pytest.raises(TokensFileError, match=r"tokens:1: expected NAME sha256:HEX"):
        tokens.reload()
    assert tokens.principal(f"Bearer {token}").name == "alice"
    path.write_text(f"bob {hash_token(token)} telepathy\n")
    with pytest.raises(TokensFileError, match="unknown scope 'telepathy'"):
        tokens.reload()
    path.write_text("")
    tokens.reload()
    assert len(tokens) == 0
    with pytest.raises(UnauthorizedError):
        tokens.principal(f"Bearer {token}")


def test_missing_tokens_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(TokensFileError, match="cannot read tokens file"):
        Tokens(tmp_path / "absent")


# -- what a trailing * matches --------------------------------------------------------------

_names = st.text(st.sampled_from("ab/-*1"), max_size=8)


def test_a_prefix_scope_matches_exactly_what_the_readme_says() -> None:
    chat = parse_scope("read=chat/*")
    assert chat.allows("chat") and chat.allows("chat/") and chat.allows("chat/room/1")
    assert not chat.allows("chats") and not chat.allows("cha") and not chat.allows("x/chat")
    loose = parse_scope("read=chat*")
    assert loose.allows("chat") and loose.allows("chats") and loose.allows("chat/room")
    assert not loose.allows("cha")
    assert parse_scope("read=*").allows("anything") and parse_scope("read=*").allows("")
    assert not parse_scope("read=chat").allows("chat/room")  # no * : the name alone


@given(pattern=_names, target=_names)
def test_matches_is_equality_or_the_prefix_rule(pattern: str, target: str) -> None:
    if not pattern.endswith("*"):
        expected = target == pattern
    else:
        prefix = pattern[:-1]
        expected = target.startswith(prefix) or (
            prefix.endswith("/") and target == prefix.removesuffix("/"))
    assert matches(pattern, target) is expected
    if pattern.endswith("/*"):  # NAME/* covers NAME and all under NAME/, nothing else
        name = pattern[:-2]
        assert matches(pattern, name)
        assert matches(pattern, name + "/" + target)
