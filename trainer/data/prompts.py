"""Prompt sets: the built-in set, or a user's JSONL / Parquet file of chat messages or plain prompts.

Every line/row is validated (schemas/prompts.py, shared with the API) before any compute is spent, and
errors name the line. The hold-out split is decided by a hash of each prompt's id, so it is stable when
the set grows or is reordered.

Serving logs (OpenAI chat requests, schemas/prompts.py) repeat themselves: the same question, the same system
prompt and tools, many times. Conversations are deduplicated on what the target would be shown (messages and
tools, whitespace normalised; the first occurrence is kept), and a job drawing fewer prompts than the source
holds samples each category in proportion to its share, every category at least once while the count allows,
so a retrain learns the distribution actually served rather than whatever the log repeated most.
Categories: the line's `category` or `metadata.category`; unlabelled requests with tools (or tool results) are
`tool_use`, unlabelled multi-turn conversations `multi_turn`, anything else `uncategorised`.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from schemas.prompts import iter_prompt_records, parse_prompt_line, prompts_to_draw
from trainer.errors import DraftsmithError

BUILTIN = Path(__file__).parent / "prompts.jsonl"


class PromptsError(DraftsmithError):
    """A prompts file cannot be used."""

    code = "prompts_invalid"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None
    """OpenAI tool definitions the request carried; the chat template renders them (`render_prompt(tools=)`)."""


def load_prompts(source: str | Path = "builtin") -> list[Prompt]:
    """Read and validate every prompt of `source` ("builtin", a .jsonl or a .parquet file)."""
    path = BUILTIN if str(source) == "builtin" else Path(source)
    if not path.is_file():
        raise PromptsError(f"prompts file {path} does not exist")
    try:
        if path.suffix == ".parquet":
            records = _parquet_records(path)
        else:
            records = list(iter_prompt_records(str(path)))
    except ValueError as exc:
        raise PromptsError(str(exc)) from None
    if not records:
        raise PromptsError(f"prompts file {path} is empty; give one JSON object per line "
                           '({"messages": [...]} or {"prompt": "..."})')
    prompts, seen, conversations = [], set(), set()
    for index, record in enumerate(records):
        prompt_id = record.id or f"{path.stem}-{index + 1:05d}"
        if prompt_id in seen:
            raise PromptsError(f"prompts file {path}: duplicate id {prompt_id!r} (record {index + 1}); ids must be unique")
        seen.add(prompt_id)
        messages = tuple(record.template_messages())
        tools = tuple(t.model_dump(exclude_none=True) for t in record.tools) if record.tools else None
        key = conversation_key(messages, tools)
        if key in conversations:
            continue  # a repeat of an earlier conversation: the first one stands for both
        conversations.add(key)
        prompts.append(Prompt(prompt_id, record.label() or _derived_category(messages, tools), messages, tools))
    return prompts


def conversation_key(messages: tuple[dict, ...], tools: tuple[dict, ...] | None) -> str:
    """What the target is shown, with runs of whitespace collapsed: equal keys are the same prompt."""
    normal = [{**m, "content": " ".join(str(m.get("content", "")).split())} for m in messages]
    return hashlib.sha256(json.dumps([normal, tools], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _derived_category(messages: tuple[dict, ...], tools: tuple[dict, ...] | None) -> str:
    if tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        return "tool_use"
    if sum(m["role"] == "user" for m in messages) > 1:
        return "multi_turn"
    return "uncategorised"


def _parquet_records(path: Path):
    import json

    import pyarrow.parquet as pq

    records = []
    for row_number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        row = {key: value for key, value in row.items() if value is not None}
        try:
            records.append(parse_prompt_line(json.dumps(row)))
        except ValueError as exc:
            raise ValueError(f"{path}: row {row_number}: {exc}") from None
    return records


def draw_prompts(source: str | Path, count: int | None, seed: int = 0) -> list[Prompt]:
    """The prompts a job draws from `source` (hold-out included): `count` of them, or every one; from the built-in
    set without a count, recipe.BUILTIN_PROMPTS of them."""
    return sample_prompts(load_prompts(source), prompts_to_draw(str(source), count), seed)


def sample_prompts(prompts: list[Prompt], count: int | None, seed: int = 0) -> list[Prompt]:
    """`count` prompts of `prompts`, a seeded sample in file order (all of them when count is None or larger),
    drawn per category in proportion to its share (largest remainders), every category at least once while
    `count` allows: a small job still sees every category the source has."""
    if count is None or count >= len(prompts):
        return prompts
    by_category: dict[str, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(index)
    quotas = {name: 0 for name in by_category}
    if count >= len(by_category):
        quotas = {name: 1 for name in by_category}
    remaining = count - sum(quotas.values())
    exact = {name: remaining * len(members) / len(prompts) for name, members in by_category.items()}
    for name in by_category:
        quotas[name] += int(exact[name])
    leftover = count - sum(quotas.values())
    order = sorted(by_category, key=lambda name: (-(exact[name] - int(exact[name])), -len(by_category[name]), name))
    for name in order:
        if leftover <= 0:
            break
        if quotas[name] < len(by_category[name]):
            quotas[name] += 1
            leftover -= 1
    rng = random.Random(seed)
    keep: set[int] = set()
    for name, members in by_category.items():
        keep.update(rng.sample(members, min(quotas[name], len(members))))
    if len(keep) < count:  # categories smaller than their quota: fill from the rest
        rest = [index for index in range(len(prompts)) if index not in keep]
        keep.update(rng.sample(rest, count - len(keep)))
    return [prompt for index, prompt in enumerate(prompts) if index in keep]


def is_holdout(prompt_id: str, share: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def split_prompts(prompts: list[Prompt], holdout_share: float, seed: int = 0,
                  limit: int | None = None) -> tuple[list[Prompt], list[Prompt]]:
    """(train, holdout). `limit` caps the training prompts, keeping the hold-out intact. The hold-out comes
    interleaved by category (one of each in turn), so validating on its first N prompts covers every
    category instead of whichever the file lists first."""
    if not 0 < holdout_share < 1:
        raise PromptsError(f"holdout share must be in (0, 1), got {holdout_share}")
    train = [p for p in prompts if not is_holdout(p.id, holdout_share, seed)]
    holdout = [p for p in prompts if is_holdout(p.id, holdout_share, seed)]
    if not train or not holdout:
        raise PromptsError(f"{len(prompts)} prompts are too few to keep a hold-out share of {holdout_share}; "
                           "add prompts or change the share")
    return train[:limit] if limit else train, interleave_categories(holdout)


def interleave_categories(prompts: list[Prompt]) -> list[Prompt]:
    """Round robin over the categories in order of first appearance, each keeping its own order."""
    queues: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        queues.setdefault(prompt.category, []).append(prompt)
    rounds = max((len(q) for q in queues.values()), default=0)
    return [q[i] for i in range(rounds) for q in queues.values() if i < len(q)]
