"""Prompt files: JSONL, one prompt per line, either chat messages or a bare prompt.

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
    {"prompt": "Write a haiku about speculative decoding."}

Used by the API to reject a bad upload before anything is stored (errors carry 1-based line
numbers) and by the trainer to read the same files, so both agree on what a valid line is.
Only pydantic and the standard library: importable without torch or FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_LINE_BYTES = 1 << 20  # one prompt larger than 1 MiB is almost certainly a broken file
DEFAULT_MAX_ERRORS = 20


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


class PromptRecord(BaseModel):
    """One line of a prompts file. Exactly one of `messages` or `prompt` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    id: str | None = Field(default=None, max_length=200, description="Optional stable name of the prompt.")
    category: str | None = Field(default=None, max_length=100,
                                 description="Optional label; validation reports acceptance per category.")

    @model_validator(mode="after")
    def _exactly_one(self) -> PromptRecord:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError('give exactly one of "messages" or "prompt"')
        if self.messages is not None and not any(m.role == "user" for m in self.messages):
            raise ValueError('"messages" needs at least one message with role "user"')
        return self

    def as_messages(self) -> list[ChatMessage]:
        """The record as a conversation: a bare prompt becomes a single user message."""
        if self.messages is not None:
            return list(self.messages)
        assert self.prompt is not None
        return [ChatMessage(role="user", content=self.prompt)]


@dataclass(frozen=True)
class PromptLineError:
    line: int  # 1-based
    message: str


@dataclass
class PromptFileReport:
    """What validating a file found. `valid` is False if any line was rejected or none was usable."""

    prompt_count: int = 0
    line_count: int = 0
    errors: list[PromptLineError] = field(default_factory=list)
    truncated: bool = False  # more errors than were kept

    @property
    def valid(self) -> bool:
        return not self.errors and self.prompt_count > 0


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{location}: {message}" if location else message)
    return "; ".join(parts)


def parse_prompt_line(raw: bytes | str) -> PromptRecord:
    """Parse one line; raise ValueError with a human-readable reason."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_LINE_BYTES:
            raise ValueError(f"line is longer than {MAX_LINE_BYTES} bytes")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ValueError('each line must be a JSON object with "messages" or "prompt"')
    try:
        return PromptRecord.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_describe(exc)) from None


def validate_prompt_lines(
    lines: Iterable[bytes | str], *, max_errors: int = DEFAULT_MAX_ERRORS
) -> PromptFileReport:
    """Check every line; blank lines are skipped. Keeps at most `max_errors` errors."""
    report = PromptFileReport()
    for number, raw in enumerate(lines, start=1):
        report.line_count = number
        if not raw.strip():
            continue
        try:
            parse_prompt_line(raw.rstrip(b"\r\n") if isinstance(raw, bytes) else raw.rstrip("\r\n"))
        except ValueError as exc:
            if len(report.errors) < max_errors:
                report.errors.append(PromptLineError(number, str(exc)))
            else:
                report.truncated = True
            continue
        report.prompt_count += 1
    if report.prompt_count == 0 and not report.errors:
        report.errors.append(PromptLineError(max(report.line_count, 1), "the file contains no prompts"))
    return report


def validate_prompt_bytes(data: bytes, *, max_errors: int = DEFAULT_MAX_ERRORS) -> PromptFileReport:
    """Validate a whole file held in memory (the API's upload path)."""
    if data.startswith(b"\xef\xbb\xbf"):  # tolerate a UTF-8 byte-order mark, common from editors
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":  # the final newline ends the last line; it does not start a new one
        lines.pop()
    return validate_prompt_lines(lines, max_errors=max_errors)


def iter_prompt_records(path: str) -> Iterator[PromptRecord]:
    """Read a prompts file, raising ValueError('line N: ...') at the first bad line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                yield parse_prompt_line(raw.rstrip(b"\r\n"))
            except ValueError as exc:
                raise ValueError(f"{path}: line {number}: {exc}") from None
