"""The regenerated training set on disk.

    meta.json                      what produced it (target fingerprint, sampling, taps, prompt ids)
    shard-00000.parquet            id, category, input_ids, loss_mask, prompt_len, stop_reason
    shard-00000.hidden.safetensors tapped hidden states per row, bfloat16 (only when cached), and the
                                   target's teacher signal per row (rowN.teacher_ids / .teacher_logits /
                                   .teacher_final) when regeneration kept it
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
class TeacherSignal:
    """The target's own prediction of every response token: row j is what it computed right before emitting
    response token j (from the prompt's last position, then from each response token)."""

    ids: torch.Tensor
    """(n, k) int32: its k most likely tokens."""
    logits: torch.Tensor
    """(n, k) float32: their raw logits (no temperature or filtering applied)."""
    final_hidden: torch.Tensor
    """(n, H) bfloat16: its final normed hidden state, the one its LM head read."""


@dataclass
class Example:
    id: str
    category: str
    input_ids: list[int]
    prompt_len: int
    stop_reason: str
    hidden: torch.Tensor | None = None
    """Taps of input_ids[:-1], (len - 1, taps * hidden_size), or None when recomputed online."""
    teacher: TeacherSignal | None = None
    """The target's prediction of each response token, when regeneration kept it."""

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

    def write_shard(self, index: int, examples: list[Example]) -> list[Path]:
        """Write one shard; return its files in the order written (the parquet file, which marks it whole, last)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tensors = {f"row{i}": e.hidden.contiguous() for i, e in enumerate(examples) if e.hidden is not None}
        for i, e in enumerate(examples):
            if e.teacher is not None:
                tensors.update({f"row{i}.teacher_ids": e.teacher.ids.contiguous(),
                                f"row{i}.teacher_logits": e.teacher.logits.contiguous(),
                                f"row{i}.teacher_final": e.teacher.final_hidden.contiguous()})
        written = []
        if tensors:
            with atomic_path(self._hidden(index)) as tmp:
                save_file(tensors, tmp)
            written.append(self._hidden(index))
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
        return [*written, self._shard(index)]

    def shard_paths(self, index: int) -> list[Path]:
        """A shard's files in the order `write_shard` writes them: hidden states (absent when not cached), parquet."""
        return [self._hidden(index), self._shard(index)]

    def finish(self) -> None:
        atomic_write_bytes(self.root / "COMPLETE", b"ok\n")

    def shard_indices(self) -> list[int]:
        return sorted(int(p.name[6:11]) for p in self.root.glob("shard-*.parquet"))

    def examples(self, with_hidden: bool = True, tap_layer_ids: list[int] | None = None,
                 with_teacher: bool = True) -> list[Example]:
        """Every example; `tap_layer_ids` (a subset of the stored taps, any order) selects those columns."""
        import pyarrow.parquet as pq

        columns = self._tap_columns(tap_layer_ids)
        out = []
        for index in self.shard_indices():
            rows = pq.read_table(self._shard(index)).to_pylist()
            tensors = load_file(self._hidden(index)) if (with_hidden or with_teacher) and \
                self._hidden(index).is_file() else {}
            for i, r in enumerate(rows):
                hidden = tensors.get(f"row{i}") if with_hidden else None
                if hidden is not None and columns is not None:
                    hidden = hidden.view(hidden.shape[0], -1, hidden.shape[1] // len(self.meta["tap_layer_ids"]))
                    hidden = hidden[:, columns].flatten(1)
                teacher = None
                if with_teacher and f"row{i}.teacher_ids" in tensors:
                    teacher = TeacherSignal(tensors[f"row{i}.teacher_ids"], tensors[f"row{i}.teacher_logits"],
                                            tensors[f"row{i}.teacher_final"])
                out.append(Example(r["id"], r["category"], r["input_ids"], r["prompt_len"], r["stop_reason"],
                                   hidden, teacher))
        return out

    def _tap_columns(self, tap_layer_ids: list[int] | None) -> list[int] | None:
        stored = list(self.meta.get("tap_layer_ids") or [])
        if tap_layer_ids is None or list(tap_layer_ids) == stored:
            return None
        missing = [i for i in tap_layer_ids if i not in stored]
        if missing:
            raise DraftsmithError(f"the data holds target layers {stored}, not {missing}; regenerate with "
                                  "those taps")
        return [stored.index(i) for i in tap_layer_ids]

    def summary(self) -> dict:
        examples = self.examples(with_hidden=False)
        response_tokens = sum(len(e.input_ids) - e.prompt_len for e in examples)
        return {"examples": len(examples), "response_tokens": response_tokens,
                "stopped": sum(e.stop_reason == "stop" for e in examples),
                "hidden_cached": bool(self.meta.get("hidden_cached"))}

