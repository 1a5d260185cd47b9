"""bench/peers/compare.py's SpecForge side: our regenerated data in SpecForge's offline format, row for row, and a draft
config that keeps our taps and mask (SpecForge re-derives taps when only a layer count is given). With SpecForge
installed (`bash bench/setup/specforge.sh`), its own loader reads the files and its own model class builds the
drafter from the config; CI does not install it, so those checks are skipped there."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_data import write_prompts
from tiny_targets import make_tiny_target

from bench.peers import specforge_peer
from schemas.sampling import SamplingParams
from trainer.data.prompts import load_prompts
from trainer.data.regenerate import regenerate
from trainer.drafter.config import DrafterConfig
from trainer.targets import load_target

SPECFORGE_PYTHON = specforge_peer.DEFAULT_VENV / "bin" / "python"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    target = load_target(make_tiny_target(root / "target", "qwen3"))
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=6))
    store = regenerate(target, prompts, SamplingParams(max_new_tokens=12), root / "data", tap_layer_ids=[1, 2, 4])
    summary = specforge_peer.convert_data(store, root / "specforge", [4, 1])
    return target, store, root / "specforge", summary


def test_every_example_becomes_one_specforge_sample_with_our_taps(converted):
    _, store, out, summary = converted
    examples = store.examples(tap_layer_ids=[4, 1])
    files = sorted(out.glob("sample-*.ckpt"))
    kept = [e for e in examples if len(e.input_ids) - e.prompt_len >= 2]
    assert len(files) == summary["samples"] == len(kept) and summary["skipped"] == len(examples) - len(kept)
    for path, example in zip(files, kept, strict=True):
        sample = torch.load(path, weights_only=True)
        length = len(example.input_ids)
        assert sample["input_ids"].tolist() == example.input_ids
        assert sample["loss_mask"].tolist() == [0] * example.prompt_len + [1] * (length - example.prompt_len)
        # Row t is the taps of token t, in the order asked for; the never-tapped last token's row is zero.
        assert sample["hidden_states"].shape == (length, example.hidden.shape[1])
        assert torch.equal(sample["hidden_states"][:length - 1], example.hidden)
        assert not sample["hidden_states"][length - 1].any()
    # A second call reuses the conversion instead of writing it again.
    mtime = files[0].stat().st_mtime_ns
    assert specforge_peer.convert_data(store, out, [4, 1]) == summary and files[0].stat().st_mtime_ns == mtime


def test_a_float32_run_gets_float32_taps_not_the_bfloat16_conversion(converted, tmp_path):
    """SpecForge feeds stored taps to its `fc` as they are: a float32 draft (bench/peers/peer_run.py PEER_DTYPES) needs
    float32 samples, and a conversion in another dtype is never reused for it."""
    _, store, out, summary = converted
    copy = tmp_path / "specforge"
    shutil.copytree(out, copy)
    assert specforge_peer.convert_data(store, copy, [4, 1], "float32")["dtype"] == "float32"
    example = next(e for e in store.examples(tap_layer_ids=[4, 1]) if len(e.input_ids) - e.prompt_len >= 2)
    sample = torch.load(sorted(copy.glob("sample-*.ckpt"))[0], weights_only=True)
    assert sample["hidden_states"].dtype == torch.float32
    assert torch.equal(sample["hidden_states"][:len(example.input_ids) - 1], example.hidden.float())


def test_draft_config_is_our_drafter_shape_taps_and_mask(converted):
    target = converted[0]
    ours = DrafterConfig.for_target(target, variant="dflash", num_layers=2, block_size=4, mask_token_id=5,
                                    target_layer_ids=[1, 2, 4])
    config = specforge_peer.draft_config(ours)
    assert config["architectures"] == ["DFlashDraftModel"] and config["num_hidden_layers"] == 2
    assert config["dflash_config"] == {"block_size": 4, "mask_token_id": 5, "target_layer_ids": [1, 2, 4]}
    assert config["layer_types"] == ["full_attention"] * 2 and "draftsmith" not in config
    with pytest.raises(ValueError, match="DFlash only"):
        specforge_peer.draft_config(ours.replace(variant="dflash2"))


@pytest.mark.skipif(not SPECFORGE_PYTHON.is_file(), reason="SpecForge is not installed (bash bench/setup/specforge.sh)")
def test_specforge_reads_the_samples_and_builds_the_drafter_as_configured(converted, tmp_path):
    target, _, out, _ = converted
    ours = DrafterConfig.for_target(target, variant="dflash", num_layers=2, block_size=4, mask_token_id=5,
                                    target_layer_ids=[4, 1])
    (tmp_path / "draft.json").write_text(json.dumps(specforge_peer.draft_config(ours)))
    script = f"""
import glob, json, torch
from transformers import Qwen3Config
from specforge.algorithms.common.dflash_family_data import normalize_offline_sample
from specforge.modeling.draft.dflash import DFlashDraftModel
from specforge.runtime.data_plane.feature_store import load_feature_file
shapes = [list(normalize_offline_sample(load_feature_file(p), max_len=2048)["hidden_states"].shape)
          for p in sorted(glob.glob("{out}/sample-*.ckpt"))]
config = Qwen3Config.from_dict(json.load(open("{tmp_path / 'draft.json'}")))
config._attn_implementation = "sdpa"
model = DFlashDraftModel(config)
print(json.dumps({{"shapes": shapes, "taps": list(model.target_layer_ids), "mask": model.mask_token_id,
                  "block": model.block_size, "fc_in": model.fc.in_features}}))
"""
    done = subprocess.run([str(SPECFORGE_PYTHON), "-c", script], capture_output=True, text=True, timeout=300,
                          env=specforge_peer.environment(1))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["shapes"]) == len(list(out.glob("sample-*.ckpt")))
    assert all(shape[0] == 1 and shape[2] == 2 * ours.hidden_size for shape in result["shapes"])
    assert result["taps"] == [4, 1] and result["mask"] == 5 and result["block"] == 4
    assert result["fc_in"] == 2 * ours.hidden_size


def test_equal_cpu_rows_take_the_steps_their_sizing_row_says_fit_the_budget():
    import argparse

    from bench.peers import compare

    results = {"dflash2-steps": {"steps": 120, "train_cpu_s": 278.0},
               "specforge-steps": {"steps": 120, "train_cpu_s": 427.0},  # measured beside other work
               "specforge-cpu": {"steps": 78, "train_cpu_s": 230.0}}  # measured alone: 2.95 s a step
    args = argparse.Namespace(steps=120, size_from="", work=Path("/nowhere"))
    assert compare.steps_for("dflash2-steps", args, results) == 120
    assert compare.steps_for("specforge-cpu", args, results) == 78  # 120 * 278 / 427
    args.size_from = "specforge-cpu"
    assert compare.sizing_row("specforge-cpu", args) == "specforge-cpu"
    assert compare.steps_for("specforge-cpu", args, results) == 94  # 78 * 278 / 230
    with pytest.raises(SystemExit, match="dflash-steps"):
        compare.steps_for("dflash-cpu", argparse.Namespace(steps=120, size_from="", work=Path("/w")), results)
