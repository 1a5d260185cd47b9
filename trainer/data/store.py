"""The regenerated training set on disk.

    meta.json                      what produced it (target fingerprint, sampling, taps, prompt ids)
    shard-00000.parquet            id, category, input_ids, loss_mask, prompt_len, stop_reason
    shard-00000.hidden.safetensors tapped hidden states per row, bfloat16 (only when cached)
    COMPLETE                       written last

The parquet shards are plain `datasets` input: `load_dataset("parquet", data_files="DIR/shard-*.parquet")`.
A shard's parquet file is renamed into place after its hidden states, so its presence means complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.errors import DraftsmithError

# Fields of meta.json that must agree for a resumed run to continue an existing directory.
IDENTITY_FIELDS = ("target_fingerprint", "sampling", "tap_layer_ids", "hidden_cached", "shard_size", "prompt_ids")


@dataclass
class Example:
    id: str
    category: str
    input_ids: list[int]
    prompt_len: int
    stop_reason: str
    hidden: torch.Tensor | None = None
    """Taps of input_ids[:-1], (len - 1, taps * hidden_size), or None when recomputed online."""

    @property
    def loss_mask(self) -> list[int]:
        """1 on the response tokens the target regenerated; prompts (and earlier turns) are context only."""
        return [0] * self.prompt_len + [1] * (len(self.input_ids) - self.prompt_len)


class DataStore:
    def __init__(self, root: Path, meta: dict):
        self.root, self.meta = root, meta

    @classmethod
    def create(cls, root: str | Path, meta: dict) -> DataStore:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        meta_file = root / "meta.json"
        if meta_file.is_file():
            existing = json.loads(meta_file.read_text())
            changed = [f for f in IDENTITY_FIELDS if existing.get(f) != meta.get(f)]
            if changed:
                raise DraftsmithError(f"{root} holds data generated with different {', '.join(changed)}; "
                                      "use a new output directory or delete this one")
        else:
            atomic_write_json(meta_file, meta)
        return cls(root, meta)

    @classmethod
    def open(cls, root: str | Path) -> DataStore:
        root = Path(root)
        if not (root / "COMPLETE").is_file():
            raise DraftsmithError(f"{root} is not a complete regenerated data set; run `draftsmith generate` "
                                  "(it resumes where it stopped)")
        return cls(root, json.loads((root / "meta.json").read_text()))

    def _shard(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.parquet"

    def _hidden(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.hidden.safetensors"

    def has_shard(self, index: int) -> bool:
        return self._shard(index).is_file()

    def shard_tokens(self, index: int) -> int:
        import pyarrow.parquet as pq

        table = pq.read_table(self._shard(index), columns=["input_ids", "prompt_len"]).to_pydict()
        return sum(len(ids) - n for ids, n in zip(table["input_ids"], table["prompt_len"], strict=True))

    def write_shard(self, index: int, examples: list[Example]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if examples and examples[0].hidden is not None:
            with atomic_path(self._hidden(index)) as tmp:
                save_file({f"row{i}": e.hidden.contiguous() for i, e in enumerate(examples)}, tmp)
        table = pa.table({
            "id": [e.id for e in examples],
            "category": [e.category for e in examples],
            "input_ids": pa.array([e.input_ids for e in examples], type=pa.list_(pa.int32())),
            "loss_mask": pa.array([e.loss_mask for e in examples], type=pa.list_(pa.int8())),
            "prompt_len": pa.array([e.prompt_len for e in examples], type=pa.int32()),
            "stop_reason": [e.stop_reason for e in examples],
        })
        with atomic_path(self._shard(index)) as tmp:
            pq.write_table(table, tmp)

    def finish(self) -> None:
        atomic_write_bytes(self.root / "COMPLETE", b"ok\n")

    def shard_indices(self) -> list[int]:
        return sorted(int(p.name[6:11]) for p in self.root.glob("shard-*.parquet"))

    def examples(self, with_hidden: bool = True) -> list[Example]:
        import pyarrow.parquet as pq

        out = []
        for index in self.shard_indices():
            rows = pq.read_table(self._shard(index)).to_pylist()
            hidden = load_file(self._hidden(index)) if with_hidden and self._hidden(index).is_file() else {}
            out.extend(Example(r["id"], r["category"], r["input_ids"], r["prompt_len"], r["stop_reason"],
                               hidden.get(f"row{i}")) for i, r in enumerate(rows))
        return out

    def summary(self) -> dict:
        examples = self.examples(with_hidden=False)
        response_tokens = sum(len(e.input_ids) - e.prompt_len for e in examples)
        return {"examples": len(examples), "response_tokens": response_tokens,
                "stopped": sum(e.stop_reason == "stop" for e in examples),
                "hidden_cached": bool(self.meta.get("hidden_cached"))}

