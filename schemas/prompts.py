"""Prompt files: JSONL, one prompt per line, either chat messages or a bare prompt.

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
    {"prompt": "Write a haiku about speculative decoding."}

Serving logs are prompt files too: a line may be an OpenAI-format chat completion request, exactly as a
client sent it to the customer's server ("traffic as data"):

    {"model": "support-llama", "messages": [{"role": "developer", "content": "..."},
     {"role": "user", "content": [{"type": "text", "text": "..."}]},
     {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "lookup", "arguments": "{\"order\": 7}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "..."}],
     "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {...}}}],
     "temperature": 0.7, "metadata": {"category": "orders"}}

Roles system/developer/user/assistant/tool, text content parts, assistant tool calls and `tools` are kept
(the target's chat template renders them as the server did); the request's other parameters (`model`,
`temperature`, `max_tokens`, `stream`, ...) are accepted and ignored: the job's own sampling parameters are the
ones served. A trailing assistant message (a logged response) is dropped: the target regenerates it. Only
text can be served to a text model: an image or audio part is an error naming its line and the fix.
`metadata.category` labels the line like `category` does.

Used by the API to reject a bad upload before anything is stored (errors carry 1-based line
numbers) and by the trainer to read the same files, so both agree on what a valid line is.
Only pydantic and the standard library: importable without torch or FastAPI.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas import recipe
from schemas.bounds import JsonInputError, MultilineText, SingleLineText, find_control_character, loads_json

BUILTIN_PROMPT_COUNT = 640
"""Prompts in the built-in set (trainer/data/prompts.jsonl; a trainer test keeps the two in step)."""
MAX_LINE_BYTES = 1 << 20  # one prompt larger than 1 MiB is almost certainly a broken file
DEFAULT_MAX_ERRORS = 20
MAX_PROMPTS_PER_FILE = 100_000
"""Prompts one uploaded file may hold: enough for any distillation set at upload sizes (50 MB of ~500-byte chats),
and a bound on the validation an upload costs (a 20 MB file of tiny lines was 1.4 million prompts and 104 s)."""
MAX_PROMPTS_PER_JOB = 1_000_000
"""Prompts one job draws (data.count's bound; a source read whole, data.count null, may hold no more)."""


def prompts_to_draw(source: str, count: int | None) -> int | None:
    """How many prompts a job draws from `source`: data.count, or for the built-in set without one
    recipe.BUILTIN_PROMPTS; None means every prompt of the source (the trainer and the estimate both ask here)."""
    return recipe.BUILTIN_PROMPTS if count is None and source == "builtin" else count


_PROMPT_LINE_RE = re.compile(rb"^[ \t\r\f\v]*[^\s]", re.MULTILINE)


OPENAI_REQUEST_PARAMETERS = frozenset({
    "model", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens", "max_completion_tokens",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "seed",
    "response_format", "tool_choice", "parallel_tool_calls", "store", "service_tier", "reasoning_effort",
    "modalities", "prediction", "audio", "web_search_options", "top_k", "min_p", "repetition_penalty",
    "chat_template_kwargs", "functions", "function_call",
})
"""Chat completion request fields a serving log carries that do not change the conversation: accepted, ignored."""


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"]
    text: MultilineText


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SingleLineText = Field(min_length=1, max_length=200)
    arguments: MultilineText = Field(default="", description="JSON text, as OpenAI sends it.")


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: SingleLineText | None = Field(default=None, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


def _text_only(value: Any) -> Any:
    if isinstance(value, list):
        for index, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"content part {index} is {kind!r}: only text parts can be served to a text model; "
                                 "drop that part (or the line)")
    return value


class ChatMessage(BaseModel):
    """A chat message: plain {role, content}, or the OpenAI request form (text parts, tool calls, tool results)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MultilineText | list[TextPart] | None = None
    name: SingleLineText | None = Field(default=None, max_length=200)
    tool_calls: list[ToolCall] | None = Field(default=None, min_length=1)
    tool_call_id: SingleLineText | None = Field(default=None, max_length=200)

    @field_validator("content", mode="before")
    @classmethod
    def _only_text(cls, value: Any) -> Any:
        return _text_only(value)

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if not self.text and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f'a {self.role} message needs non-empty "content"'
                             + (' (or "tool_calls")' if self.role == "assistant" else ""))
        if self.tool_calls and self.role != "assistant":
            raise ValueError('only assistant messages carry "tool_calls"')
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (Hugging Face's convention): string content, `developer` as
        `system`, tool-call arguments parsed from their JSON text when they are JSON."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text}
        if self.name:
            out["name"] = self.name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            calls = []
            for call in self.tool_calls:
                try:
                    arguments: Any = loads_json(call.function.arguments) if call.function.arguments else {}
                except JsonInputError:
                    arguments = call.function.arguments
                calls.append({"type": "function", **({"id": call.id} if call.id else {}),
                              "function": {"name": call.function.name, "arguments": arguments}})
            out["tool_calls"] = calls
        return out


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["function"]
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _named(cls, value: dict[str, Any]) -> dict[str, Any]:
        name = value.get("name")
        if not isinstance(name, str) or not name or find_control_character(name):
            raise ValueError('a tool needs "function": {"name": "...", ...}')
        return value


class PromptRecord(BaseModel):
    """One line of a prompts file. Exactly one of `messages` or `prompt` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt: MultilineText | None = Field(default=None, min_length=1)
    id: SingleLineText | None = Field(default=None, max_length=200, description="Optional stable name of the prompt.")
    category: SingleLineText | None = Field(default=None, max_length=100,
                                 description="Optional label; validation reports acceptance per category.")
    tools: list[ToolDefinition] | None = Field(default=None, max_length=256,
                                               description="OpenAI tool definitions, rendered by the chat template.")
    metadata: dict[str, SingleLineText] | None = Field(default=None, max_length=64,
                                                       description="OpenAI request metadata; `category` labels the line.")

    @model_validator(mode="before")
    @classmethod
    def _drop_request_parameters(cls, value: Any) -> Any:
        if isinstance(value, dict) and "messages" in value:
            return {k: v for k, v in value.items() if k not in OPENAI_REQUEST_PARAMETERS}
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> PromptRecord:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError('give exactly one of "messages" or "prompt"')
        if self.messages is not None and not any(m.role == "user" for m in self.messages):
            raise ValueError('"messages" needs at least one message with role "user"')
        if self.tools is not None and self.messages is None:
            raise ValueError('"tools" go with "messages" (an OpenAI chat request)')
        return self

    def as_messages(self) -> list[ChatMessage]:
        """The record as a conversation: a bare prompt becomes a single user message; a trailing assistant
        message (a logged response) is dropped, since the target regenerates it."""
        if self.messages is not None:
            messages = list(self.messages)
            while messages and messages[-1].role == "assistant":
                messages.pop()
            return messages
        assert self.prompt is not None
        return [ChatMessage(role="user", content=self.prompt)]

    def template_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat templates take it (`ChatMessage.for_template`)."""
        return [message.for_template() for message in self.as_messages()]

    def label(self) -> str | None:
        """`category`, else `metadata.category`."""
        return self.category or (self.metadata or {}).get("category")


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
        value = loads_json(raw)  # bounded: depth, 64-bit numbers, no NaN (a hostile line cannot crash the parser)
    except JsonInputError as exc:
        raise ValueError(str(exc)) from None
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


def validate_prompt_bytes(data: bytes, *, max_errors: int = DEFAULT_MAX_ERRORS,
                          max_prompts: int = MAX_PROMPTS_PER_FILE) -> PromptFileReport:
    """Validate a whole file held in memory (the API's upload path). A file of more than `max_prompts` prompts is
    refused before any line is parsed (counted at C speed), naming the line where the excess begins."""
    if data.startswith(b"\xef\xbb\xbf"):  # tolerate a UTF-8 byte-order mark, common from editors
        data = data[3:]
    if data.count(b"\n") >= max_prompts:  # only then can there be too many: count the non-blank lines
        for index, match in enumerate(_PROMPT_LINE_RE.finditer(data)):
            if index == max_prompts:
                line = data.count(b"\n", 0, match.start()) + 1
                return PromptFileReport(errors=[PromptLineError(line, (
                    f"the file holds more than {max_prompts} prompts, the most one file may hold; split it into "
                    "several files (a job can draw a sample with data.count)"))], line_count=line)
    # Lines one at a time (the final newline ends the last line; it does not start a new one).
    return validate_prompt_lines(io.BytesIO(data), max_errors=max_errors)


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
