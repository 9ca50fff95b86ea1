"""An OpenAI-compatible chat model adapter for the dsh sessions agent loop.

::

    from dsh.session_adapter_openai import OpenAIChatAdapter

    model = OpenAIChatAdapter("deepseek-chat", base_url="https://api.deepseek.com/v1", api_key=key)
    agent = await sessions.resume_or_create("s1", model, tools)

It speaks ``/chat/completions`` with ``stream=true`` through the official ``openai`` SDK: text, reasoning and
tool-call deltas become dsh stream chunks, usage a usage chunk, the finish reason a finish chunk, and provider
failures ``finish{error}`` with a stable code. The translation rules are public for adapters that build on them.
"""

from __future__ import annotations

from ._adapter import OpenAIChatAdapter
from ._translate import ChunkTranslator, chat_messages, chat_tools, finish_reason, provider_failure

__all__ = ["ChunkTranslator", "OpenAIChatAdapter", "chat_messages", "chat_tools", "finish_reason", "provider_failure"]
