"""bench/peers/speculators_peer.py's pure parts, without speculators installed: our regenerated data in its offline
format (stored taps + the target's re-run final pre-norm state, one file per sample, a `datasets` folder), the
flags a row turns into (aligned settings, schedule, D-PACE), and the checks around its export's config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_data import write_prompts
from tiny_targets import make_tiny_target

from bench.peers import speculators_peer
from bench.peers.peer_run import OUR_SCHEDULE, PeerFailed, PeerRow
from schemas.sampling import SamplingParams
from trainer.data.prompts import load_prompts
from trainer.data.regenerate import regenerate
from trainer.drafter.config import DrafterConfig
from trainer.targets import load_target

TAPS = [1, 2, 4]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculators")
    target = load_target(make_tiny_target(root / "target", "llama"))
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=3))
    store = regenerate(target, prompts, SamplingParams(max_new_tokens=8), root / "data", tap_layer_ids=TAPS)
    summary = speculators_peer.convert_data(store, target, root / "spec", [4, 1])
    return target, store, root / "spec", summary


def test_each_example_is_one_sample_with_stored_taps_and_the_rerun_pre_norm_state(converted):
    target, store, out, summary = converted
    from datasets import load_from_disk
    from safetensors.torch import load_file

    examples = [e for e in store.examples(tap_layer_ids=[4, 1]) if len(e.input_ids) - e.prompt_len >= 2]
    data = load_from_disk(str(out / "dataset"))
    assert summary["samples"] == len(data) == len(examples) > 0
    assert summary["taps"] == [4, 1]
    norm = target.model.get_decoder().norm
    for i, example in enumerate(examples):
        row = data[i]
        assert row["input_ids"].tolist() == example.input_ids and row["input_ids"].dtype == torch.long
        assert row["loss_mask"].tolist() == example.loss_mask and int(row["seq_len"]) == len(example.input_ids)
        sample = load_file(out / "hidden_states" / f"hs_{i}.safetensors")
        assert torch.equal(sample["token_ids"], row["input_ids"])
        length, hidden = len(example.input_ids), target.hidden_size
        states = sample["hidden_states"]
        assert states.shape == (length, 3, hidden) and states.dtype == torch.bfloat16
        # Our stored taps, in the asked order, for every token but the last; the last from the re-run.
        stored = example.hidden.view(length - 1, 2, hidden)
        assert torch.equal(states[:-1, :2], stored.to(torch.bfloat16))
        # The last slice is the state the target's final norm reads: norm(it) -> LM head gives its logits.
        ids = torch.tensor([example.input_ids])
        logits = target.model(input_ids=ids).logits[0]
        recomputed = target.model.lm_head(norm(states[:, 2].float()))
        assert (recomputed.argmax(-1) == logits.argmax(-1)).float().mean() > 0.9
    assert summary["target_argmax_equals_next_token"] > 0.9  # greedy regenerated data: the target's own tokens
    assert summary["tap_rerun_max_rel_diff"] < 0.05


def test_a_finished_conversion_is_reused(converted):
    target, store, out, summary = converted
    marker = out / "CONVERTED.json"
    before = marker.stat().st_mtime_ns
    again = speculators_peer.convert_data(store, target, out, [4, 1])
    assert again == summary and marker.stat().st_mtime_ns == before


def _config(variant="dflash"):
    return DrafterConfig(variant=variant, hidden_size=576, intermediate_size=1536, num_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                         rope_theta=100000.0, max_position_embeddings=8192, vocab_size=49152, num_target_layers=30,
                         target_layer_ids=(1, 14, 27), block_size=8, mask_token_id=16)


def _row(tmp_path, variant="dflash", schedule="authors", options=None, dtype="authors", steps=120):
    return PeerRow(name="r", variant=variant, schedule=schedule, steps=steps, target_dir=tmp_path / "t",
                   data_dir=tmp_path / "d", work=tmp_path, row_dir=tmp_path / "row", log=tmp_path / "log",
                   taps=(1, 14, 27), layers=2, block_size=8, batch_size=16, anchors=12, mask_token_id=16, threads=1,
                   options=options or {}, dtype=dtype)


def _flags(argv):
    out, key = {}, None
    for item in argv:
        if item.startswith("--"):
            key = item[2:]
            out[key] = []
        else:
            out[key].append(item)
    return {k: (v[0] if len(v) == 1 else v) for k, v in out.items()}


def _arguments(tmp_path, **kw):
    variant = kw.get("variant", "dflash")
    return speculators_peer.train_arguments(
        _row(tmp_path, **kw), drafter_config=_config(variant if variant == "dflash2" else "dflash"), data_dir=tmp_path / "data",
        draft_config_path=tmp_path / "draft.json", save_path=tmp_path / "row" / "checkpoints", samples=226,
        total_seq_len=3200)


def test_aligned_flags_shift_the_taps_to_its_layer_ids_and_size_a_step(tmp_path):
    argv, settings, env = _arguments(tmp_path)
    flags = _flags(argv)
    assert flags["target-layer-ids"] == ["2", "15", "28"]  # its id i reads HF hidden_states[i]
    assert flags["mask-token-id"] == "16" and flags["block-size"] == "8" and flags["max-steps"] == "120"
    assert flags["max-anchors"] == str(16 * 12) and flags["total-seq-len"] == "3200"
    assert flags["draft-attn-impl"] == "sdpa" and flags["loss-implementation"] == "eager"
    assert "no-sample-from-anchor" in flags and flags["num-workers"] == "0"
    assert "num-layers" not in flags and flags["draft-config"] == str(tmp_path / "draft.json")
    assert int(226 * float(flags["train-data-ratio"])) == 225  # one sample for its required validation split
    assert "threads" not in flags and env == {}
    # authors: its example recipe's lr over its trainer's defaults; D-PACE with CE, its DFlash default
    assert flags["lr"] == "0.0003" and flags["optimizer"] == "muon" and flags["scheduler-type"] == "linear"
    assert flags["per-position-loss-weight"] == "dpace" and flags["loss-fn"] == "ce"
    assert settings["max_anchors"] == 192 and settings["target_layer_ids"] == [2, 15, 28]


def test_dpace_switch_and_dflash2_defaults(tmp_path):
    plain = _flags(_arguments(tmp_path, options={"dpace": False})[0])
    assert plain["per-position-loss-weight"] == "fixed-exp-decay" and plain["loss-fn"] == "ce"
    assert plain["dflash-decay-gamma"] == "4.0"
    d2 = _flags(_arguments(tmp_path, variant="dflash2")[0])
    assert d2["speculator-type"] == "dflash2" and d2["per-position-loss-weight"] == "fixed-exp-decay"
    assert d2["loss-fn"] == "kl_div" and d2["conv-group-size"] == "16" and d2["selector-top-k"] == "16"
    d2_dpace = _flags(_arguments(tmp_path, variant="dflash2", options={"dpace": True})[0])
    assert d2_dpace["per-position-loss-weight"] == "dpace" and d2_dpace["loss-fn"] == "ce"  # D-PACE needs CE
    with pytest.raises(PeerFailed):
        _arguments(tmp_path, variant="eagle3")


def test_ours_schedule_uses_our_recipe_and_the_launcher_overrides(tmp_path):
    argv, settings, env = _arguments(tmp_path, schedule="ours", options={"dpace": False})
    flags = _flags(argv)
    assert float(flags["lr"]) == OUR_SCHEDULE["learning_rate"] and flags["optimizer"] == "adamw"
    assert flags["scheduler-type"] == "cosine" and int(flags["scheduler-warmup-steps"]) == OUR_SCHEDULE["warmup_steps"]
    assert float(flags["weight-decay"]) == OUR_SCHEDULE["weight_decay"]
    assert float(flags["dflash-decay-gamma"]) == OUR_SCHEDULE["loss_decay_gamma"]
    assert env == {"SPECULATORS_ADAMW_BETAS": "0.9,0.95", "SPECULATORS_COSINE_MIN_LR_RATIO": "0.1"}
    assert not any(" (" in k for k in flags)


@pytest.mark.parametrize("schedule", ["authors", "ours"])
def test_the_schedules_horizon_is_the_steps_trained(tmp_path, schedule):
    flags = _flags(_arguments(tmp_path, schedule=schedule, steps=60)[0])
    assert flags["scheduler-total-steps"] == flags["max-steps"] == "60"


def test_batch_tokens_packs_batch_sequences_on_average():
    assert speculators_peer.batch_tokens(200.4, 300, 16) == 3207
    assert speculators_peer.batch_tokens(10.0, 500, 16) == 500  # never truncates a sequence


def test_export_writes_a_reference_config_beside_its_weights_as_written(tmp_path):
    config = _config("dflash2")
    save = tmp_path / "checkpoints"
    for epoch in (0, 1):
        (save / str(epoch)).mkdir(parents=True)
        (save / str(epoch) / "model.safetensors").write_bytes(f"weights {epoch}".encode())
        peer = {"architectures": ["DFlash2DraftModel"], "speculators_model_type": "dflash2", "block_size": 8,
                "mask_token_id": 16, "aux_hidden_state_layer_ids": [2, 15, 28], "conv_kernel_size": 2,
                "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16,
                "transformer_layer_config": {"num_hidden_layers": 2, "hidden_size": 576, "intermediate_size": 1536,
                                             "num_attention_heads": 9, "num_key_value_heads": 3}}
        (save / str(epoch) / "config.json").write_text(json.dumps(peer))
    os.symlink("1", save / "epoch1_end")
    record = speculators_peer.export(save, tmp_path / "drafter", config)
    assert (tmp_path / "drafter" / "model.safetensors").read_bytes() == b"weights 1"
    written = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert DrafterConfig.from_hf_dict(written) == config.replace(target_fingerprint=None)
    assert record["checkpoint"] == str(save / "1")
    peer["aux_hidden_state_layer_ids"] = [1, 14, 27]  # taps read one layer early: refused
    (save / "1" / "config.json").write_text(json.dumps(peer))
    with pytest.raises(PeerFailed, match="target_layer_ids"):
        speculators_peer.export(save, tmp_path / "drafter2", config)


def test_draft_layer_config_is_our_shape_with_full_attention():
    layer = speculators_peer.draft_layer_config(_config(), 0.02)
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == 2
    assert layer["layer_types"] == ["full_attention"] * 2 and layer["use_sliding_window"] is False
    assert (layer["hidden_size"], layer["intermediate_size"], layer["head_dim"]) == (576, 1536, 64)


def test_missing_venv_says_how_to_install(tmp_path):
    with pytest.raises(PeerFailed, match="bench/setup/speculators.sh"):
        speculators_peer.train(_row(tmp_path), tmp_path / "no-venv")


def test_launcher_is_plain_python_for_the_peer_venv():
    source = Path(speculators_peer.LAUNCHER).read_text()
    compile(source, str(speculators_peer.LAUNCHER), "exec")
    assert "from bench" not in source and "import trainer" not in source  # runs without the project


def test_a_float32_row_trains_its_draft_in_float32(tmp_path):
    """Its draft weights and autocast take --hidden-states-dtype: bfloat16 as published, float32 on a CPU without
    bfloat16 units (bench/peers/peer_run.py PEER_DTYPES)."""
    assert _flags(_arguments(tmp_path)[0])["hidden-states-dtype"] == "bfloat16"
    argv, settings, env = _arguments(tmp_path, dtype="float32")
    assert _flags(argv)["hidden-states-dtype"] == "float32"
    # and its Muon orthogonalises in float32 too (the launcher's override; torch's runs in bfloat16)
    assert env == {"SPECULATORS_FLOAT32_MUON": "1"} and settings["muon_newton_schulz (launcher)"] == "float32"
