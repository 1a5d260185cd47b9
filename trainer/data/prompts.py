"""Prompt sets: the built-in set, or a user's JSONL / Parquet file of chat messages or plain prompts.

Every line/row is validated (schemas/prompts.py, shared with the API) before any compute is spent, and
errors name the line. The hold-out split is decided by a hash of each prompt's id, so it is stable when
the set grows or is reordered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from schemas.prompts import iter_prompt_records, parse_prompt_line
from trainer.errors import DraftsmithError

BUILTIN = Path(__file__).parent / "prompts.jsonl"


class PromptsError(DraftsmithError):
    """A prompts file cannot be used."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[dict, ...]


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
    prompts, seen = [], set()
    for index, record in enumerate(records):
        prompt_id = record.id or f"{path.stem}-{index + 1:05d}"
        if prompt_id in seen:
            raise PromptsError(f"prompts file {path}: duplicate id {prompt_id!r} (record {index + 1}); ids must be unique")
        seen.add(prompt_id)
        messages = tuple(m.model_dump() for m in record.as_messages())
        prompts.append(Prompt(prompt_id, record.category or "uncategorised", messages))
    return prompts


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
