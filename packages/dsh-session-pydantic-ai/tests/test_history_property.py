"""Lossless history: any pydantic-ai history recorded in a session comes back exactly, pydantic-ai's own
``ModelMessagesTypeAdapter`` JSON being the reference, on every store (memory, JSONL and PostgreSQL, plaintext and
sealed), read back by a fresh backend as a new process would."""

from __future__ import annotations

import os
import string
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from dsh.session_persistence import SessionNotFoundError, open_sessions
from dsh.session_persistence.backend import SessionBackend
from dsh.session_pydantic_ai import DshDurability
from dsh.session_pydantic_ai._record import Recorder
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic_ai import messages
from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

StoreFactory = Callable[[], SessionBackend]

pytestmark = pytest.mark.anyio

texts = st.text(max_size=30)
ids = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=8)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8
)
user_content = (
    texts
    | st.builds(ImageUrl, url=st.just("https://example.com/a.png"))
    | st.builds(DocumentUrl, url=st.just("https://example.com/a.pdf"))
    | st.builds(
        BinaryContent, data=st.binary(max_size=40), media_type=st.sampled_from(["image/png", "application/pdf"])
    )
)
if hasattr(messages, "RetryFeedbackPart"):  # pydantic-ai 2.x replaced RetryPromptPart (deprecated) by these two
    retries = st.builds(
        ToolReturnPart, tool_name=ids, content=texts, tool_call_id=ids, timestamp=times, outcome=st.just("retried")
    ) | st.builds(
        messages.RetryFeedbackPart,
        content=texts,
        retry=st.builds(messages.RetryInfo, st.sampled_from(["validation_error", "no_output", "model_retry"])),
        timestamp=times,
    )
else:
    retries = st.builds(
        messages.RetryPromptPart, content=texts, tool_name=st.none() | ids, tool_call_id=ids, timestamp=times
    )
request_parts = st.one_of(
    st.builds(UserPromptPart, content=texts | st.lists(user_content, min_size=1, max_size=3), timestamp=times),
    st.builds(SystemPromptPart, content=texts, timestamp=times),
    st.builds(ToolReturnPart, tool_name=ids, content=json_values, tool_call_id=ids, timestamp=times),
    retries,
)
response_parts = st.one_of(
    st.builds(TextPart, content=texts),
    st.builds(
        ToolCallPart, tool_name=ids, args=st.dictionaries(ids, json_values, max_size=3) | texts, tool_call_id=ids
    ),
    st.builds(ThinkingPart, content=texts, signature=st.none() | texts),
)
requests = st.builds(
    ModelRequest, parts=st.lists(request_parts, min_size=1, max_size=4), instructions=st.none() | texts
)
responses = st.builds(
    ModelResponse,
    parts=st.lists(response_parts, max_size=4),
    usage=st.builds(RequestUsage, input_tokens=st.integers(0, 10**6), output_tokens=st.integers(0, 10**6)),
    model_name=st.none() | texts,
    timestamp=times,
    provider_name=st.none() | texts,
    provider_details=st.none() | st.dictionaries(texts, json_values, max_size=2),
)
histories = st.lists(requests | responses, max_size=6)


def reference(history: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(history)


async def record(store_factory: StoreFactory, session_id: str, history: list[ModelMessage]) -> None:
    """What the capability's hooks do over a run, for any history: record it, close the run, make it durable."""
    async with open_sessions(backend=store_factory()) as sessions:
        try:
            view = await sessions.persistence.load(session_id)
        except SessionNotFoundError:
            live = sessions.store.create(session_id)
        else:
            live = sessions.store.create(session_id, seed=view.events, meta=view.meta)
        await sessions.persistence.wait_ready(live)
        recorder = Recorder(live)
        recorder.check_prefix(history)
        recorder.sync(history)
        recorder.end_run()
        await sessions.store.flush(live)
        sessions.store.dispose(live)


@settings(
    max_examples=10 if os.environ.get("DSH_LONG") != "1" else 200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=histories, more=histories)
async def test_any_history_round_trips_exactly(
    store_factory: StoreFactory, history: list[ModelMessage], more: list[ModelMessage]
) -> None:
    # The reference must itself be stable: a value pydantic-ai's adapter does not read back as it wrote is its own.
    assume(reference(ModelMessagesTypeAdapter.validate_json(reference(history + more))) == reference(history + more))
    session_id = f"h-{uuid.uuid4().hex[:12]}"  # the examples share the test's store
    await record(store_factory, session_id, history)
    async with open_sessions(backend=store_factory()) as sessions, DshDurability(sessions, session_id) as durability:
        assert reference(await durability.history()) == reference(history)
    # A second run extends the stored history (its own turn); the whole comes back, still exact.
    await record(store_factory, session_id, history + more)
    async with open_sessions(backend=store_factory()) as sessions, DshDurability(sessions, session_id) as durability:
        assert reference(await durability.history()) == reference(history + more)
