"""An append that breaks a turn rule the loader enforces is refused before it is written, on every session a
persistence coordinator holds (issue #36 item 4): it used to be acknowledged, and the session then loaded as
corrupt. The rule is the loader's own ``TurnValidator``, run incrementally on the live append."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, Session, SessionStore, TurnInvariantError
from dsh.session_persistence._model.validator import validate_turns
from dsh.session_persistence.testing import WORK, meta, turn_end, turn_start
from dsh.session_persistence_jsonl import JsonlBackend
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

USER = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}


def types(events: Any) -> list[str]:
    return [event.type for event in events]


async def test_a_wrong_turn_number_in_turn_end_is_refused_and_the_session_still_loads(tmp_path: Path) -> None:
    host = Host()
    store = SessionStore(host)  # no check_turns: the coordinator's hold is what turns the checks on
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path, compression="none")) as persistence:
        session = store.create("s")
        assert session.checks_turns
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("user/message", USER)
        session.append("step/end", {"turn": 1, "step": 1})
        with pytest.raises(TurnInvariantError, match="rule turn-end") as refused:
            session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        assert (refused.value.rule, refused.value.seq) == ("turn-end", 4)
        assert len(session.events) == 4  # nothing appended, nothing handed to the writer
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})  # the state was left as it was
        await store.flush(session)
        store.dispose(session)
        loaded = await persistence.load("s")  # what was acknowledged loads
    assert types(loaded.events) == ["turn/start", "step/start", "user/message", "step/end", "turn/end"]


async def test_a_session_live_before_the_coordinator_started_is_checked_from_then_on(tmp_path: Path) -> None:
    host = Host()
    store = SessionStore(host)
    session = store.create("early")
    session.append("turn/start", {"turn": 1})
    assert not session.checks_turns  # no persistence yet: the store's default (the companion may report)
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path, compression="none")) as persistence:
        assert session.checks_turns
        with pytest.raises(TurnInvariantError, match="rule turn-open"):
            session.append("turn/start", {"turn": 2})
        await store.flush(session)
        store.dispose(session)
        inspection = await persistence.inspect("early")
    assert types(inspection.events)[:1] == ["turn/start"]


async def test_a_resumed_session_is_checked_from_its_stored_state(tmp_path: Path) -> None:
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path, compression="none")) as persistence:
        first = store.create("r")
        first.append("turn/start", {"turn": 1})
        first.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await store.flush(first)
        store.dispose(first)
        loaded = await persistence.load("r")
        resumed = store.create("r", seed=loaded.events, meta=loaded.meta)
        with pytest.raises(TurnInvariantError, match="rule turn-number"):
            resumed.append("turn/start", {"turn": 1})  # turn 1 is over: the next is 2
        resumed.append("turn/start", {"turn": 2})
        await store.flush(resumed)
        store.dispose(resumed)
        reloaded = await persistence.load("r")
    # The open turn 2 is closed by the loader's crash repair: the log was readable, and loaded.
    assert types(reloaded.events) == ["turn/start", "turn/end", "session/end-seed", "turn/start", "turn/end"]


async def test_the_coordinators_own_append_refuses_a_batch_the_loader_would_refuse(tmp_path: Path) -> None:
    async with PersistenceCoordinator(Host(), JsonlBackend(tmp_path, compression="none")) as persistence:
        await persistence.create(meta("cold", WORK))
        await persistence.append("cold", [turn_start(0, 1)])
        with pytest.raises(TurnInvariantError, match="rule turn-end"):
            await persistence.append("cold", [turn_end(1, turn=2)])
        assert len((await persistence.read_from("cold", 0)).events) == 1  # nothing was written
        await persistence.append("cold", [turn_end(1, turn=1)])
    # Another coordinator: the state at the stored end is rebuilt from the log once, then kept.
    async with PersistenceCoordinator(Host(), JsonlBackend(tmp_path, compression="none")) as persistence:
        with pytest.raises(TurnInvariantError, match="rule turn-number"):
            await persistence.append("cold", [turn_start(2, 1)])
        await persistence.append("cold", [turn_start(2, 2)])
        with pytest.raises(TurnInvariantError, match="rule turn-open"):
            await persistence.append("cold", [turn_start(3, 3)])
        inspection = await persistence.inspect("cold")
    assert types(inspection.events) == ["turn/start", "turn/end", "turn/start", "turn/end"]  # the last: a closer


_NUMBER = st.integers(min_value=1, max_value=3)
_APPENDS = st.lists(
    st.one_of(
        st.tuples(st.just("turn/start"), st.fixed_dictionaries({"turn": _NUMBER})),
        st.tuples(
            st.just("turn/end"),
            st.fixed_dictionaries({"turn": _NUMBER, "reason": st.sampled_from([{"kind": "completed"}])}),
        ),
        st.tuples(st.just("step/start"), st.fixed_dictionaries({"turn": _NUMBER, "step": _NUMBER})),
        st.tuples(st.just("step/end"), st.fixed_dictionaries({"turn": _NUMBER, "step": _NUMBER})),
        st.tuples(st.just("user/message"), st.just(USER)),
        st.tuples(
            st.just("assistant/chunk"),
            st.fixed_dictionaries(
                {"turn": _NUMBER, "step": _NUMBER, "chunk": st.just({"type": "text-delta", "index": 0, "text": "x"})}
            ),
        ),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(appends=_APPENDS)
def test_whatever_is_appended_what_a_checking_session_holds_passes_the_loaders_rules(
    appends: list[tuple[str, dict[str, Any]]],
) -> None:
    session = Session("p", clock=lambda: 1, check_turns=True)
    refused = 0
    for event_type, data in appends:
        try:
            session.append(event_type, data)
        except TurnInvariantError:
            refused += 1  # refused, and the state it checks the next append against is left as it was
    validate_turns(session.events)  # the loader's walk: raises if a refused event's check had moved the state
    assert len(session.events) == len(appends) - refused
