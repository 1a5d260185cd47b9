"""The data store streams: its lazy index gives the same examples as the old list, in the same order, and reading
every example of 100k rows peaks at the memory of 10k rows (docs/CAPACITY.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from schemas.work_files import DataMeta
from trainer.data.store import DataStore, Example, TeacherSignal
from trainer.training.data import ExampleOrder

TAPS = [1, 3]
HIDDEN = 8  # per tap
TOKENS = 16  # per row: a 6-token prompt and a 10-token response


def synthetic_store(root: Path, rows: int, shard_size: int, *, teacher: bool = False, seed: int = 0) -> DataStore:
    """`rows` small examples in shards of `shard_size`, written by the store itself (the on-disk format)."""
    meta = DataMeta.written(target_fingerprint="sha256:synthetic", sampling={}, tap_layer_ids=TAPS, hidden_cached=True,
                            shard_size=shard_size, prompt_ids=[f"p{row}" for row in range(rows)])
    store = DataStore.create(root, meta)
    generator = torch.Generator().manual_seed(seed)
    for shard, start in enumerate(range(0, rows, shard_size)):
        count = min(shard_size, rows - start)
        hidden = torch.randn(count, TOKENS - 1, len(TAPS) * HIDDEN, generator=generator).to(torch.bfloat16)
        tokens = torch.randint(0, 1000, (count, TOKENS), generator=generator).tolist()
        examples = []
        for i in range(count):
            signal = TeacherSignal(torch.randint(0, 1000, (10, 2), generator=generator, dtype=torch.int32),
                                   torch.randn(10, 2, generator=generator), hidden[i, :10, :HIDDEN].clone()) \
                if teacher else None
            examples.append(Example(f"r{start + i}", "c", tokens[i], 6, "stop" if i % 3 else "length",
                                    hidden[i].clone(), signal))
        store.write_shard(shard, examples)
    store.finish()
    return DataStore.open(root)


def eager_examples(store: DataStore) -> list[Example]:
    """The store read the way it was before streaming: every shard whole (load_file), into one list."""
    import pyarrow.parquet as pq

    out = []
    for index in store.shard_indices():
        tensors = load_file(store._hidden(index))
        for i, r in enumerate(pq.read_table(store._shard(index)).to_pylist()):
            teacher = TeacherSignal(tensors[f"row{i}.teacher_ids"], tensors[f"row{i}.teacher_logits"],
                                    tensors[f"row{i}.teacher_final"]) if f"row{i}.teacher_ids" in tensors else None
            out.append(Example(r["id"], r["category"], r["input_ids"], r["prompt_len"], r["stop_reason"],
                               tensors[f"row{i}"], teacher))
    return out


def same(a: Example, b: Example) -> bool:
    fields = ("id", "category", "input_ids", "prompt_len", "stop_reason")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or not torch.equal(a.hidden, b.hidden):
        return False
    if (a.teacher is None) != (b.teacher is None):
        return False
    return a.teacher is None or all(torch.equal(getattr(a.teacher, f), getattr(b.teacher, f))
                                    for f in ("ids", "logits", "final_hidden"))


def test_index_gives_the_eager_examples_in_order(tmp_path):
    store = synthetic_store(tmp_path / "data", rows=53, shard_size=10, teacher=True)
    eager = eager_examples(store)
    index = store.index(cached_shards=2)
    assert len(index) == 53 and len(store.examples()) == 53
    assert all(same(a, b) for a, b in zip(index, eager, strict=True))  # sequential
    for i in [52, 0, 31, 7, 50, 11, -1]:  # random access across shards, past the cache
        assert same(index[i], eager[i])
    assert [e.id for e in index[5:25:3]] == [e.id for e in eager[5:25:3]]
    with pytest.raises(IndexError):
        index[53]
    # A tap subset in another order: the same columns the eager read selected.
    second_first = store.index(tap_layer_ids=[3, 1])[12].hidden
    full = eager[12].hidden.view(TOKENS - 1, 2, HIDDEN)
    assert torch.equal(second_first, full[:, [1, 0]].flatten(1))
    assert store.index(with_hidden=False, with_teacher=False)[3].hidden is None
    assert list(store.responses()) == [e.input_ids[e.prompt_len:] for e in eager]


def test_training_order_is_the_same_over_the_index(tmp_path):
    store = synthetic_store(tmp_path / "data", rows=37, shard_size=8)
    eager = eager_examples(store)

    def ids(examples):
        order = ExampleOrder(examples, seed=5, rank=1, world=2, micro_batch=3, accum=2)
        # Steps past one epoch (37 rows, 12 a step) and back: the permutation of each epoch is the seed's alone.
        return [e.id for step in [0, 1, 4, 7, 2] for micro in range(2) for e in order.micro_batch_examples(step, micro)]

    assert ids(store.index(cached_shards=1)) == ids(eager)


def test_summary_counts_from_the_token_columns(tmp_path):
    store = synthetic_store(tmp_path / "data", rows=25, shard_size=10)
    examples = eager_examples(store)
    response_tokens = sum(len(e.input_ids) - e.prompt_len for e in examples)
    assert store.summary() == {"examples": 25, "response_tokens": response_tokens,
                               "stopped": sum(e.stop_reason == "stop" for e in examples), "hidden_cached": True}


READ_ALL = textwrap.dedent("""
    import resource, sys
    import torch
    from trainer.data.store import DataStore
    store = DataStore.open(sys.argv[1])
    examples = store.examples() if sys.argv[2] == "list" else store.index()
    checksum = 0.0
    for example in examples:  # touch every row's tokens and hidden states
        checksum += float(example.hidden[0, 0]) + example.input_ids[-1]
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, len(examples))  # peak RSS, MiB
""")

FLAT_MARGIN_MIB = 20
"""How much more the peak may be at 100k rows than at 10k. Holding every example (the old list) adds ~150 MiB
at 100k of these rows; streaming adds a few MiB of allocator noise."""


def peak_mib(root: Path, mode: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", READ_ALL, str(root), mode], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    peak, rows = done.stdout.split()
    return int(peak), int(rows)


def test_reading_every_example_is_flat_in_memory(tmp_path):
    small = synthetic_store(tmp_path / "10k", rows=10_000, shard_size=1000)
    large = synthetic_store(tmp_path / "100k", rows=100_000, shard_size=1000, seed=1)
    (small_peak, small_rows), (large_peak, large_rows) = peak_mib(small.root, "index"), peak_mib(large.root, "index")
    assert (small_rows, large_rows) == (10_000, 100_000)
    print(json.dumps({"peak_mib_10k": small_peak, "peak_mib_100k": large_peak}))
    assert large_peak - small_peak < FLAT_MARGIN_MIB, (small_peak, large_peak)
