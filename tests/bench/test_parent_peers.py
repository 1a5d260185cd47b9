"""trainer/drafter/formats.py against the field's own writers, each in its bench venv: bench/peers/speculators_parent.py
(vLLM speculators 0.9.0: DFlash, DFlash 2, DSpark, saved by its `save_pretrained`, loaded back by its
`from_pretrained`) and bench/peers/specforge_parent.py (SpecForge 0.2.0: DFlash, DSpark, written by its HF exporter,
loaded back by its `AutoDraftModel`) build tiny random drafters for a tiny target and run their own forward on
fixed target taps. Here each folder is imported by content, and our drafter, run on the same blocks as our decoder
drafts them, must give the same final hidden states, logits and greedy drafts. Every tensor a tool wrote is read
into our drafter with its values or dropped with a reason. CI installs neither tool, so these are skipped there."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.drafter.formats import DrafterFormatError, import_drafter, read_parent, tensor_plan

ROOT = Path(__file__).resolve().parents[2]
SPECULATORS = ROOT / ".engines" / "speculators" / "bin" / "python"
SPECFORGE = ROOT / ".engines" / "specforge" / "bin" / "python"
TARGET_LAYERS = 4
TOLERANCE = 1e-4
"""float32 on both sides; what may differ is the order of the additions (measured: at most 7e-6)."""
DSPARK_HEADS = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                "confidence_head.proj.bias"}

needs_speculators = pytest.mark.skipif(
    not SPECULATORS.is_file(), reason="vLLM speculators is not installed (bash bench/setup/speculators.sh)")
needs_specforge = pytest.mark.skipif(
    not SPECFORGE.is_file(), reason="SpecForge is not installed (bash bench/setup/specforge.sh)")


def peer_run(python: Path, script: str, out: Path) -> Path:
    subprocess.run([str(python), str(ROOT / "bench" / "peers" / script), str(out)], check=True, capture_output=True,
                   text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    return out


@pytest.fixture(scope="module")
def speculators_saved(tmp_path_factory) -> Path:
    return peer_run(SPECULATORS, "speculators_parent.py", tmp_path_factory.mktemp("speculators"))


@pytest.fixture(scope="module")
def specforge_saved(tmp_path_factory) -> Path:
    return peer_run(SPECFORGE, "specforge_parent.py", tmp_path_factory.mktemp("specforge"))


def our_pass(drafter, expected: dict, embedding: torch.Tensor, head: torch.Tensor):
    """Our drafter on each of the tool's anchored blocks as our decoder drafts one: the target's taps before
    the anchor as context, [anchor, MASK...] at the anchor's positions. (hidden, logits) of every slot."""
    block = drafter.config.block_size
    hidden = []
    with torch.no_grad():
        for anchor in expected["anchor_positions"].tolist():
            ids = torch.full((1, block), drafter.config.mask_token_id)
            ids[0, 0] = expected["input_ids"][0, anchor]
            hidden.append(drafter(drafter.embed_block(ids, embedding), torch.arange(anchor, anchor + block)[None],
                                  expected["hidden_states"][:, :anchor], torch.arange(anchor)[None])[0])
    hidden = torch.cat(hidden)
    rows = head if drafter.draft_vocab is None else head[drafter.draft_vocab]
    return hidden, hidden @ rows.T


def our_drafts(drafter, variant: str, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor,
               from_anchor: bool) -> torch.Tensor:
    """Greedy drafts as trainer/speculative.py makes them (DSpark: every slot, as its backbone drafts)."""
    block = drafter.config.block_size
    hidden, logits = hidden.view(-1, block, hidden.shape[-1]), logits.view(-1, block, logits.shape[-1])
    if variant == "dflash2":
        with torch.no_grad():
            return drafter.propose(hidden[:, 1:], logits[:, 1:], anchor_ids, 0.0)[0]
    drafts = logits[:, 0 if from_anchor else 1:].argmax(-1)
    return drafts if drafter.draft_vocab is None else drafter.draft_vocab[drafts]


def imports_whole(folder: Path, fmt: str, variant: str, dropped_expected: set[str]):
    """The folder imported: every tensor in it kept under our name with its values, dropped with a reason the
    origin reports, or the draft vocabulary."""
    imported = import_drafter(folder, num_target_layers=TARGET_LAYERS)
    drafter, origin = imported.drafter, imported.origin
    assert (origin.format, origin.variant) == (fmt, variant)
    assert drafter.config.target_layer_ids == (1, 3)
    kept, dropped = tensor_plan(read_parent(folder, num_target_layers=TARGET_LAYERS))
    theirs = load_file(folder / "model.safetensors")
    assert set(kept) | set(dropped) | ({"d2t", "t2d"} & set(theirs)) == set(theirs)
    ours = drafter.state_dict()
    for name, our_name in kept.items():
        assert torch.equal(ours[our_name], theirs[name].float()), name
    assert set(dropped) == dropped_expected
    assert sorted(origin.dropped_tensors) == sorted(f"{n}: {r}" for n, r in dropped.items())
    return drafter


def drafts_the_same(drafter, saved: Path, variant: str, from_anchor: bool = False) -> None:
    expected = load_file(saved / variant / "expected.safetensors")
    target = load_file(saved / "target" / "model.safetensors")
    hidden, logits = our_pass(drafter, expected, target["model.embed_tokens.weight"], target["lm_head.weight"])
    assert expected["logits"].std() > 0.1  # logits far enough apart for the argmax to mean something
    assert (hidden - expected["hidden"]).abs().max() < TOLERANCE
    assert (logits - expected["logits"]).abs().max() < TOLERANCE
    anchor_ids = expected["input_ids"][0, expected["anchor_positions"]]
    drafts = our_drafts(drafter, variant, hidden, logits, anchor_ids, from_anchor)
    assert torch.equal(drafts, expected["drafts"])
    if variant == "dflash2":  # its selector changes some of the logits' picks, so the walk itself is compared
        assert not torch.equal(drafts, logits.view(-1, 4, logits.shape[-1])[:, 1:].argmax(-1))


@needs_speculators
@pytest.mark.parametrize(("variant", "dropped"), [("dflash", {"lm_head.weight"}), ("dflash2", set()),
                                                  ("dspark", DSPARK_HEADS)])
def test_a_drafter_speculators_saves_imports_whole_and_drafts_its_tokens(speculators_saved, variant, dropped):
    summary = json.loads((speculators_saved / "summary.json").read_text())["variants"][variant]
    drafter = imports_whole(speculators_saved / variant, "speculators", variant, dropped)
    assert set(summary["tensors"]) == set(load_file(speculators_saved / variant / "model.safetensors"))
    drafts_the_same(drafter, speculators_saved, variant, from_anchor=bool(summary["sample_from_anchor"]))


@needs_speculators
@pytest.mark.parametrize(("variant", "reason"), [("dflash-sliding", "layer_types ['sliding_attention']"),
                                                 ("dflash-gelu", "hidden_act gelu")])
def test_what_our_drafter_does_not_compute_is_refused_by_name(speculators_saved, variant, reason):
    """speculators' default layers are sliding-window (causal inside a DFlash block: its logits differ from a
    full layer's by up to 6.2 on these inputs), and --draft-hidden-act changes the MLP."""
    with pytest.raises(DrafterFormatError, match=re.escape(reason)):
        read_parent(speculators_saved / variant, num_target_layers=TARGET_LAYERS)


@needs_specforge
@pytest.mark.parametrize(("variant", "fmt", "dropped"), [("dflash", "z-lab", set()),
                                                         ("dspark", "specforge", DSPARK_HEADS)])
def test_a_drafter_specforge_exports_imports_whole_and_drafts_its_tokens(specforge_saved, variant, fmt, dropped):
    """A plain SpecForge DFlash export is the reference layout (read as z-lab's); its DSpark's keys say SpecForge."""
    drafter = imports_whole(specforge_saved / variant, fmt, variant, dropped)
    drafts_the_same(drafter, specforge_saved, variant)
