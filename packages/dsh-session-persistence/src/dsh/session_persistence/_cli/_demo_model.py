"""Which model the demo runs: the scripted one (the default), or a real one through an installed model adapter.

``dsh-sessions demo --model NAME [--base-url URL] [--api-key KEY]`` runs the same story on the OpenAI-compatible
adapter, found by its entry point (``openai`` in the group ``dsh.session.adapters``, offered by the separate
distribution ``dsh-session-adapter-openai``); the core never imports that distribution. ``--base-url`` defaults to
``$OPENAI_BASE_URL`` and ``--api-key`` to ``$OPENAI_API_KEY``, as in the ``openai`` SDK, but those variables alone
never send the demo to the network: only ``--model`` (or ``--base-url``) on the command line does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ._errors import EXIT_UNAVAILABLE, EXIT_USAGE, CliError

__all__ = [
    "ADAPTER_DISTRIBUTION",
    "ADAPTER_GROUP",
    "ADAPTER_NAME",
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "ModelAdapterMissingError",
    "RealModel",
    "adapter_factory",
    "close_adapter",
    "open_adapter",
    "real_model",
]

ADAPTER_GROUP = "dsh.session.adapters"
ADAPTER_NAME = "openai"
ADAPTER_DISTRIBUTION = "dsh-session-adapter-openai"
BASE_URL_ENV = "OPENAI_BASE_URL"
API_KEY_ENV = "OPENAI_API_KEY"


class ModelAdapterMissingError(CliError):
    """A real model was asked for but its adapter distribution is not installed (or does not load)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNAVAILABLE)


@dataclass(frozen=True)
class RealModel:
    """The model the user named: ``model`` at ``base_url`` (``None``: the SDK's default endpoint), with ``api_key``."""

    model: str
    base_url: str | None
    api_key: str

    def describe(self) -> str:
        """``model NAME at URL`` for the demo's first line (never the key)."""
        return f"model {self.model} at {self.base_url or 'the openai SDK default endpoint'}"


def real_model(
    model: str | None, base_url: str | None, api_key: str | None, environ: Mapping[str, str] = os.environ
) -> RealModel | None:
    """The real model the flags ask for, ``None`` for the scripted demo; a usage error for an incomplete request."""
    if model is None and base_url is None:
        if api_key is not None:
            raise CliError("--api-key needs --model NAME (the demo is scripted without it)", EXIT_USAGE)
        return None
    if not model:
        raise CliError("--base-url needs --model NAME (the model the endpoint serves)", EXIT_USAGE)
    key = api_key or environ.get(API_KEY_ENV) or ""
    if not key:
        raise CliError(
            f"--model needs an API key: set ${API_KEY_ENV} (or --api-key KEY); any non-empty text for a local "
            "server that checks none",
            EXIT_USAGE,
        )
    return RealModel(model=model, base_url=base_url or environ.get(BASE_URL_ENV) or None, api_key=key)


def adapter_factory() -> Callable[..., Any]:
    """The installed OpenAI-compatible adapter class, by entry point (``ModelAdapterMissingError`` without it)."""
    found = [ep for ep in entry_points(group=ADAPTER_GROUP) if ep.name == ADAPTER_NAME]
    if not found:
        raise ModelAdapterMissingError(
            f"the demo on a real model needs the OpenAI-compatible adapter: pip install {ADAPTER_DISTRIBUTION} "
            f"(no '{ADAPTER_NAME}' entry point in the group {ADAPTER_GROUP})"
        )
    try:
        factory: Callable[..., Any] = found[0].load()
    except Exception as exc:  # a broken install (e.g. its openai dependency missing) names the fix too
        raise ModelAdapterMissingError(
            f"the '{ADAPTER_NAME}' model adapter does not load ({type(exc).__name__}: {exc}); reinstall it: "
            f"pip install {ADAPTER_DISTRIBUTION}"
        ) from exc
    return factory


def open_adapter(choice: RealModel) -> Any:
    """An adapter for ``choice`` (the caller closes it with ``aclose``); a bad option is a usage error."""
    factory = adapter_factory()
    try:
        return factory(choice.model, base_url=choice.base_url, api_key=choice.api_key)
    except Exception as exc:
        raise CliError(f"the model adapter refused the options: {exc}", EXIT_USAGE) from exc


async def close_adapter(adapter: Any) -> None:
    """Close what the adapter opened (its HTTP client), if it can be closed."""
    aclose = getattr(adapter, "aclose", None)
    if aclose is not None:
        await aclose()
