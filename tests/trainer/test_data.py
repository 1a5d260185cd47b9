"""Prompt sets and regeneration: validated before compute, the target's own template and sampling,
hidden states captured in the same pass, resumable by shard."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from draftsmith.cli import main as cli
from schemas import recipe
from schemas.sampling import SamplingParams
from schemas.work_files import DataMeta
from trainer.data.prompts import PromptsError, draw_prompts, load_prompts, split_prompts
from trainer.data.regenerate import DataError, generate_batch, regenerate, tokenize_prompts
from trainer.data.store import DataStore
from trainer.targets.chat import render_prompt


def write_prompts(path, n=12, words=6):
    with path.open("w") as handle:
        for i in range(n):
            text = " ".join(f"w{(i * 7 + j * 3) % 200}" for j in range(words + i % 5))
            handle.write(json.dumps({"id": f"p{i}", "category": "c" + str(i % 2), "prompt": text}) + "\n")
    return path


def test_builtin_prompt_set_is_varied_and_split_stably():
    prompts = load_prompts("builtin")
    assert len(prompts) >= 600
    assert {p.category for p in prompts} >= {"chat", "instructions", "code", "math", "reasoning"}
    train, holdout = split_prompts(prompts, 0.1)
    assert 0.05 < len(holdout) / len(prompts) < 0.15
    # The split depends on ids, not on order or on which other prompts exist.
    _, holdout_again = split_prompts(list(reversed(prompts))[:400], 0.1)
    assert {p.id for p in holdout_again} <= {p.id for p in holdout}
    # Validation takes the first prompts of the hold-out: they must span the categories.
    categories = {p.category for p in prompts}
    assert {p.category for p in holdout[:len(categories)]} == categories


@pytest.mark.parametrize(("content", "message"), [
    ("", "is empty"),
    ('{"prompt": "ok"}\n{"prompt": }\n', "line 2: malformed JSON"),
    ('{"prompt": "ok"}\n{"messages": [{"role": "robot", "content": "x"}]}\n', "line 2: messages.0.role"),
    ('{"prompt": "ok"}\n{"text": "x"}\n', "line 2"),
    ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', "duplicate id 'x'"),
])
def test_bad_prompt_files_name_the_line(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(PromptsError, match=message):
        load_prompts(path)


def test_parquet_prompts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["w1 w2", "w3"], "category": ["a", "b"]}), tmp_path / "p.parquet")
    prompts = load_prompts(tmp_path / "p.parquet")
    assert [p.messages[0]["content"] for p in prompts] == ["w1 w2", "w3"]
    pq.write_table(pa.table({"prompt": ["w1", ""]}), tmp_path / "bad.parquet")
    with pytest.raises(PromptsError, match="row 2"):
        load_prompts(tmp_path / "bad.parquet")


def test_greedy_regeneration_equals_transformers_generate(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=6))
    params = SamplingParams(max_new_tokens=12)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    assert prompt_ids[0] == render_prompt(tiny_qwen3.tokenizer, list(prompts[0].messages))
    outputs = generate_batch(tiny_qwen3, prompt_ids, params, tap_layer_ids=[1, 3])
    for ids, (response, hidden, _, _) in zip(prompt_ids, outputs, strict=True):
        torch.manual_seed(0)
        expected = tiny_qwen3.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                             eos_token_id=tiny_qwen3.stop_token_ids(), pad_token_id=3)
        assert response == expected[0, len(ids):].tolist()
        # Hidden states of prompt + response[:-1], captured in the same passes, equal a fresh forward.
        _, taps = tiny_qwen3.forward(torch.tensor([ids + response[:-1]]), tap_layer_ids=[1, 3])
        assert hidden.dtype == torch.bfloat16 and hidden.shape == taps[0].shape
        torch.testing.assert_close(hidden.float(), taps[0].to(torch.bfloat16).float(), rtol=0.02, atol=0.02)


def test_teacher_signal_is_the_targets_own_prediction_of_each_response_token(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=5))
    params = SamplingParams(max_new_tokens=9)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    with_teacher = generate_batch(tiny_qwen3, prompt_ids, params, [1, 3], teacher_top_k=4)
    plain = generate_batch(tiny_qwen3, prompt_ids, params, [1, 3])
    for ids, (response, hidden, _, teacher), (same, same_hidden, _, none) in zip(prompt_ids, with_teacher, plain,
                                                                                  strict=True):
        assert response == same and torch.equal(hidden, same_hidden) and none is None
        # Row j is what the target computed right before emitting response token j (greedy: its argmax).
        logits, final = tiny_qwen3.forward(torch.tensor([ids + response[:-1]]), tap_layer_ids=[5])
        predicting = logits[0, len(ids) - 1:]
        assert teacher.ids.shape == (len(response), 4) and teacher.ids[:, 0].tolist() == response
        torch.testing.assert_close(teacher.logits, predicting.topk(4).values, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(teacher.final_hidden.float(), final[0, len(ids) - 1:], rtol=0.01, atol=0.01)
    # Stored next to the taps, and read back; a tap subset selects columns.
    store = regenerate(tiny_qwen3, prompts, params, tmp_path / "d", tap_layer_ids=[1, 3], teacher_top_k=4)
    examples = store.examples()
    assert [e.teacher.ids.tolist() for e in examples] == [t.ids.tolist() for *_, t in with_teacher]
    only_3 = store.examples(tap_layer_ids=[3])
    assert torch.equal(only_3[0].hidden, examples[0].hidden[:, 64:])


def test_sampled_regeneration_is_reproducible_and_uses_the_sampling_params(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=4))
    ids = tokenize_prompts(tiny_qwen3, prompts, SamplingParams())
    sampled = SamplingParams(temperature=1.0, top_k=2, max_new_tokens=10)
    first = generate_batch(tiny_qwen3, ids, sampled, None, torch.Generator().manual_seed(5))
    second = generate_batch(tiny_qwen3, ids, sampled, None, torch.Generator().manual_seed(5))
    assert [r for r, *_ in first] == [r for r, *_ in second]
    greedy = generate_batch(tiny_qwen3, ids, SamplingParams(max_new_tokens=10), None)
    assert [r for r, *_ in first] != [r for r, *_ in greedy]
    # top_k=2: every sampled token is one of the target's two most likely at its step.
    response = first[0][0]
    logits, _ = tiny_qwen3.forward(torch.tensor([ids[0] + response]))
    for step, token in enumerate(response):
        assert token in logits[0, len(ids[0]) - 1 + step].topk(2).indices.tolist()


def test_regeneration_resumes_by_shard(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=10))
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    whole = regenerate(tiny_qwen3, prompts, params, tmp_path / "whole", tap_layer_ids=[1, 3], shard_size=4,
                       batch_size=3)

    class Crash(Exception):
        pass

    def crash_in_second_shard(done, total, tokens, fraction):
        if done > 4:
            raise Crash

    with pytest.raises(Crash):
        regenerate(tiny_qwen3, prompts, params, tmp_path / "resumed", tap_layer_ids=[1, 3], shard_size=4,
                   batch_size=3, on_progress=crash_in_second_shard)
    partial = DataStore(tmp_path / "resumed", DataMeta.load(tmp_path / "resumed" / DataMeta.FILE))
    assert partial.shard_indices() == [0] and not (tmp_path / "resumed" / "COMPLETE").exists()
    resumed = regenerate(tiny_qwen3, prompts, params, tmp_path / "resumed", tap_layer_ids=[1, 3], shard_size=4,
                         batch_size=3)
    a, b = whole.examples(), resumed.examples()
    assert [e.input_ids for e in a] == [e.input_ids for e in b]
    assert all(torch.equal(x.hidden, y.hidden) for x, y in zip(a, b, strict=True))
    # The shards are ordinary `datasets` input.
    import datasets

    table = datasets.load_dataset("parquet", data_files=str(tmp_path / "whole" / "shard-*.parquet"), split="train")
    assert len(table) == 10 and set(table.column_names) >= {"input_ids", "loss_mask", "prompt_len"}
    row = table[0]
    assert sum(row["loss_mask"]) == len(row["input_ids"]) - row["prompt_len"]


def test_resume_refuses_a_directory_made_differently(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=3))
    regenerate(tiny_qwen3, prompts, SamplingParams(max_new_tokens=4), tmp_path / "d", tap_layer_ids=[1])
    with pytest.raises(Exception, match="different sampling"):
        regenerate(tiny_qwen3, prompts, SamplingParams(max_new_tokens=5), tmp_path / "d", tap_layer_ids=[1])


def test_small_cache_budget_falls_back_to_online(tiny_qwen3, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=3))
    store = regenerate(tiny_qwen3, prompts, SamplingParams(max_new_tokens=4), tmp_path / "d", tap_layer_ids=[1],
                       cache_budget_bytes=1000)
    assert store.meta.hidden_cached is False and "recompute them online" in (store.meta.plan or "")
    assert all(e.hidden is None for e in store.examples())


def test_prompt_longer_than_context_fails_before_compute(tiny_qwen3, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": " ".join(["w1"] * 1100)}) + "\n")
    with pytest.raises(DataError, match="prompt 'long' has .* exceeds the target's context of 1024"):
        regenerate(tiny_qwen3, load_prompts(path), SamplingParams(max_new_tokens=4), tmp_path / "d",
                   tap_layer_ids=[1])
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--temperature", "-1", "temperature"), ("--top-p", "0", "top_p"), ("--top-p", "1.5", "top_p"),
    ("--top-k", "-3", "top_k"), ("--max-new-tokens", "0", "max_new_tokens"),
])
def test_cli_rejects_sampling_out_of_range_before_loading(tmp_path, flag, value, message):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tmp_path / "missing"), "--out",
                                      str(tmp_path / "d"), flag, value])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "d").exists()


def test_cli_reports_empty_prompts_file(tiny_qwen3, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_qwen3.path), "--out", str(tmp_path / "d"),
                                      "--prompts", str(tmp_path / "empty.jsonl")])
    assert result.exit_code == 2 and "is empty" in result.output


def test_a_job_draws_a_per_category_sample_of_the_builtin_set_but_every_prompt_of_its_own_file(tmp_path):
    everything = load_prompts("builtin")
    drawn = draw_prompts("builtin", None, seed=0)
    assert len(drawn) == recipe.BUILTIN_PROMPTS < len(everything)
    assert {p.category for p in drawn} == {p.category for p in everything}  # every category keeps a share
    assert drawn == draw_prompts("builtin", None, seed=0)  # seeded: the same job draws the same prompts
    assert len(draw_prompts("builtin", 40, seed=0)) == 40  # data.count wins
    own = tmp_path / "prompts.jsonl"
    own.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n"
                           for i in range(recipe.BUILTIN_PROMPTS + 5)))
    assert len(draw_prompts(own, None, seed=0)) == recipe.BUILTIN_PROMPTS + 5  # a customer's data is never cut
