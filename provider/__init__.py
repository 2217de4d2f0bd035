"""A local OpenAI-compatible provider with its own rate limits, to test token budgets against."""

from .fake_provider import ProviderHandle, start_provider

__all__ = ["ProviderHandle", "start_provider"]
