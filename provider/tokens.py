"""Deterministic token accounting: what a request's prompt costs and how long its reply is.

No tokenizer: the rule is cheap and documented, so a test or a replay can compute the
counts the provider will charge from the request alone.

- Prompt tokens: for each message, ceil(characters / 4) of its text (its content, or the
  text parts of a list content, and its name) plus PER_MESSAGE; plus PER_REPLY for the
  reply's priming. (OpenAI's own counting adds a few tokens per message the same way.)
- Output tokens: the ``x-fake-output-tokens`` header if the request has it, else
  ``metadata.fake_output_tokens`` in the body, else a number from 1 to ``default_spread``
  taken from a SHA-256 of the model and messages, so the same request always gets the
  same length. Never above the request's max_completion_tokens or max_tokens (or the
  provider's default max_tokens when it has neither): a reply cut there ends with
  finish_reason "length".
- Each output token is one word of four characters: " tok", " ens", " and", ...
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

PER_MESSAGE = 4
PER_REPLY = 3
CHARS_PER_TOKEN = 4
_WORDS = (" tok", " ens", " and", " mor", " two", " six", " red", " sky")


class BadRequest(ValueError):
    """The request's body does not have the shape of a chat completion."""


def message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    else:
        raise BadRequest("a message's content must be a string, a list of parts, or null")
    name = message.get("name")
    return text + (name if isinstance(name, str) else "")


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    return PER_REPLY + sum(
        math.ceil(len(message_text(m)) / CHARS_PER_TOKEN) + PER_MESSAGE for m in messages
    )


def max_output(body: Mapping[str, Any], default_max_tokens: int) -> int:
    """The reply's upper bound: max_completion_tokens, else max_tokens, else the default."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadRequest(f"{key} must be a positive integer")
            return value
    return default_max_tokens


def wanted_output(body: Mapping[str, Any], header: Optional[str], default_spread: int) -> int:
    """How many tokens the reply would have without max_tokens (before the cut)."""
    if header is not None:
        try:
            wanted = int(header)
        except ValueError:
            raise BadRequest("x-fake-output-tokens must be an integer") from None
        return max(0, wanted)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "fake_output_tokens" in metadata:
        try:
            # OpenAI's metadata values are strings; a number is taken too.
            return max(0, int(metadata["fake_output_tokens"]))
        except (TypeError, ValueError):
            raise BadRequest("metadata.fake_output_tokens must be an integer") from None
    seed = json.dumps([body.get("model"), body.get("messages")], sort_keys=True)
    digest = hashlib.sha256(seed.encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % default_spread


def output_words(count: int) -> List[str]:
    return [_WORDS[i % len(_WORDS)] for i in range(count)]


def parse_messages(body: Dict[str, Any]) -> List[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest("each message must be an object")
    return messages
