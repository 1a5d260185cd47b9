"""Drafter adapters (training.drafter_adapter, trainer/training/drafter_adapter.py): a warm start that trains a LoRA over
its parent's layers and `fc` instead of every weight. Only the LoRA weights move; the merged drafter computes what
the trained PEFT-wrapped drafter computes; the exported adapter, loaded by peft onto the parent as published, gives
the merged drafter's logits; the merged drafter stays lossless; the spec and the CLI refuse an adapter without a
parent. Tiny target, a random parent, a few steps: seconds."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from drafters import random_drafter
from pydantic import ValidationError

from schemas.job_spec import JobSpec
from schemas.sampling import SamplingParams
from schemas.validation_report import ValidationReport
from trainer.drafter.checkpoint import load_drafter, save_drafter
from trainer.drafter.config import DrafterConfig
from trainer.drafter.draft_vocab import save_draft_vocab
from trainer.errors import DraftsmithError
from trainer.speculative import SpeculativeDecoder
from trainer.training.config import TrainConfig
from trainer.training.drafter_adapter import ADAPTED_MODULES, ADAPTER_DIR, adapter_figures, add_adapter, is_lora_name
from trainer.training.loop import Trainer

TAPS = [1, 2, 3]  # the taps of learnable_data (tests/trainer/conftest.py)
RANK = 4
STEPS = 4


@pytest.fixture(scope="module")
def target(learnable_target):
    return learnable_target


@pytest.fixture(scope="module")
def data(learnable_data):
    return learnable_data


@pytest.fixture(scope="module")
def parent_dir(target, tmp_path_factory):
    """A published parent of the job's own shape, with a draft vocabulary of its own (a vocabulary map the adapter
    must leave as it is)."""
    drafter = random_drafter(target, num_layers=1, block_size=4, target_layer_ids=TAPS, selector_rank=8,
                             selector_top_k=8, draft_vocab_size=40, seed=3)
    chosen = set(target.stop_token_ids())
    chosen |= set([i for i in range(10, target.vocab_size) if i not in chosen][:40 - len(chosen)])
    ids = torch.tensor(sorted(chosen))
    drafter.draft_vocab = ids
    folder = tmp_path_factory.mktemp("parent")
    save_draft_vocab(ids, target.vocab_size, folder)
    save_drafter(drafter, folder)
    return folder


def job_config(target, parent_dir) -> DrafterConfig:
    parent = load_drafter(parent_dir).config
    return DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=parent.mask_token_id,
                                    target_layer_ids=TAPS, selector_rank=8, selector_top_k=8)


def adapter_cfg(parent_dir, **changes) -> TrainConfig:
    return TrainConfig(**{"steps": STEPS, "batch_size": 2, "anchors_per_sequence": 4, "lr": 3e-3, "warmup_steps": 1,
                          "checkpoint_every": STEPS, "init": f"drafter:{parent_dir}", "drafter_adapter_rank": RANK,
                          **changes})


@pytest.fixture(scope="module")
def trained(target, data, parent_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapter-run")
    records = []
    drafter_dir = Trainer(target, data, out, job_config(target, parent_dir), adapter_cfg(parent_dir),
                          [records.append]).run()
    return out, drafter_dir, records


def trained_module_state(out) -> dict[str, torch.Tensor]:
    """The trained (PEFT-wrapped) drafter's state at the last step, from the plain engine's checkpoint."""
    state = torch.load(out / "checkpoints" / f"step-{STEPS:06d}" / "state.pt", map_location="cpu", weights_only=True)
    return {name.removeprefix("drafter."): tensor for name, tensor in state["module"].items()}


def wrapped_drafter(target, parent_dir, out):
    from trainer.drafter.model import Drafter

    drafter = Drafter(load_drafter(out / "drafter").config)
    add_adapter(drafter, RANK, 2 * RANK)
    drafter.load_state_dict(trained_module_state(out))
    return drafter.eval()


def block_inputs(target, config: DrafterConfig, seed: int = 0):
    """A drafter forward's inputs: one block after 9 context tokens, with the target's real taps."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, target.vocab_size, (1, 10), generator=generator)
    _, taps = target.forward(ids, tap_layer_ids=TAPS)
    block = torch.full((1, config.block_size), config.mask_token_id)
    block[0, 0] = ids[0, -1]
    embedding = target.embedding_weight
    positions = torch.arange(9, 9 + config.block_size)[None]
    return (torch.nn.functional.embedding(block, embedding), positions, taps[:, :9].float(), torch.arange(9)[None])


def test_only_the_lora_weights_train(target, parent_dir, trained):
    out, drafter_dir, records = trained
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    parent = load_drafter(parent_dir).state_dict()
    state = trained_module_state(out)
    lora = {name: tensor for name, tensor in state.items() if is_lora_name(name)}
    assert lora and all(name.split(".lora_")[0].split(".")[-1] in ADAPTED_MODULES for name in lora)
    assert any(float(tensor.abs().max()) > 0 for name, tensor in lora.items() if ".lora_B." in name)  # B starts at 0
    frozen = {name.replace(".base_layer.", "."): tensor for name, tensor in state.items() if not is_lora_name(name)}
    assert frozen.keys() == parent.keys()
    for name, tensor in frozen.items():  # norms, base kernels, the selector's codebooks and every base weight
        assert torch.equal(tensor, parent[name]), name

    merged = load_drafter(drafter_dir)
    kept = [name for name in parent if not any(f"{m}.weight" in name for m in ADAPTED_MODULES)]
    assert "candidate_selector.successor_codebook.weight" in kept and "norm.weight" in kept
    for name in kept:
        assert torch.equal(merged.state_dict()[name], parent[name]), name
    assert not torch.equal(merged.state_dict()["fc.weight"], parent["fc.weight"])
    # The parent's vocabulary map is kept, not ranked again on the job's responses: an adapter changes no vocabulary.
    assert torch.equal(merged.draft_vocab, load_drafter(parent_dir).draft_vocab)
    assert merged.config.draft_vocab_size == 40


def test_the_merged_drafter_computes_what_the_trained_adapter_drafter_computes(target, parent_dir, trained):
    out, drafter_dir, _ = trained
    wrapped, merged = wrapped_drafter(target, parent_dir, out), load_drafter(drafter_dir).eval()
    assert type(merged.fc) is torch.nn.Linear and type(wrapped.fc) is not torch.nn.Linear
    with torch.no_grad():
        for seed in range(3):
            inputs = block_inputs(target, merged.config, seed)
            torch.testing.assert_close(merged(*inputs), wrapped(*inputs), rtol=1e-5, atol=1e-5)


def test_the_exported_adapter_loads_with_peft_onto_the_parent_and_gives_the_merged_logits(target, parent_dir, trained):
    from peft import PeftModel

    out, drafter_dir, _ = trained
    config = json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", RANK, 2 * RANK)
    assert sorted(config["target_modules"]) == sorted(ADAPTED_MODULES) and config["lora_dropout"] == 0.0
    parent = load_drafter(parent_dir).eval()  # the parent as published, read from its own folder
    merged = load_drafter(drafter_dir).eval()
    with torch.no_grad():
        inputs = block_inputs(target, merged.config)
        before = parent(*inputs)
        adapted = PeftModel.from_pretrained(parent, str(out / ADAPTER_DIR)).eval()
        hidden, expected = adapted(*inputs), merged(*inputs)
        torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(hidden, before, atol=1e-3)  # the adapter is what moved it
        head = target.lm_head.weight.float()
        torch.testing.assert_close(hidden @ head.T, expected @ head.T, rtol=1e-4, atol=1e-4)
        assert torch.equal((hidden @ head.T).argmax(-1), (expected @ head.T).argmax(-1))


def test_the_merged_drafter_stays_lossless(target, trained):
    _, drafter_dir, _ = trained
    merged = load_drafter(drafter_dir)
    greedy = SamplingParams(max_new_tokens=24)
    for prompt in ([12, 40, 41, 42], [5, 90, 17]):
        assert SpeculativeDecoder(target, merged).generate(prompt, greedy).tokens == \
            SpeculativeDecoder(target).generate(prompt, greedy).tokens


def test_the_adapters_size_is_read_from_its_files(trained):
    out, drafter_dir, _ = trained
    figures = adapter_figures(out / ADAPTER_DIR, drafter_dir)
    lora = {n: t for n, t in trained_module_state(out).items() if is_lora_name(n)}
    whole = load_drafter(drafter_dir).state_dict()
    assert figures["trainable_parameters"] == sum(t.numel() for t in lora.values())
    assert figures["drafter_parameters"] == sum(t.numel() for t in whole.values())
    assert 0 < figures["trainable_share"] < 1 and figures["rank"] == RANK and figures["alpha"] == 2 * RANK
    assert figures["bytes"] == (out / ADAPTER_DIR / "adapter_model.safetensors").stat().st_size
    assert figures["folder"] == ADAPTER_DIR


def test_a_resumed_adapter_run_continues_exactly(target, data, parent_dir, trained, tmp_path):
    _, _, uninterrupted = trained
    cfg = adapter_cfg(parent_dir, checkpoint_every=2)

    class Crash(Exception):
        pass

    def crash_at_step_3(record):
        if record["step"] == 3:
            raise Crash

    with pytest.raises(Crash):
        Trainer(target, data, tmp_path, job_config(target, parent_dir), cfg, [crash_at_step_3]).run()
    resumed = []
    Trainer(target, data, tmp_path, job_config(target, parent_dir), cfg, [resumed.append]).run(resume=True)
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(uninterrupted[2:], resumed, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_trains_the_adapter_as_the_plain_engine_does(target, data, parent_dir, trained, tmp_path,
                                                                monkeypatch, zero_stage):
    """DeepSpeed's engine (ZeRO-2 and ZeRO-3, a world of one) around the PEFT-wrapped drafter: the same losses and
    the same merged drafter as the plain engine, its frozen weights untouched."""
    from trainer.training import distributed

    out, plain_dir, plain = trained
    monkeypatch.setattr(distributed, "wrap", distributed.deepspeed_engine)
    records = []
    drafter_dir = Trainer(target, data, tmp_path, job_config(target, parent_dir),
                          adapter_cfg(parent_dir, zero_stage=zero_stage), [records.append]).run()
    assert not (tmp_path / "checkpoints" / f"step-{STEPS:06d}" / "state.pt").exists()  # DeepSpeed's own layout
    for a, b in zip(plain, records, strict=True):
        assert (a["loss"], a["grad_norm"]) == pytest.approx((b["loss"], b["grad_norm"]), rel=1e-4)
    ours, theirs = load_drafter(plain_dir).state_dict(), load_drafter(drafter_dir).state_dict()
    # Rounding, not training: ZeRO-3 flattens and partitions the weights and reduces gradients in another order,
    # and Adam divides by a second moment near zero on a fresh LoRA B; on some CPUs a merged weight then moves by
    # up to 4e-6 (weights are ~0.02-0.25 here), far below what a step changes.
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert (tmp_path / ADAPTER_DIR / "adapter_model.safetensors").is_file()


def test_training_without_an_adapter_leaves_no_adapter_folder(target, data, parent_dir, tmp_path):
    (tmp_path / ADAPTER_DIR).mkdir()
    (tmp_path / ADAPTER_DIR / "adapter_config.json").write_text("{}")  # an earlier run's, into the same folder
    Trainer(target, data, tmp_path, job_config(target, parent_dir),
            adapter_cfg(parent_dir, steps=1, drafter_adapter_rank=None)).run()
    assert not (tmp_path / ADAPTER_DIR).exists()


# --- the spec, the trainer's settings and the CLI ---------------------------------------------------------------

PARENT = "hf://acme/parent-drafter"


def test_the_spec_takes_an_adapter_for_a_warm_start_only():
    body = {"target": {"uri": "bundled:smollm2-135m"}, "training": {"drafter_adapter": {"rank": 8}}}
    with pytest.raises(ValidationError, match="training.drafter_adapter trains a LoRA over a parent drafter.*"
                                              "set init.from_drafter"):
        JobSpec.model_validate(body)
    spec = JobSpec.model_validate({**body, "init": {"from_drafter": PARENT}})
    assert spec.training.drafter_adapter.rank == 8 and spec.training.drafter_adapter.alpha is None
    assert spec.training.max_steps < JobSpec.model_validate({"target": body["target"]}).training.max_steps  # a warm start's budget
    for rank in (0, 257):
        with pytest.raises(ValidationError, match="rank"):
            JobSpec.model_validate({**body, "init": {"from_drafter": PARENT},
                                    "training": {"drafter_adapter": {"rank": rank}}})
    with pytest.raises(ValidationError, match="extra"):
        JobSpec.model_validate({**body, "init": {"from_drafter": PARENT},
                                "training": {"drafter_adapter": {"rank": 8, "dropout": 0.1}}})


def test_a_spec_without_an_adapter_keeps_its_hash():
    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}})
    assert "drafter_adapter" not in json.loads(spec.canonical_json())["training"]
    adapted = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}, "init": {"from_drafter": PARENT},
                                      "training": {"drafter_adapter": {"rank": 8, "alpha": 4}}})
    assert json.loads(adapted.canonical_json())["training"]["drafter_adapter"] == {"rank": 8, "alpha": 4}


def test_the_spec_reaches_the_trainer(tmp_path):
    from trainer.job_config import run_config_from_spec

    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"},
                                   "init": {"from_drafter": tmp_path.as_uri()},
                                   "training": {"drafter_adapter": {"rank": 8}}},
                                  context={"allowed_file_roots": [str(tmp_path)]})
    train = run_config_from_spec(spec, target="smollm2-135m").train
    assert (train.drafter_adapter_rank, train.drafter_adapter_alpha, train.drafter_adapter) == (8, None, (8, 16))
    assert TrainConfig(init="drafter:/p", drafter_adapter_rank=8, drafter_adapter_alpha=4).drafter_adapter == (8, 4)
    assert TrainConfig().drafter_adapter is None


def test_the_trainer_refuses_an_adapter_without_a_parent():
    with pytest.raises(DraftsmithError, match="set init.from_drafter"):
        TrainConfig(drafter_adapter_rank=8)
    with pytest.raises(DraftsmithError, match="drafter_adapter_rank=0 is out of range"):
        TrainConfig(init="drafter:/p", drafter_adapter_rank=0)


def test_the_cli_flag_needs_a_parent(tmp_path):
    from click.testing import CliRunner

    from trainer.cli_run import run, with_drafter_adapter

    result = CliRunner().invoke(run, ["--target", "smollm2-135m", "--out", str(tmp_path), "--drafter-adapter-rank",
                                      "8"])
    assert result.exit_code != 0
    assert "--drafter-adapter-rank trains a LoRA over a parent drafter: give the parent with --from-drafter" in \
        result.output
    body = {"init": {"from_drafter": PARENT}, "training": {"drafter_adapter": {"rank": 2, "alpha": 3}}}
    assert with_drafter_adapter(body, 8)["training"]["drafter_adapter"] == {"rank": 8, "alpha": 3}
    assert with_drafter_adapter({}, None) == {}


# --- export, report, card ---------------------------------------------------------------------------------------


def test_export_ships_the_adapter_beside_the_merged_drafter_and_reports_its_size(target, trained, tmp_path):
    from report.html import render_report_html
    from trainer.export.artifacts import export_artifacts, verify_manifest
    from trainer.export.model_card import _warm_start
    from trainer.pipeline import adapter_description

    out, drafter_dir, _ = trained
    figures = adapter_description(drafter_dir)
    assert figures is not None and figures.rank == RANK
    report = ValidationReport(warm_start={"parent": {"name": PARENT}, "prompts": 4, "parent_tau": 1.1, "tau": 1.2,
                                          "adapter": figures.to_json()})
    export = tmp_path / "export"
    manifest = export_artifacts(drafter_dir, target, export, report=report)
    assert {f"{ADAPTER_DIR}/adapter_config.json", f"{ADAPTER_DIR}/adapter_model.safetensors",
            f"{ADAPTER_DIR}/README.md", "drafter/model.safetensors"} <= set(manifest.files)
    assert verify_manifest(export) == []
    shipped = json.loads((export / ADAPTER_DIR / "adapter_config.json").read_text())
    assert shipped["base_model_name_or_path"] == PARENT  # as the job names it, never the worker's local copy
    assert json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())["base_model_name_or_path"] is None
    assert PARENT in (export / ADAPTER_DIR / "README.md").read_text()
    assert ValidationReport.load(export / "report.json").warm_start.adapter.trainable_parameters == \
        figures.trainable_parameters

    line = f"Trained as a drafter adapter (preview): a rank-{RANK} LoRA, alpha {2 * RANK} over the parent's layers"
    assert line in _warm_start(report) and line in (export / "README.md").read_text()
    page = render_report_html(report, [])
    assert 'id="drafter-adapter"' in page and f"{figures.trainable_parameters:,} parameters" in page

    full = tmp_path / "full"  # a drafter without an adapter, exported into the same folder: none is left behind
    shutil.copytree(drafter_dir, full / "drafter")
    assert not any(name.startswith(ADAPTER_DIR) for name in export_artifacts(full / "drafter", target, export).files)
    assert not (export / ADAPTER_DIR).exists()


def test_a_run_with_a_drafter_adapter_reports_and_exports_it_end_to_end(target, parent_dir, tmp_path):
    """prepare, generate, train, validate, export (trainer/pipeline.py), as `draftsmith run --from-drafter DIR
    --drafter-adapter-rank 4` runs them: lossless, the adapter's size in report.json, the adapter in the export."""
    from trainer.export.artifacts import verify_manifest
    from trainer.pipeline import Run, RunConfig

    config = RunConfig(target=str(target.path), sampling=SamplingParams(max_new_tokens=12), num_prompts=20, holdout=0.2,
                       num_layers=1, block_size=4, parent_name=PARENT,
                       train=adapter_cfg(parent_dir, steps=2, checkpoint_every=2),
                       generation_batch_size=8, validation_prompts=2, validation_max_new_tokens=8, sampling_draws=20,
                       engines=())
    out = tmp_path / "out"
    Run(config, out).execute()
    report = ValidationReport.load(out / "report.json")
    assert report.passed and report.greedy.mismatches == 0
    adapter = report.warm_start.adapter
    assert adapter.rank == RANK and adapter.folder == ADAPTER_DIR and 0 < adapter.trainable_share < 1
    assert adapter.bytes == (out / ADAPTER_DIR / "adapter_model.safetensors").stat().st_size
    assert report.warm_start.parent.name == PARENT
    assert json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())["base_model_name_or_path"] == PARENT
    assert verify_manifest(out) == [] and f"{ADAPTER_DIR}/adapter_model.safetensors" in json.loads(
        (out / "manifest.json").read_text())["files"]
    assert 'id="drafter-adapter"' in (out / "report.html").read_text()
    assert f"a rank-{RANK} LoRA" in (out / "README.md").read_text()


def test_an_adapter_over_a_dflash_parent_applies_to_the_parent_upgraded(target, data, tmp_path):
    """A DFlash (v1) parent starts a DFlash 2 job upgraded (identity convolutions, an argmax selector); the adapter
    trains over that upgraded parent, leaves the parts the upgrade added as the upgrade made them, and loads with
    peft onto the upgraded parent (what the adapter's README and report.json's upgrades say it applies to)."""
    from peft import PeftModel
    from test_parent_formats import write_zlab

    from trainer.training.init import start_from_parent

    parent = random_drafter(target, "dflash", num_layers=1, block_size=4, target_layer_ids=TAPS, seed=5)
    folder = write_zlab(parent, tmp_path / "v1-parent")
    config = DrafterConfig.for_target(target, variant="dflash2", num_layers=1, block_size=4,
                                      mask_token_id=parent.config.mask_token_id, target_layer_ids=TAPS,
                                      selector_rank=8, selector_top_k=8)
    cfg = adapter_cfg(folder)
    out = tmp_path / "run"
    drafter_dir = Trainer(target, data, out, config, cfg).run()

    def upgraded():
        torch.manual_seed(cfg.seed)  # the upgrade's new parts as the trainer drew them (trainer/training/init.py)
        started = start_from_parent(config, str(folder))
        assert started.origin.upgrades[0].startswith("DFlash to DFlash 2")
        return started.drafter.float().eval()

    base, merged = upgraded().state_dict(), load_drafter(drafter_dir).eval()
    # The upgrade's parts no LoRA wraps (the selector, the convolutions' base kernels) stay as the upgrade made them.
    added = [name for name in base if name.startswith("candidate_selector.") or "base_kernel" in name]
    assert any("base_kernel" in name for name in added) and not set(added) & set(parent.state_dict())
    for name in added:
        assert torch.equal(merged.state_dict()[name], base[name]), name
    assert not torch.equal(merged.state_dict()["fc.weight"], base["fc.weight"])
    with torch.no_grad():
        inputs = block_inputs(target, merged.config)
        adapted = PeftModel.from_pretrained(upgraded(), str(out / ADAPTER_DIR)).eval()
        torch.testing.assert_close(adapted(*inputs), merged(*inputs), rtol=1e-5, atol=1e-5)
    greedy = SamplingParams(max_new_tokens=24)
    for prompt in ([12, 40, 41, 42], [5, 90, 17]):
        assert SpeculativeDecoder(target, merged).generate(prompt, greedy).tokens == \
            SpeculativeDecoder(target).generate(prompt, greedy).tokens
