"""The chat record (raypack.text.chat.Chat): a conversation (input.messages_field: a list of
{role, content, ...} messages, and the `tools` it may call) or a prompt/completion pair
(input.prompt_field, completion_field), read from a decoded JSONL object or Parquet row. Rendered and
masked later, by the tokenize stage (raypack.text.chat); here only its shape is checked, each way of
being wrong a reject with its reason."""

from __future__ import annotations

import json

from raypack.config import Reading
from raypack.corpus.readers.records import Batch, Raw, Reject
from raypack.text.chat import Chat

__all__ = ["chat_fields", "chat_record"]


def chat_fields(reading: Reading) -> list[str]:
    """The columns a chat record is read from."""
    if reading.messages_field is not None:
        return [reading.messages_field]
    return [str(reading.prompt_field), str(reading.completion_field)]


def chat_record(record: dict[str, object], row: int, reading: Reading, batch: Batch, raw: Raw) -> Chat | None:
    """The record's Chat, or None with a reject recorded (missing or mistyped fields, no messages)."""

    def reject(reason: str) -> Chat | None:
        batch.rejects.append(Reject.bad(row, reason, raw))
        return None

    if reading.messages_field is not None:
        field_name = reading.messages_field
        messages = record.get(field_name)
        if messages is None:
            return reject(f"missing messages field {field_name!r}")
        if not isinstance(messages, list):
            return reject(f"messages field {field_name!r} is {type(messages).__name__}, not a list")
        if not messages:
            return reject("empty conversation")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return reject(f"message {i} of {field_name!r} is not an object with a string role")
        tools = record.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                return reject("tools is a string but not JSON")
        return Chat(messages=tuple(messages), tools=tools)
    prompt, completion = record.get(reading.prompt_field or ""), record.get(reading.completion_field or "")
    for name, value in ((reading.prompt_field, prompt), (reading.completion_field, completion)):
        if value is None:
            return reject(f"missing field {name!r}")
        if not isinstance(value, str):
            return reject(f"field {name!r} is {type(value).__name__}, not a string")
    return Chat(prompt=str(prompt), completion=str(completion))
