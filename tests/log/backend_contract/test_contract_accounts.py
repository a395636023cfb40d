"""Backend contract, layer: the log's ownership records and the account store (docs/api.md
§15). A session's owner is written with its first events and goes with its deletion; the
first admin takes the unowned; users are unique ignoring case; a logout-everywhere grows the
epoch; a token is found by its hash only while it lives; a removed user takes their tokens
along and leaves their sessions owned by their (now unknown) id. Every backend passes it."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from backend_kit import Backend

from tether.errors import UserExists
from tether.log import Draft
from tether.log.errors import SessionNotFound
from tether.log.ownership import EVERYONE, VIEWER, OwnedStore


def _created(title: str) -> list[Draft]:
    return [Draft("session.created", {"title": title})]


def test_an_owner_is_recorded_with_the_session_and_survives_a_reopen(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("mine", _created("m"), owner="usr_a")
        await store.create_session("loose", _created("l"))
        assert await store.session_owner("mine") == "usr_a"
        assert await store.session_owner("loose") is None
        assert await store.session_owner("unknown") is None
        await store.aclose()
        store = await backend.open()
        assert await store.session_owner("mine") == "usr_a"
        await store.delete_session("mine")
        assert await store.session_owner("mine") is None
        await store.aclose()

    asyncio.run(main())


def test_claim_gives_only_the_unowned_sessions_to_the_first_admin(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("old1", _created("a"))
        await store.create_session("old2", _created("b"))
        await store.create_session("bobs", _created("c"), owner="usr_bob")
        assert await store.claim_unowned("usr_admin") == 2
        assert await store.claim_unowned("usr_other") == 0  # nothing left to claim
        owners = {sid: await store.session_owner(sid) for sid in ("old1", "old2", "bobs")}
        assert owners == {"old1": "usr_admin", "old2": "usr_admin", "bobs": "usr_bob"}
        events = await store.read("old1")
        assert [e.type for e in events] == ["session.created"]  # claiming writes no event
        await store.aclose()
        store = await backend.open()
        assert await store.session_owner("old2") == "usr_admin"
        await store.aclose()

    asyncio.run(main())


def test_the_ownership_filter_hides_another_persons_session_everywhere(backend: Backend) -> None:
    async def main() -> None:
        store = OwnedStore(await backend.open())
        token = VIEWER.set("usr_a")
        try:
            await store.create_session("a1", _created("a"))
        finally:
            VIEWER.reset(token)
        assert await store.session_owner("a1") == "usr_a"  # created by a viewer: theirs
        VIEWER.set("usr_b")
        assert await store.last_seq("a1") is None
        assert await store.index_state("a1") is None
        assert await store.index_states() == {}
        assert await store.read("a1") == []
        assert await store.search_text("a") == set()
        for write in (
            store.append("a1", [Draft("session.updated", {"title": "taken"})]),
            store.delete_session("a1"),
        ):
            with pytest.raises(SessionNotFound):
                await write
        VIEWER.set("usr_a")
        assert await store.last_seq("a1") == 1  # nothing of b's reached it
        VIEWER.set(EVERYONE)
        assert set(await store.index_states()) == {"a1"}
        await store.aclose()

    asyncio.run(main())


def test_users_are_unique_ignoring_case_and_logout_grows_the_epoch(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        accounts = await backend.open_accounts()
        alice = await accounts.add_user("Alice", "$argon2id$fake", admin=True)
        with pytest.raises(UserExists):
            await accounts.add_user("alice", None, admin=False)
        bob = await accounts.add_user("bob", None, admin=False)
        assert [u.username for u in await accounts.users()] == ["Alice", "bob"]
        assert await accounts.user_by_name("ALICE") == alice
        assert await accounts.user_by_id(bob.user_id) == bob
        await accounts.end_sessions(alice.user_id)
        again = await accounts.user_by_id(alice.user_id)
        assert again is not None and again.epoch == alice.epoch + 1
        carol = await accounts.add_user("carol", None, admin=False, external_id="https://idp|c1")
        assert await accounts.user_by_external_id("https://idp|c1") == carol
        assert await accounts.user_by_external_id("https://idp|nobody") is None
        with pytest.raises(UserExists):  # one account per person at the provider
            await accounts.add_user("carol2", None, admin=False, external_id="https://idp|c1")
        await accounts.set_password(bob.user_id, "$argon2id$other")
        changed = await accounts.user_by_name("bob")
        assert changed is not None and changed.password_hash == "$argon2id$other"
        await accounts.aclose()
        await store.aclose()

    asyncio.run(main())


def test_tokens_are_found_by_hash_while_they_live(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        accounts = await backend.open_accounts()
        alice = await accounts.add_user("alice", None, admin=False)
        bob = await accounts.add_user("bob", None, admin=False)
        digest = hashlib.sha256(b"secret").hexdigest()
        token = await accounts.add_token(alice.user_id, "laptop", digest)
        found = await accounts.token_user(digest)
        assert found is not None and found[0] == token and found[1] == alice
        assert await accounts.tokens(alice.user_id) == [token]
        assert await accounts.tokens(bob.user_id) == []
        assert not await accounts.revoke_token(bob.user_id, token.token_id)  # not bob's
        assert await accounts.token_user(digest) is not None
        assert await accounts.revoke_token(alice.user_id, token.token_id)
        assert await accounts.token_user(digest) is None
        assert not await accounts.revoke_token(alice.user_id, token.token_id)
        await accounts.aclose()
        await store.aclose()

    asyncio.run(main())


def test_a_removed_user_takes_their_tokens_and_leaves_their_sessions(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        accounts = await backend.open_accounts()
        bob = await accounts.add_user("bob", None, admin=False)
        digest = hashlib.sha256(b"bob's").hexdigest()
        await accounts.add_token(bob.user_id, "ci", digest)
        await store.create_session("b1", _created("b"), owner=bob.user_id)
        removed = await accounts.remove_user("BOB")
        assert removed == bob
        assert await accounts.remove_user("bob") is None
        assert await accounts.token_user(digest) is None
        assert await accounts.user_by_id(bob.user_id) is None
        assert await store.session_owner("b1") == bob.user_id  # kept, shown to nobody else
        again = await accounts.add_user("bob", None, admin=False)
        assert again.user_id != bob.user_id  # a new bob is not the old one
        await accounts.aclose()
        await store.aclose()

    asyncio.run(main())
