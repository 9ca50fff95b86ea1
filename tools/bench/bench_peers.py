"""The peers of section 1: OpenAI Agents SDK ``SQLiteSession`` and LangGraph ``SqliteSaver``, same durable points."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from bench_common import WriteRun, _tree_size, process_cpu_s
from bench_workload import FLUSH, SESSION_ID, Op


def peer_status() -> dict[str, str]:
    """Whether each peer imports here: "ok" or "unavailable: <why>"."""
    out: dict[str, str] = {}
    try:
        import agents  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

        out["sqlitesession"] = "ok"
    except Exception as exc:
        out["sqlitesession"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        import langgraph.checkpoint.sqlite  # type: ignore[import-not-found, unused-ignore]
        import langgraph.graph  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

        out["langgraph"] = "ok"
    except Exception as exc:
        out["langgraph"] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


async def run_sqlitesession(ops: list[Op], where: str) -> WriteRun:
    """OpenAI Agents SDK ``SQLiteSession`` (defaults: WAL, synchronous=FULL): one ``add_items`` per durable point.

    Each item is the event's wire JSON object, so it stores the same records as the other systems.
    """
    from agents import SQLiteSession  # type: ignore[import-not-found, unused-ignore]

    os.makedirs(where, exist_ok=True)
    db = os.path.join(where, "sessions.db")
    cpu_start = process_cpu_s()
    start = time.perf_counter()
    session = SQLiteSession(SESSION_ID, db)
    events = 0
    pending: list[Any] = []
    for op in ops:
        if op is FLUSH:
            if pending:
                await session.add_items(pending)
                pending = []
        else:
            pending.append(op)
            events += 1
    seconds = time.perf_counter() - start
    cpu_s = process_cpu_s() - cpu_start
    session.close()
    size = _tree_size(where)
    start = time.perf_counter()
    reader = SQLiteSession(SESSION_ID, db)
    items = await reader.get_items()
    reload_s = time.perf_counter() - start
    reader.close()
    if len(items) != events:
        raise AssertionError(f"SQLiteSession reload returned {len(items)} items, expected {events}")
    return WriteRun(seconds, events, size, reload_s, cpu_s=cpu_s)


def _lc_message(event: dict[str, Any]) -> Any:
    """One LangChain message per event, carrying the whole event (surface events as their natural message type)."""
    from langchain_core.messages import (  # type: ignore[import-not-found, unused-ignore]
        AIMessage,
        HumanMessage,
        ToolMessage,
    )

    etype = event["type"]
    if etype == "user/message":
        return HumanMessage(content=event["data"]["content"][0]["text"], additional_kwargs={"event": event})
    if etype == "tool/result":
        block = event["data"]["message"]["content"][0]
        return ToolMessage(
            content=block["content"][0]["text"], tool_call_id=block["toolCallId"], additional_kwargs={"event": event}
        )
    if etype == "assistant/message":
        content = event["data"]["message"]["content"]
        calls = [
            {"name": b["name"], "args": json.loads(b["arguments"]), "id": b["id"]}
            for b in content
            if b["type"] == "tool-call"
        ]
        text = "".join(b["text"] for b in content if b["type"] == "text")
        return AIMessage(content=text, tool_calls=calls, additional_kwargs={"event": event})
    return AIMessage(content="", additional_kwargs={"event": event})


def run_langgraph(ops: list[Op], where: str, budget_s: float) -> WriteRun:
    """LangGraph ``SqliteSaver`` (default settings) under a one-node ``StateGraph(MessagesState)``.

    Each durable point is one ``graph.invoke({"messages": <events since the last point>})`` on the same thread, so
    the checkpointer persists at the same points. SqliteSaver stores the whole channel state per checkpoint, so its
    cost per point grows with the history: the run stops at the first durable point after ``budget_s`` and reports
    the prefix it finished (an upper bound on its full-workload throughput).
    """
    from langgraph.checkpoint.sqlite import SqliteSaver  # type: ignore[import-not-found, unused-ignore]
    from langgraph.graph import END, START, MessagesState, StateGraph  # type: ignore[import-not-found, unused-ignore]

    def record(state: MessagesState) -> dict[str, Any]:
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("record", record)
    graph.add_edge(START, "record")
    graph.add_edge("record", END)
    os.makedirs(where, exist_ok=True)
    db = os.path.join(where, "checkpoints.db")
    config: Any = {"configurable": {"thread_id": SESSION_ID}}
    total = sum(1 for op in ops if op is not FLUSH)
    start = time.perf_counter()
    events = 0
    with SqliteSaver.from_conn_string(db) as saver:
        app = graph.compile(checkpointer=saver)
        pending: list[Any] = []
        for op in ops:
            if op is FLUSH:
                if pending:
                    app.invoke({"messages": pending}, config)
                    events += len(pending)
                    pending = []
                    if time.perf_counter() - start > budget_s:
                        break
            else:
                pending.append(_lc_message(op))
        seconds = time.perf_counter() - start
    size = _tree_size(where)
    with SqliteSaver.from_conn_string(db) as saver:
        app = graph.compile(checkpointer=saver)
        start = time.perf_counter()
        state = app.get_state(config)
        reload_s = time.perf_counter() - start
    if len(state.values["messages"]) != events:
        raise AssertionError(f"LangGraph reload returned {len(state.values['messages'])} messages, expected {events}")
    partial = None if events == total else f"{events}/{total} events ({budget_s:.0f} s budget)"
    return WriteRun(seconds, events, size, reload_s, partial)
