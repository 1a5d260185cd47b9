"""bench/peers/modelopt_peer.py's pure parts, without ModelOpt installed: our data in ModelOpt's offline format (taps as
`aux_hidden_states`, the target's final hidden state at the position that predicts each response token), the
recipe settings of a row (aligned keys, each schedule, refusals) as the launcher passes them, and the exported
config's correction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bench.peers import modelopt_peer
from bench.peers.peer_run import OUR_SCHEDULE, PeerFailed, PeerRow
from schemas.work_files import DataMeta
from trainer.data.store import Example, TeacherSignal

H, TAPS = 4, [1, 3]


class FakeStore:
    """What convert_data reads of a DataStore: root, meta and examples(...)."""

    def __init__(self, root: Path, examples: list[Example]):
        self.root, self._examples = root, examples
        self.meta = DataMeta.written(target_fingerprint="sha256:fake", sampling={}, tap_layer_ids=TAPS,
                                     hidden_cached=True, shard_size=len(examples), prompt_ids=[e.id for e in examples])
        self.reads = 0

    def examples(self, with_hidden=True, tap_layer_ids=None, with_teacher=True):
        assert with_hidden and with_teacher and tap_layer_ids == TAPS
        self.reads += 1
        return self._examples


def example(idx: int, prompt_len: int, response: int) -> Example:
    length = prompt_len + response
    hidden = torch.arange((length - 1) * len(TAPS) * H, dtype=torch.float32).view(length - 1, -1) + idx
    final = -torch.arange(response * H, dtype=torch.float32).view(response, H) - 1
    teacher = TeacherSignal(torch.zeros(response, 2, dtype=torch.int32), torch.zeros(response, 2), final.bfloat16())
    return Example(f"p{idx}", "chat", list(range(10, 10 + length)), prompt_len, "eos", hidden.bfloat16(), teacher)


def row(tmp_path: Path, **changes) -> PeerRow:
    values = dict(name="modelopt-dflash-dpace-authors", variant="dflash", schedule="authors", steps=7,
                  target_dir=tmp_path / "target", data_dir=tmp_path / "data", work=tmp_path, row_dir=tmp_path / "row",
                  log=tmp_path / "row.log", taps=(1, 14, 27), layers=3, block_size=8, batch_size=16, anchors=12,
                  mask_token_id=16, threads=1, options={"dpace": True})
    return PeerRow(**(values | changes))


SHAPE = {"num_hidden_layers": 3, "target_layer_ids": [1, 14, 27], "intermediate_size": 1536, "num_attention_heads": 9,
         "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
         "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}, "num_target_layers": 30}


def test_each_example_becomes_one_offline_sample_with_taps_and_the_final_hidden_where_it_predicts(tmp_path):
    store = FakeStore(tmp_path / "data", [example(0, 3, 4), example(1, 5, 1), example(2, 2, 6)])
    summary = modelopt_peer.convert_data(store, tmp_path / "out", TAPS)
    assert (summary["samples"], summary["skipped"], summary["with_final_hidden"]) == (2, 1, 2)
    assert (summary["response_tokens"], summary["max_length"]) == (10, 8)
    sample = torch.load(tmp_path / "out" / "sample-000000.pt", weights_only=True)
    source = store._examples[0]
    assert sample["input_ids"].tolist() == source.input_ids and sample["loss_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert sample["aux_hidden_states"].shape == (7, len(TAPS) * H)
    assert torch.equal(sample["aux_hidden_states"][:6], source.hidden) and not sample["aux_hidden_states"][6].any()
    # Position p's final hidden is what the target read to predict token p + 1: response token j at prompt_len + j.
    final = sample["hidden_states"]
    assert final.shape == (7, H) and torch.equal(final[2:6], source.teacher.final_hidden)
    assert not final[:2].any() and not final[6].any()


def test_a_conversion_is_reused_for_the_same_data_and_taps_only(tmp_path):
    store = FakeStore(tmp_path / "data", [example(0, 3, 4)])
    modelopt_peer.convert_data(store, tmp_path / "out", TAPS)
    modelopt_peer.convert_data(store, tmp_path / "out", TAPS)
    assert store.reads == 1
    store.meta.target_fingerprint = "sha256:other"
    modelopt_peer.convert_data(store, tmp_path / "out", TAPS)
    assert store.reads == 2 and len(list((tmp_path / "out").glob("sample-*.pt"))) == 1


def test_the_authors_row_keeps_the_packaged_recipe_and_sets_only_what_is_aligned(tmp_path):
    settings = modelopt_peer.settings_for(row(tmp_path), shape=SHAPE, data_dir=tmp_path / "md", max_length=233,
                                          final_hidden=True)
    assert settings["training.max_steps"] == 7 and settings["training.per_device_train_batch_size"] == 16
    assert settings["training.training_seq_len"] == 240  # the longest sequence, up to a whole block
    assert (settings["dflash.dflash_block_size"], settings["dflash.dflash_num_anchors"],
            settings["dflash.dflash_mask_token_id"]) == (8, 12, 16)
    assert settings["dflash.dflash_architecture_config.target_layer_ids"] == [1, 14, 27]
    assert settings["dflash.dflash_architecture_config.num_attention_heads"] == 9  # not Qwen3Config's 32
    assert "dflash.dflash_architecture_config.num_target_layers" not in settings
    assert settings["dflash.dflash_loss_objective"] == "dpace"
    assert "dflash.dflash_self_logit_distillation" not in settings  # its default (on): the data has the teacher
    assert not any(k in settings for k in ("training.learning_rate", "training.warmup_steps",
                                           "training.lr_scheduler_type", "training.weight_decay"))


def test_the_ours_row_takes_our_schedule(tmp_path):
    settings = modelopt_peer.settings_for(row(tmp_path, schedule="ours"), shape=SHAPE, data_dir=tmp_path,
                                          max_length=64, final_hidden=False)
    assert settings["training.learning_rate"] == OUR_SCHEDULE["learning_rate"]
    assert settings["training.warmup_steps"] == 30 and settings["training.lr_scheduler_type"] == "cosine_with_min_lr"
    assert settings["training.lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert (settings["training.adam_beta1"], settings["training.adam_beta2"]) == (0.9, 0.95)
    assert settings["training.weight_decay"] == 0.01 and settings["training.max_grad_norm"] == 1.0
    assert settings["dflash.dflash_self_logit_distillation"] is False  # no teacher signal in that data


def test_the_launcher_reads_every_setting_back_as_written(tmp_path):
    # ModelOpt's load_recipe splits each override at its first `=` and parses the value with yaml.safe_load.
    settings = modelopt_peer.settings_for(row(tmp_path, schedule="ours"), shape=SHAPE, data_dir=tmp_path,
                                          max_length=64, final_hidden=True)
    assert settings["training.save_strategy"] == "no" and settings["training.tf32"] is False
    assert settings["dflash.dflash_architecture_config.rms_norm_eps"] == 1e-5  # YAML 1.1 reads `1e-05` as text
    overrides = modelopt_peer.overrides(settings)
    assert len(overrides) == len(settings)
    for (key, value), override in zip(settings.items(), overrides, strict=True):
        name, text = override.split("=", 1)
        assert name == key and yaml.safe_load(text) == value, override


@pytest.mark.parametrize("changes, reason", [({"layers": 2}, "3 drafter layers"), ({"variant": "dflash2"}, "DFlash only"),
                                             ({"schedule": "mine"}, "unknown schedule")])
def test_rows_modelopt_cannot_train_are_refused(tmp_path, changes, reason):
    with pytest.raises(PeerFailed, match=reason):
        modelopt_peer.settings_for(row(tmp_path, **changes), shape=SHAPE, data_dir=tmp_path, max_length=64,
                                   final_hidden=True)


def test_dpace_off_is_the_fixed_decay(tmp_path):
    settings = modelopt_peer.settings_for(row(tmp_path, options={"dpace": False}), shape=SHAPE, data_dir=tmp_path,
                                          max_length=64, final_hidden=True)
    assert settings["dflash.dflash_loss_objective"] == "decay"


def test_the_exported_config_gets_the_targets_layer_count_and_keeps_modelopts_beside_it(tmp_path):
    written = {"architectures": ["DFlashDraftModel"], "block_size": 8, "num_target_layers": 0,
               "dflash_config": {"mask_token_id": 16, "target_layer_ids": [1, 14, 27]}}
    (tmp_path / "config.json").write_text(json.dumps(written))
    assert modelopt_peer.fix_config(tmp_path, SHAPE) == {"num_target_layers": [0, 30]}
    assert json.loads((tmp_path / "config.json").read_text()) == written | {"num_target_layers": 30}
    assert json.loads((tmp_path / "config.modelopt.json").read_text()) == written
    assert modelopt_peer.fix_config(tmp_path, SHAPE) == {}


def test_the_drafter_shape_is_ours_for_a_llama_target(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-5, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": 5000.0}).save_pretrained(tmp_path / "target")
    shape = modelopt_peer.drafter_shape(tmp_path / "target", row(tmp_path, taps=(1, 3, 4)))
    assert shape == {"num_hidden_layers": 3, "target_layer_ids": [1, 3, 4], "intermediate_size": 96,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 512, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
                     "num_target_layers": 6}


def test_without_its_venv_the_row_says_how_to_install_it(tmp_path):
    with pytest.raises(PeerFailed, match="bench/setup/modelopt.sh"):
        modelopt_peer.train(row(tmp_path), tmp_path / "no-venv")


def test_a_float32_row_turns_its_bfloat16_autocast_off(tmp_path):
    """On a CPU without bfloat16 units the bench trains peers in float32 (bench/peers/peer_run.py PEER_DTYPES)."""
    settings = modelopt_peer.settings_for(row(tmp_path, dtype="float32"), shape=SHAPE, data_dir=tmp_path,
                                          max_length=64, final_hidden=True)
    assert settings["training.bf16"] is False
    authors = modelopt_peer.settings_for(row(tmp_path), shape=SHAPE, data_dir=tmp_path, max_length=64,
                                         final_hidden=True)
    assert "training.bf16" not in authors  # the packaged recipe's bf16: true stays


def test_a_float32_conversion_is_its_own(tmp_path):
    """Its lm_head and fc take the stored states as they are: a float32 row reads float32 samples, converted apart
    from (never reusing) the bfloat16 ones (bench/peers/peer_run.py conversion_dir)."""
    from bench.peers.peer_run import conversion_dir, conversion_dtype

    store = FakeStore(tmp_path / "data", [example(0, 3, 4)])
    assert conversion_dir(tmp_path, "modelopt", "float32") != conversion_dir(tmp_path, "modelopt", "authors")
    assert (conversion_dtype("float32"), conversion_dtype("authors")) == ("float32", None)  # None: as stored
    assert conversion_dtype("authors", "bfloat16") == "bfloat16"  # SpecForge's published dtype
    out = tmp_path / "out"
    modelopt_peer.convert_data(store, out, TAPS)
    assert modelopt_peer.convert_data(store, out, TAPS, "float32")["dtype"] == "float32"
    sample = torch.load(next(out.glob("sample-*.pt")), weights_only=True)
    assert sample["aux_hidden_states"].dtype == sample["hidden_states"].dtype == torch.float32
    assert store.reads == 2  # converted again, not the bfloat16 conversion reused
