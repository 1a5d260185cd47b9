"""The regenerated training set on disk.

    meta.json                      what produced it (target fingerprint, sampling, taps, prompt ids)
    shard-00000.parquet            id, category, input_ids, loss_mask, prompt_len, stop_reason
    shard-00000.hidden.safetensors tapped hidden states per row, bfloat16 (only when cached), and the
                                   target's teacher signal per row (rowN.teacher_ids / .teacher_logits /
                                   .teacher_final) when regeneration kept it
    COMPLETE                       written last

The parquet shards are plain `datasets` input: `load_dataset("parquet", data_files="DIR/shard-*.parquet")`.
A shard's parquet file is renamed into place after its hidden states, so its presence means complete.

Reading streams: `DataStore.index()` is a lazy sequence of every example (ExampleIndex) that holds a few shards'
token columns at a time and reads each row's tensors alone, so memory stays flat however many rows the store
holds (docs/CAPACITY.md). `examples()` is that sequence made into a list, for small sets (tests, benches).
"""

from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from schemas.work_files import DataMeta
from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.errors import DraftsmithError


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


def _read_meta(path: Path) -> DataMeta:
    # The folder's own file, parsed here and typed by its model: the store's path stays in the trainer.
    return DataMeta.read(json.loads(path.read_text()))


class DataStore:
    def __init__(self, root: Path, meta: DataMeta):
        self.root, self.meta = root, meta

    @classmethod
    def create(cls, root: str | Path, meta: DataMeta) -> DataStore:
        """A data folder for `meta`: a new one, or the one at `root` when it was made the same way (a resume)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        meta_file = root / DataMeta.FILE
        if meta_file.is_file():
            changed = _read_meta(meta_file).differs_from(meta)
            if changed:
                raise DraftsmithError(f"{root} holds data generated with different {', '.join(changed)}; "
                                      "use a new output directory or delete this one")
        else:
            atomic_write_json(meta_file, meta.to_json())
        return cls(root, meta)

    @classmethod
    def open(cls, root: str | Path) -> DataStore:
        root = Path(root)
        if not (root / "COMPLETE").is_file():
            raise DraftsmithError(f"{root} is not a complete regenerated data set; run `draftsmith generate` "
                                  "(it resumes where it stopped)")
        return cls(root, _read_meta(root / DataMeta.FILE))

    def _shard(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.parquet"

    def _hidden(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.hidden.safetensors"

    def has_shard(self, index: int) -> bool:
        return self._shard(index).is_file()

    def shard_tokens(self, index: int) -> int:
        return sum(len(response) for response in self.shard_responses(index))

    def shard_responses(self, index: int) -> Iterator[list[int]]:
        """Each of a shard's examples' response tokens, in row order (its token columns only)."""
        import pyarrow.parquet as pq

        table = pq.read_table(self._shard(index), columns=["input_ids", "prompt_len"])
        for ids, prompt_len in zip(table.column("input_ids"), table.column("prompt_len"), strict=True):
            yield ids.as_py()[prompt_len.as_py():]

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

    def shard_rows(self, index: int) -> int:
        """A shard's row count, from its parquet footer (no row is read)."""
        import pyarrow.parquet as pq

        return pq.ParquetFile(self._shard(index)).metadata.num_rows

    def index(self, with_hidden: bool = True, tap_layer_ids: list[int] | None = None,
              with_teacher: bool = True, cached_shards: int = 4) -> ExampleIndex:
        """Every example as a lazy sequence, in store order (shard by shard, row by row); `tap_layer_ids` (a
        subset of the stored taps, any order) selects those columns. What training reads (docs/CAPACITY.md)."""
        return ExampleIndex(self, with_hidden, self._tap_columns(tap_layer_ids), with_teacher, cached_shards)

    def examples(self, with_hidden: bool = True, tap_layer_ids: list[int] | None = None,
                 with_teacher: bool = True) -> list[Example]:
        """Every example in one list: memory grows with the store, so only for small sets; training reads
        `index()`."""
        return list(self.index(with_hidden, tap_layer_ids, with_teacher))

    def responses(self) -> Iterator[list[int]]:
        """Each example's response tokens, in store order, a shard at a time (no hidden states read)."""
        for index in self.shard_indices():
            yield from self.shard_responses(index)

    def _tap_columns(self, tap_layer_ids: list[int] | None) -> list[int] | None:
        stored = list(self.meta.tap_layer_ids)
        if tap_layer_ids is None or list(tap_layer_ids) == stored:
            return None
        missing = [i for i in tap_layer_ids if i not in stored]
        if missing:
            raise DraftsmithError(f"the data holds target layers {stored}, not {missing}; regenerate with "
                                  "those taps")
        return [stored.index(i) for i in tap_layer_ids]

    def summary(self) -> dict:
        """Counts from the parquet token columns, a shard at a time: no hidden state or example list is built."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        examples = response_tokens = stopped = 0
        for index in self.shard_indices():
            table = pq.read_table(self._shard(index), columns=["input_ids", "prompt_len", "stop_reason"])
            examples += table.num_rows
            response_tokens += int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py() or 0) - \
                int(pc.sum(table.column("prompt_len")).as_py() or 0)
            stopped += int(pc.sum(pc.equal(table.column("stop_reason"), "stop")).as_py() or 0)
        return {"examples": examples, "response_tokens": response_tokens, "stopped": stopped,
                "hidden_cached": self.meta.hidden_cached}


class _OpenShard:
    """One shard as ExampleIndex caches it: its token columns (arrow, compact) and its tensor file opened for
    reading single rows (memory-mapped: nothing is read until a row asks)."""

    def __init__(self, store: DataStore, index: int, with_tensors: bool):
        import pyarrow.parquet as pq

        self.table = pq.read_table(store._shard(index))
        hidden_file = store._hidden(index)
        self.tensors = safe_open(hidden_file, framework="pt") if with_tensors and hidden_file.is_file() else None
        self.keys = set(self.tensors.keys()) if self.tensors is not None else set()

    def tensor(self, key: str) -> torch.Tensor | None:
        return self.tensors.get_tensor(key) if key in self.keys else None


class ExampleIndex(Sequence[Example]):
    """Every example of a store, addressed by its global index (store order: shard by shard, row by row), loaded
    on demand. Only the row counts are read up front (parquet footers); a row's shard is opened when asked for
    and kept in a small LRU cache, and its tensors are read alone (safetensors' safe_open), so memory is flat
    in the number of examples. Same examples, same order, same values as a list of them: training's order
    (trainer/training/data.py ExampleOrder) indexes it exactly as it indexed the list."""

    def __init__(self, store: DataStore, with_hidden: bool, tap_columns: list[int] | None, with_teacher: bool,
                 cached_shards: int = 4):
        self.store, self.with_hidden, self.with_teacher = store, with_hidden, with_teacher
        self.tap_columns, self.cached_shards = tap_columns, max(1, cached_shards)
        self.shards = store.shard_indices()
        # starts[k]: global index of shard k's first row; starts[-1]: the total.
        self.starts = [0]
        for index in self.shards:
            self.starts.append(self.starts[-1] + store.shard_rows(index))
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, position):  # int -> Example; slice -> list[Example] (as a list slice would give)
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(f"example {position} of {len(self)}")
        shard = bisect.bisect_right(self.starts, position) - 1
        return self._example(self._shard(shard), position - self.starts[shard])

    def __iter__(self) -> Iterator[Example]:
        for shard in range(len(self.shards)):
            for row in range(self.starts[shard + 1] - self.starts[shard]):
                yield self._example(self._shard(shard), row)

    def _shard(self, shard: int) -> _OpenShard:
        if shard in self._open:
            self._open.move_to_end(shard)
        else:
            self._open[shard] = _OpenShard(self.store, self.shards[shard], self.with_hidden or self.with_teacher)
            while len(self._open) > self.cached_shards:
                self._open.popitem(last=False)  # least recently used; closing it unmaps its tensor file
        return self._open[shard]

    def _example(self, shard: _OpenShard, row: int) -> Example:
        r = shard.table.slice(row, 1).to_pylist()[0]
        hidden = shard.tensor(f"row{row}") if self.with_hidden else None
        if hidden is not None and self.tap_columns is not None:
            taps = len(self.store.meta.tap_layer_ids)
            hidden = hidden.view(hidden.shape[0], -1, hidden.shape[1] // taps)[:, self.tap_columns].flatten(1)
        teacher = None
        if self.with_teacher and f"row{row}.teacher_ids" in shard.keys:
            teacher = TeacherSignal(shard.tensor(f"row{row}.teacher_ids"), shard.tensor(f"row{row}.teacher_logits"),
                                    shard.tensor(f"row{row}.teacher_final"))
        return Example(r["id"], r["category"], r["input_ids"], r["prompt_len"], r["stop_reason"], hidden, teacher)
