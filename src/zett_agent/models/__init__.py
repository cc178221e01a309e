"""Model adapters for real LLM providers, and ``model_from_spec`` to pick one from a string.

``zett_agent.models.openai.OpenAIChatModel`` talks to any OpenAI-compatible Chat Completions
endpoint, ``zett_agent.models.anthropic.AnthropicModel`` to Anthropic's Messages API; each is
built on its provider's official SDK, an optional extra (``zett-agent[openai]``,
``zett-agent[anthropic]``). Adapters are imported on demand, so importing this package stays
cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zett_agent._model import Model

__all__ = ["model_from_spec"]

_PROVIDERS = ("openai", "anthropic")


def model_from_spec(spec: str, *, base_url: str | None = None) -> Model:
    """The model a ``PROVIDER:NAME`` string names, for command lines and config files.

    ``"openai:NAME"`` gives ``OpenAIChatModel(NAME)``, at ``base_url`` when one is given (else the
    OpenAI API), with the key from ``$OPENAI_API_KEY`` if set; ``"anthropic:NAME"`` gives
    ``AnthropicModel(NAME)``, at ``base_url`` when given (else the Anthropic API), with the key
    from ``$ANTHROPIC_API_KEY``. The name may itself contain colons (``"openai:qwen2.5:7b"``).

    Raises ``ValueError`` for a spec without a provider or name, with an unknown provider (the
    message lists the known ones), or aimed at the provider's own API with no key (the message
    names the variable to set); ``ImportError`` naming the install command when the provider's
    SDK (its extra) is not installed.
    """
    provider, sep, name = spec.partition(":")
    if not sep or not provider or not name:
        raise ValueError(
            f"model spec {spec!r} must look like 'PROVIDER:MODEL_NAME', for example "
            "'openai:gpt-4o-mini' or 'anthropic:claude-sonnet-4-5' (known providers: "
            + ", ".join(_PROVIDERS)
            + ")"
        )
    if provider == "openai":
        from zett_agent.models.openai import OpenAIChatModel

        if base_url is None:
            return OpenAIChatModel(name)
        return OpenAIChatModel(name, base_url=base_url)
    if provider == "anthropic":
        from zett_agent.models.anthropic import AnthropicModel

        if base_url is None:
            return AnthropicModel(name)
        return AnthropicModel(name, base_url=base_url)
    raise ValueError(
        f"unknown model provider {provider!r} in {spec!r}; known providers: "
        + ", ".join(_PROVIDERS)
    )
