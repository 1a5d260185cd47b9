"""Issue 32: a cancellation reaches regeneration within seconds, not at the end of a batch, and its progress moves
with the tokens generated, not with batches finished. Neither changes a byte of the data: a run stopped mid-batch
and resumed writes exactly what an uninterrupted run writes."""

from __future__ import annotations

import os
import time

import pytest
from regeneration_helpers import install_vllm_driver, write_ragged_prompts

from schemas.sampling import SamplingParams
from trainer.data.regenerate import StopPoll, regenerate
from trainer.errors import StageInterrupted

TAPS = [1, 3]


def data_files(root) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(root.iterdir()) if path.is_file()}


def test_stop_poll_asks_at_most_once_per_interval_unless_forced():
    asked = []
    poll = StopPoll(lambda: asked.append(1) or len(asked) >= 3, seconds=3600)
    assert [poll() for _ in range(100)] == [False] * 100 and len(asked) == 1  # the first call asks, then waits
    assert poll(force=True) is False and len(asked) == 2
    assert poll(force=True) is True and len(asked) == 3
    assert StopPoll(None)(force=True) is False
    counted = []
    fast = StopPoll(lambda: counted.append(1) or False, seconds=0.0)
    for _ in range(5):
        fast()
    assert len(counted) == 5


def test_a_stop_mid_batch_ends_generation_within_a_decode_step_and_the_resume_is_byte_identical(tiny_qwen3,
                                                                                             tmp_path):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 10)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, seed=5)
    # One batch per shard: before issue 32 a stop could only be seen between shards here.
    kwargs = dict(tap_layer_ids=TAPS, shard_size=5, batch_size=5, teacher_top_k=4)
    reference = regenerate(tiny_qwen3, prompts, params, tmp_path / "reference", **kwargs)

    # Poll every step (poll_seconds=0); stop at the 6th decode step of the second shard's only batch.
    polls, progress, saved = [], [], []

    def should_stop() -> bool:
        polls.append(len(saved))
        return sum(n == 3 for n in polls) > 6  # 3 files saved: meta.json and the first shard's two

    with pytest.raises(StageInterrupted, match="mid-batch after 5 of 10 prompts"):
        regenerate(tiny_qwen3, prompts, params, tmp_path / "resumed", should_stop=should_stop,
                   on_progress=lambda *args: progress.append(args), on_saved=saved.append, poll_seconds=0.0, **kwargs)
    assert [path.name for path in saved] == ["meta.json", "shard-00000.hidden.safetensors", "shard-00000.parquet"]
    assert len([n for n in polls if n == 1]) > 10  # asked between decode steps of the first batch, not once
    # Progress moved inside each batch, in tokens against the planned ones, never backwards.
    fractions = [fraction for *_, fraction in progress]
    assert fractions == sorted(fractions) and 0 < fractions[0] < 0.05
    first_batch = [f for (done, *_, f) in progress if done == 0]
    assert len(first_batch) > 10 and first_batch[-1] < 0.5  # the first batch of 5 is half of the 10 prompts
    assert (5, 10) in [(done, total) for done, total, *_ in progress]
    assert [f for (done, total, _, f) in progress if done == 5][0] == pytest.approx(0.5)
    assert all(f < 1.0 for f in fractions)
    kept = data_files(tmp_path / "resumed")
    assert kept["shard-00000.parquet"] == data_files(tmp_path / "reference")["shard-00000.parquet"]

    resumed = regenerate(tiny_qwen3, prompts, params, tmp_path / "resumed", **kwargs)
    assert data_files(tmp_path / "resumed") == data_files(tmp_path / "reference")  # byte for byte
    assert [e.input_ids for e in resumed.examples()] == [e.input_ids for e in reference.examples()]


def test_progress_and_polls_do_not_change_a_greedy_data_set_and_reach_one(tiny_qwen3, tmp_path):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 6)
    params = SamplingParams(max_new_tokens=16)
    kwargs = dict(tap_layer_ids=TAPS, shard_size=4, batch_size=3, teacher_top_k=4)
    regenerate(tiny_qwen3, prompts, params, tmp_path / "quiet", **kwargs)
    progress = []
    regenerate(tiny_qwen3, prompts, params, tmp_path / "watched", should_stop=lambda: False,
               on_progress=lambda *args: progress.append(args), poll_seconds=0.0, **kwargs)
    assert data_files(tmp_path / "watched") == data_files(tmp_path / "quiet")
    fractions = [fraction for *_, fraction in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(set(fractions)) > 10
    done, total, tokens, _ = progress[-1]
    assert (done, total) == (6, 6) and tokens == sum(len(e.input_ids) - e.prompt_len for e in
                                                     regenerate(tiny_qwen3, prompts, params, tmp_path / "quiet",
                                                                **kwargs).examples())


def test_the_poll_inside_a_batch_is_rate_limited(tiny_qwen3, tmp_path):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 4)
    asked = []
    regenerate(tiny_qwen3, prompts, SamplingParams(max_new_tokens=24), tmp_path / "d", tap_layer_ids=TAPS,
               shard_size=4, batch_size=4, should_stop=lambda: asked.append(time.monotonic()) or False,
               poll_seconds=3600)
    assert len(asked) == 1  # 23 decode steps in well under an hour: only the forced poll before the batch


# --- the vLLM backend: a stand-in driver that answers a shard only after a minute, unless told to be quick ---

SLOW_DRIVER = '''
import json, os, sys, time
config = json.loads(sys.argv[1])
with open(config["target"] + "/driver.pid", "w") as handle:
    handle.write(str(os.getpid()))
print(json.dumps({"ready": True, "vllm_version": "fake"}), flush=True)
answered = 0
for line in sys.stdin:
    request = json.loads(line)
    if answered and os.path.exists(config["target"] + "/slow"):
        time.sleep(120)  # LLM.generate on a long shard: nothing interrupts it from outside
    answered += 1
    tokens = [[(len(p) * 7 + i) % 50 + 3 for i in range(len(p) % 4 + 1)] for p in request["prompts"]]
    print(json.dumps({"tokens": tokens, "finish": ["length"] * len(tokens), "seconds": 0.1}), flush=True)
'''


@pytest.fixture
def slow_vllm(tiny_qwen3, tmp_path, monkeypatch):
    return install_vllm_driver(tiny_qwen3, tmp_path, monkeypatch, SLOW_DRIVER, "slow_driver.py")


def test_a_stop_while_vllm_answers_kills_its_driver_within_seconds_and_keeps_written_shards(slow_vllm, tmp_path):
    from trainer.data.vllm_backend import VllmResponses

    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 7)
    params = SamplingParams(max_new_tokens=8)
    kwargs = dict(tap_layer_ids=TAPS, shard_size=4, batch_size=4, teacher_top_k=4)
    with VllmResponses(slow_vllm) as backend:
        regenerate(slow_vllm, prompts, params, tmp_path / "reference", backend=backend, **kwargs)

    (slow_vllm.path / "slow").touch()
    saved, stop_at = [], []

    def should_stop() -> bool:  # asked at once when the first shard is written (a cancel that was waiting)
        if any(path.name == "shard-00000.parquet" for path in saved):
            stop_at.append(time.monotonic())
            return len(stop_at) > 3  # the cancel lands while vLLM works on the second shard
        return False

    started = time.monotonic()
    with pytest.raises(StageInterrupted, match="while vLLM answered"):
        with VllmResponses(slow_vllm) as backend:
            regenerate(slow_vllm, prompts, params, tmp_path / "resumed", backend=backend, should_stop=should_stop,
                       on_saved=saved.append, poll_seconds=0.0, **kwargs)
    assert time.monotonic() - started < 10 and time.monotonic() - stop_at[-1] < 2  # not after the driver's minute
    pid = int((slow_vllm.path / "driver.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert backend.log_path is not None and not backend.log_path.exists()  # a cancel leaves no log behind
    assert [p.name for p in saved] == ["meta.json", "shard-00000.hidden.safetensors", "shard-00000.parquet"]

    (slow_vllm.path / "slow").unlink()
    with VllmResponses(slow_vllm) as backend:
        regenerate(slow_vllm, prompts, params, tmp_path / "resumed", backend=backend, **kwargs)
    assert data_files(tmp_path / "resumed") == data_files(tmp_path / "reference")
