"""Bounds every value must respect before anything stores or acts on it: shared by the API (admission),
the worker and the trainer, so all of them accept exactly the same inputs.

- integers fit a signed 64-bit column (`Int64`, `NonNegativeInt64`); ids that index tensors fit 32 bits;
- text carries no control characters (NUL, escape sequences, C1) nor lone surrogates, which PostgreSQL
  cannot store and terminals and logs misread (`SingleLineText`, `MultilineText`, `check_text`);
- JSON is UTF-8, at most `MAX_JSON_DEPTH` levels deep, without NaN/Infinity and without integer literals
  of more than `MAX_JSON_INT_DIGITS` digits (`loads_json`), checked before the parser could recurse or
  build huge integers; the fields' own bounds then keep integers within 64 bits;
- paths are compared with allowed roots after resolving symlinks (`resolved_path_within_roots`);
- a `file://` URI names one local path, read by one parser everywhere (`file_uri_path`);
- a target size used as a divisor lies in a plausible range (`plausible_target_parameters_billion`);
- a JSON body's values have the JSON type of their field (`JsonBody`, the base of every model the API takes as a
  body and of every section nested in one): no `true`, `"12"` or `12.0` for an integer, no `true` or `"0.7"` for a
  number, no `1` or `"true"` for a boolean.

Pure standard library + pydantic.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1
"""The trainer derives per-shard and per-epoch seeds by multiplying the job's seed; 32 bits keep those in
the 64-bit range torch generators take."""
MAX_JSON_DEPTH = 32
MAX_JSON_INT_DIGITS = 40
"""A job spec nests 4 levels; 32 leaves room for any honest body and stops recursion bombs."""
TARGET_PARAMETERS_BILLION_RANGE = (0.001, 10_000.0)
"""Target sizes an estimate accepts: 1M to 10T parameters. Outside it, the size is a typo (or a divisor of 0)."""

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
NonNegativeInt32 = Annotated[int, Field(ge=0, le=INT32_MAX)]

# C0 controls, DEL and C1 controls, as regex escapes that Python and JSON Schema's regex engines read alike.
CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f"
NO_CONTROL_CHARACTERS_PATTERN = f"^[^{CONTROL_CHARACTERS}]*$"
"""A JSON Schema `pattern` for text without control characters (the OpenAPI document states the rule with it)."""
# Those, and UTF-16 surrogates: a Python string can hold a lone one, no UTF-8 text can (so the pattern above, which
# describes text, leaves them out: regex engines of JSON Schema refuse a surrogate range).
_CONTROL_RE = re.compile(f"[{CONTROL_CHARACTERS}\ud800-\udfff]")
# The same, but tab, line feed and carriage return are allowed: prompts and system prompts are prose.
_CONTROL_MULTILINE_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def find_control_character(value: str, *, multiline: bool = False) -> str | None:
    """The first forbidden character of `value` as `U+XXXX`, or None."""
    match = (_CONTROL_MULTILINE_RE if multiline else _CONTROL_RE).search(value)
    return f"U+{ord(match.group()):04X}" if match else None


def check_text(value: str, *, multiline: bool = False) -> str:
    """Return `value`, or raise ValueError naming the first control character (for pydantic validators)."""
    found = find_control_character(value, multiline=multiline)
    if found:
        allowed = "; tabs and line breaks are allowed" if multiline else ""
        raise ValueError(f"must not contain control characters (found {found}){allowed}")
    return value


SingleLineText = Annotated[str, AfterValidator(check_text)]
MultilineText = Annotated[str, AfterValidator(lambda value: check_text(value, multiline=True))]


class JsonBody(BaseModel):
    """A model the API takes as a JSON body, or a section nested in one: unknown fields are errors (a typo like
    `blocksize` must not be silently ignored), and so is a value of another JSON type than its field's (strict
    mode). Lax pydantic would read `true` as 1, `"12"` as 12 and `12.0` as 12 for an integer, `true` and `"0.7"`
    for a number and `1` or `"yes"` for a boolean: a client's typo or a wrong serialiser would then become a job
    nobody asked for. An integer for a number stays accepted (JSON has one number type: `1` is a fine temperature).

    Strict mode holds for Python callers too (the CLI, the trainer, stored specs read back): they pass values of
    the fields' own types, and a JSON document read back has the types it was written with."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _integer_input(value: Any) -> Any:
    # A Literal of integers matches 2.0 (equal to 2, and hashed alike) even in strict mode, and True where 1 is a
    # choice: this keeps an integer choice as strict as an integer field.
    if isinstance(value, (bool, float)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


INTEGER_CHOICE = BeforeValidator(_integer_input)
"""`Annotated[Literal[2, 3], INTEGER_CHOICE]`: a choice of integers that takes JSON integers only."""


class JsonInputError(ValueError):
    """A body or line that is not acceptable JSON; the message says why."""


_JSON_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """Whether arrays/objects in `text` nest deeper than `max_depth` (strings skipped; no parsing)."""
    brackets = _NOT_BRACKET_RE.sub("", _JSON_STRING_RE.sub('""', text))
    if len(brackets) <= max_depth:
        return False
    depth = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        if depth > max_depth:
            return True
    return False


def _bounded_int(digits: str) -> int:
    # Called by the parser with the literal's text, before any integer is built: a 5000-digit literal is
    # refused here, while one that is merely too large for its field reaches the field's own bound, which
    # names the field.
    if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise JsonInputError(f"a number has more than {MAX_JSON_INT_DIGITS} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonInputError(f"the number {text[:24]} is too large")
    return value


def _no_constants(name: str) -> Any:
    raise JsonInputError(f"{name} is not valid JSON; send a number or null")


def loads_json(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON that is UTF-8, nested at most `max_depth` deep, free of NaN/Infinity and of huge integers.

    Raises JsonInputError (a ValueError) with a message fit for the client.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInputError(f"not valid UTF-8 (byte {exc.start}); send UTF-8 JSON") from None
    else:
        text = raw
    if json_depth_exceeds(text, max_depth):
        raise JsonInputError(f"nested more than {max_depth} levels deep")
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        raise JsonInputError(f"malformed JSON: {exc.msg} at {where}") from None
    except JsonInputError:
        raise
    except (ValueError, RecursionError) as exc:  # defence in depth: whatever else the parser refuses
        raise JsonInputError(f"not acceptable JSON: {exc}"[:200]) from None


def resolved_path_within_roots(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    """Whether `path`, after resolving symlinks and `..` (realpath), lies at or below one of `roots` (resolved
    the same way). A symlink inside a root that points outside it is outside. Components that do not exist
    yet are taken as written, so a path can be checked before it is created; check again when opening it."""
    if any(os.path.normpath(root) == "/" for root in roots):
        return True  # everything is below "/" (no filesystem access needed)
    real = os.path.realpath(path)
    for root in roots:
        real_root = os.path.realpath(root)
        if real_root == "/" or real == real_root or real.startswith(real_root.rstrip("/") + "/"):
            return True
    return False


def file_uri_path(uri: str) -> str:
    """The local path a file:// URI names (`file:///p` or `file://localhost/p`), percent-decoded; ValueError when
    it names another host or a relative path.

    The one parser of file URIs: admission (schemas/job_spec.py), the storage scope
    (domain/storage_scope.py), the worker's fetch (worker/sources.py) and the trainer (trainer/job_config.py,
    trainer/cli_run.py) all read a URI through it, so the path that was checked is the path that is read (a query
    or fragment is not part of the path; `%xx` escapes are decoded once). tests/test_layout.py bans parsing one by
    hand (`.removeprefix("file://")`, slicing off its length)."""
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise ValueError(f"{uri}: not a file URI: file:///absolute/path")
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"{uri}: file URIs name this machine's files: file:///absolute/path")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError(f"{uri}: file URIs must be absolute: file:///absolute/path")
    return path


def plausible_target_parameters_billion(value: float) -> bool:
    low, high = TARGET_PARAMETERS_BILLION_RANGE
    return math.isfinite(value) and low <= value <= high


class TargetLimits(BaseModel):
    """The largest target a deployment loads, judged from config.json and the safetensors headers before anything
    is allocated (trainer/targets/preflight.py). Each is the worker setting DRAFTSMITH_TARGET_<FIELD>; the defaults
    admit every published decoder (a 1-trillion-parameter MoE included) and nothing absurd."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_parameters: int = Field(default=2_000_000_000_000, ge=1, description="Parameters in the weight files.")
    max_layers: int = Field(default=512, ge=1, description="config.json num_hidden_layers.")
    max_hidden_size: int = Field(default=131_072, ge=1, description="hidden, intermediate and head widths.")
    max_vocab_size: int = Field(default=2_097_152, ge=1, description="config.json vocab_size.")
    max_context: int = Field(default=16_777_216, ge=1, description="config.json max_position_embeddings.")
    max_heads: int = Field(default=1_024, ge=1, description="attention and key/value heads.")
    max_experts: int = Field(default=4_096, ge=1, description="routed experts of an MoE layer.")
