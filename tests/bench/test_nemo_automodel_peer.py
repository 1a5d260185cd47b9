"""bench/peers/nemo_automodel_peer.py's pure parts, without NeMo Automodel installed: our regenerated data as NeMo chat
rows, kept only where NeMo's tokenization equals ours (a stand-in plays NeMo's tokenizer here: the chat template
rendering, the generation prompt unsupervised), the config a row turns into (aligned settings, both schedules),
the log parser and the export's config.json fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data import write_prompts

from bench.peers import nemo_automodel_peer as peer
from bench.peers.peer_run import OUR_SCHEDULE, PeerFailed, PeerRow
from schemas.work_files import DataMeta
from trainer.data.prompts import load_prompts


def fake_nemo_tokenize(spoil: set[int]):
    """NeMo's ChatDataset as it behaves on a ChatML template: the whole conversation rendered, the prompt and the
    assistant header unsupervised; rows in `spoil` come back with one response token changed."""

    def tokenize(venv, target_dir, rows, out, threads=1):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        result = []
        for i, line in enumerate(rows.read_text().splitlines()):
            messages = json.loads(line)["messages"]
            prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if i in spoil:
                ids[start] = (ids[start] + 1) % tokenizer.vocab_size
            result.append({"input_ids": ids, "loss_mask": [0] * start + [1] * (len(ids) - start)})
        return result

    return tokenize


class FakeStore:
    """What convert_data reads of a DataStore: its root, meta and examples (prompt render + a response)."""

    def __init__(self, root: Path, examples: list):
        self.root, self._examples = root, examples
        self.meta = DataMeta(target_fingerprint="sha256:tiny", prompt_ids=[e.id for e in examples], sampling={},
                             tap_layer_ids=[1], hidden_cached=False, shard_size=len(examples))

    def examples(self, **_):
        return list(self._examples)


@pytest.fixture(scope="module")
def store_and_prompts(tmp_path_factory):
    from tiny_targets import make_tokenizer

    from trainer.data.store import Example
    from trainer.targets.chat import render_prompt

    root = tmp_path_factory.mktemp("nemo")
    tokenizer = make_tokenizer(64)
    tokenizer.save_pretrained(root / "target")
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=5))
    examples = []
    for i, prompt in enumerate(prompts):
        ids = render_prompt(tokenizer, list(prompt.messages))
        response = tokenizer(" ".join(f"w{(i + j) % 40}" for j in range(6)), add_special_tokens=False)["input_ids"]
        ended = i % 2 == 0  # a response that ended itself (eos) or one cut at the length limit
        examples.append(Example(prompt.id, prompt.category, ids + response + [tokenizer.eos_token_id] * ended,
                                len(ids), "stop" if ended else "length"))
    return root / "target", FakeStore(root / "data", examples), prompts


def test_only_examples_that_retokenize_identically_are_kept(store_and_prompts, tmp_path, monkeypatch):
    target_dir, store, prompts = store_and_prompts
    monkeypatch.setattr(peer, "nemo_tokenize", fake_nemo_tokenize(spoil={1}))
    summary = peer.convert_data(store, tmp_path / "d", target_dir, tmp_path / "no-venv", prompts=prompts)
    examples = list(store.examples(with_hidden=False, with_teacher=False))
    assert summary["candidates"] == len(examples) == 5
    assert summary["dropped"] == {"tokens differ": 1}
    assert summary["samples"] == 4 and summary["kept_ids"] == [e.id for i, e in enumerate(examples) if i != 1]
    rows = [json.loads(line) for line in (tmp_path / "d" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    # A reused conversion: same data, same target -> the marker's summary, no second tokenization.
    monkeypatch.setattr(peer, "nemo_tokenize", None)
    assert peer.convert_data(store, tmp_path / "d", target_dir, tmp_path / "no-venv", prompts=prompts) == summary


def test_compare_wants_our_tokens_then_only_the_template_tail_and_our_supervision():
    ours = [5, 6, 7, 8, 9]
    assert peer.compare(ours, 2, ours + [2, 10], [0, 0, 1, 1, 1, 1, 1]) is None
    assert peer.compare(ours, 2, [5, 6, 7, 8, 4, 2], [0, 0, 1, 1, 1, 1]) == "tokens differ"
    assert peer.compare(ours, 2, [5, 4, 7, 8, 9, 2], [0, 0, 1, 1, 1, 1]) == "prompt tokens differ"
    # An earlier assistant turn supervised (multi-turn prompt) or the header supervised: not our supervision.
    assert peer.compare(ours, 2, ours + [2], [0, 1, 1, 1, 1, 1]) == "supervised tokens differ"


def row(tmp_path: Path, variant="dflash2", schedule="authors", steps=20, **options) -> PeerRow:
    return PeerRow(name="n", variant=variant, schedule=schedule, steps=steps, target_dir=tmp_path / "t",
                   data_dir=tmp_path / "data", work=tmp_path, row_dir=tmp_path / "r", log=tmp_path / "l",
                   taps=(1, 14, 27), layers=2, block_size=8, batch_size=16, anchors=12, mask_token_id=16,
                   threads=1, options=options)


def test_config_carries_the_aligned_settings_and_the_authors_recipe(tmp_path):
    config, warmup = peer.run_config(row(tmp_path), tmp_path / "train.jsonl", 207, 235, tmp_path / "run")
    args = config["recipe_args"]
    assert config["recipe"] == "TrainDFlash2Recipe" and warmup is None
    assert (args["target_layer_ids"], args["mask_token_id"], args["block_size"], args["draft_num_hidden_layers"],
            args["micro_batch_size"], args["num_anchors"]) == ([1, 14, 27], 16, 8, 2, 16, 12)
    assert args["grad_accumulation_steps"] == 1 and args["seq_length"] == 235
    assert args["num_epochs"] == 2  # 13 batches an epoch; the launcher stops at 20 steps
    assert args["attention_backend"] == "sdpa" and args["mask_generation_prompt"] is True
    assert args["loss_decay_gamma"] == 7.0 and args["selector_loss_weight"] == 1.0
    assert config["optimizer"] == {"lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup_ratio": 0.04,
                                   "min_lr_ratio": 0.1}
    command = peer.train_command(Path("py"), tmp_path / "run.yaml", "dflash2", 20, warmup)
    assert command[-4:] == ["--variant", "dflash2", "--max-steps", "20"]


def test_our_schedule_fixes_the_warmup_in_steps(tmp_path):
    config, warmup = peer.run_config(row(tmp_path, "dflash", "ours", steps=120), tmp_path / "t.jsonl", 207, 235,
                                     tmp_path / "run")
    assert config["recipe"] == "TrainDFlashRecipe" and "selector_rank" not in config["recipe_args"]
    assert warmup == OUR_SCHEDULE["warmup_steps"] == 30
    assert config["optimizer"]["lr"] == OUR_SCHEDULE["learning_rate"]
    assert config["optimizer"]["betas"] == list(OUR_SCHEDULE["adam_betas"])
    assert config["optimizer"]["weight_decay"] == OUR_SCHEDULE["weight_decay"]
    assert config["recipe_args"]["loss_decay_gamma"] == OUR_SCHEDULE["loss_decay_gamma"]
    assert peer.train_command(Path("py"), tmp_path / "r.yaml", "dflash", 120, warmup)[-2:] == ["--warmup-steps", "30"]
    with pytest.raises(PeerFailed):
        peer.run_config(row(tmp_path, "eagle3"), tmp_path / "t.jsonl", 207, 235, tmp_path / "run")


def test_losses_read_nemo_log_lines():
    text = ("Training: 5/15 [..., loss=14.6330]\n"
            "2026-12-06 | INFO | train_dflash | epoch=0 step=1 loss=14.6330 acc=0.0389 lr=5.41e-04\n"
            "2026-12-06 | INFO | train_dflash | epoch=1 step=2 loss=13.4006 acc=0.0244 lr=0.000498\n")
    assert peer.losses(text) == [(1, 14.633), (2, 13.4006)]


def test_export_links_the_weights_and_fixes_only_the_architecture(tmp_path):
    source = tmp_path / "ck" / "epoch_1_step_5" / "model" / "consolidated"
    source.mkdir(parents=True)
    (source / "model-00001-of-00001.safetensors").write_bytes(b"weights")
    (source / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "model-00001-of-00001.safetensors"}}))
    nemo = {"architectures": ["Qwen3DFlashDraftModel"], "hidden_size": 8, "dflash_config": {"block_size": 8}}
    (source / "config.json").write_text(json.dumps(nemo))
    record = peer.export(tmp_path / "ck", 5, "dflash2", tmp_path / "export")
    out = tmp_path / "export"
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((out / "config.json").read_text()) == nemo | {"architectures": ["DFlash2DraftModel"]}
    assert json.loads((out / "config.nemo.json").read_text()) == nemo
    assert record["config_fixed"]["architectures"] == [["Qwen3DFlashDraftModel"], ["DFlash2DraftModel"]]
    with pytest.raises(PeerFailed):
        peer.export(tmp_path / "ck", 6, "dflash2", tmp_path / "export")


def test_no_venv_and_dpace_are_refused(tmp_path):
    with pytest.raises(PeerFailed, match="setup/nemo_automodel.sh"):
        peer.train(row(tmp_path), tmp_path / "no-venv")
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text("")
    with pytest.raises(PeerFailed, match="D-PACE"):
        peer.train(row(tmp_path, dpace=True), tmp_path / "venv")
