"""Parent drafters in the field's formats (trainer/drafter/formats.py) and their upgrades to a job's shape
(trainer/drafter/upgrade.py). Each format's folder is built here from a random drafter of a tiny target, in the
layout its tool writes (config keys and tensor names as documented by z-lab's `dflash` 0.1.0, vLLM speculators
and SpecForge), under a folder name that says nothing: the importer reads content only. The z-lab folders are
also loaded by the reference package itself, and its `dflash_generate` must give the same tokens and acceptance
lengths as our decoder running the imported (and the upgraded) drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafters import random_drafter
from safetensors.torch import save_file
from test_data import write_prompts
from transformers import Qwen3Config

from schemas.sampling import SamplingParams
from schemas.work_files import PreparedTarget
from trainer.drafter.checkpoint import RELEASED_NAMES, load_drafter, save_drafter
from trainer.drafter.config import DrafterConfig
from trainer.drafter.formats import DrafterFormatError, import_drafter, read_parent
from trainer.speculative import SpeculativeDecoder
from trainer.training.config import TrainConfig
from trainer.training.init import IncompatibleDrafter, check_warm_start, start_from_parent, warm_start_drafter

REFERENCE_CLASSES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}


# --- each tool's layout, written from one of our drafters ------------------------------------------------------


def write_zlab(drafter, folder: Path, *, architecture: str | None = None, widths_in_config: bool = True) -> Path:
    """z-lab's release layout: the reference config without our `draftsmith` block, block_size at the top level
    as well (older releases have it only there), the codebooks under their released names."""
    save_drafter(drafter, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("draftsmith", None)
    config.update(auto_map={"AutoModel": "dflash.DFlashDraftModel"}, layer_types=["full_attention"] * len(drafter.layers))
    if architecture:  # NeMo's DFlash 2 exports carry the v1 name
        config["architectures"] = [architecture]
    if not widths_in_config:
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            config["dflash_config"].pop(key, None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def markov_heads(config: DrafterConfig, rank: int = 8, draft_vocab: int | None = None, prefix: str = "") -> dict:
    rows = draft_vocab or config.vocab_size
    return {f"{prefix}markov_head.markov_w1.weight": torch.randn(config.vocab_size, rank),
            f"{prefix}markov_head.markov_w2.weight": torch.randn(rows, rank),
            f"{prefix}confidence_head.proj.weight": torch.randn(1, config.hidden_size + rank),
            f"{prefix}confidence_head.proj.bias": torch.randn(1)}


def layer_config_diff(c: DrafterConfig) -> dict:
    """The drafter's layer config as speculators serialises it (`to_diff_dict`): what differs from Qwen3Config's
    defaults (rms_norm_eps, hidden_act, attention_bias ... are left out), and model_type."""
    layer = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                        num_hidden_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
                        max_position_embeddings=c.max_position_embeddings).to_dict()
    defaults = Qwen3Config().to_dict()
    diff = {k: v for k, v in layer.items() if defaults.get(k) != v and k != "layer_types"}
    assert "rms_norm_eps" not in diff and "hidden_size" in diff
    return {**diff, "model_type": "qwen3"}


def write_speculators(drafter, target, folder: Path, *, kind: str | None = None, draft_ids: torch.Tensor | None = None,
                      codebooks_over_draft_vocab: bool = False, sample_from_anchor: bool = False) -> Path:
    """vLLM speculators' layout: `speculators_config`, the drafter's layers in `transformer_layer_config`, taps as
    `aux_hidden_state_layer_ids` (HF hidden_states indices: ours + 1), frozen copies of the verifier's embedding
    and (draft-vocabulary rows of its) head, `d2t`/`t2d` for a draft vocabulary, DSpark's heads for `dspark`."""
    c = drafter.config
    kind = kind or c.variant
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().clone().contiguous() for name, t in drafter.state_dict().items()}
    head = target.lm_head.weight.detach().float()
    tensors["embed_tokens.weight"] = target.embedding_weight.detach().float().clone()
    draft_vocab_size = c.vocab_size
    if draft_ids is not None:
        draft_vocab_size = len(draft_ids)
        tensors["d2t"] = draft_ids - torch.arange(len(draft_ids))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        tensors["t2d"] = t2d
        head = head[draft_ids]
        if codebooks_over_draft_vocab:
            for name in ("candidate_selector.predecessor_codebook.weight",
                         "candidate_selector.successor_codebook.weight"):
                tensors[name] = tensors[name][draft_ids].clone()
    tensors["lm_head.weight"] = head.clone()
    if kind == "dspark":
        tensors.update(markov_heads(c, draft_vocab=draft_vocab_size))
    config = {
        "speculators_model_type": kind, "speculators_version": "0.9.0",
        "architectures": [{"dflash": "DFlashSpeculator", "dflash2": "DFlash2Speculator",
                           "dspark": "DSparkSpeculator"}[kind]],
        "transformer_layer_config": layer_config_diff(c),
        "draft_vocab_size": draft_vocab_size, "block_size": c.block_size, "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [t + 1 for t in c.target_layer_ids], "mask_token_id": c.mask_token_id,
        "sliding_window_non_causal": False, "sample_from_anchor": sample_from_anchor,
        "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy",
                                                     "speculative_tokens": c.block_size - 1}],
                               "verifier": {"name_or_path": "acme/base", "architectures": ["Qwen3ForCausalLM"]}},
    }
    if c.variant == "dflash2":
        config.update(conv_kernel_size=c.conv_kernel_size, conv_group_size=c.conv_group_size,
                      selector_rank=c.selector_rank, selector_top_k=c.selector_top_k)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_specforge_dspark(drafter, folder: Path, *, legacy_prefix: bool = False) -> Path:
    """SpecForge's DSpark export: the reference config with its DSpark keys in dflash_config, the DFlash body under
    the reference names, the Markov and confidence heads (under `logit_head.` in its early checkpoints)."""
    write_zlab(drafter, folder, architecture="DSparkDraftModel")
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"].update(projector_type="dspark", attention_mode="gqa", markov_rank=8,
                                   markov_head_type="vanilla", enable_confidence_head=True,
                                   confidence_head_with_markov=True, confidence_head_alpha=1.0)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {RELEASED_NAMES.get(k, k): v.detach().clone().contiguous() for k, v in drafter.state_dict().items()}
    tensors.update(markov_heads(drafter.config, prefix="logit_head." if legacy_prefix else ""))
    save_file(tensors, folder / "model.safetensors")
    return folder


def same_weights(ours, theirs) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name].float(), b[name].float()), name


def drafts(target, drafter, prompts, max_new_tokens=24, block_size=None):
    decoder = SpeculativeDecoder(target, drafter, block_size=block_size)
    return [(out.tokens, out.acceptance_lengths)
            for out in (decoder.generate(p, SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts)]


@torch.no_grad()
def first_drafts(target, drafter, reference, prompts, block_size: int) -> tuple[list, list]:
    """The drafts of one block after each prompt and anchor, by our drafter (its selector walk for DFlash 2) and by
    the reference model (argmax of its logits, as its DFlash v1 `dflash_generate` drafts), on the target's taps."""
    from trainer.drafter.model import DrafterCache

    ours, theirs = [], []
    taps = list(drafter.config.target_layer_ids)
    for prompt in prompts:
        _, hidden = target.forward(torch.tensor([prompt]), tap_layer_ids=taps)
        n = len(prompt)
        for anchor in (prompt[-1], 7, 40, 200):
            block_ids = torch.tensor([[anchor] + [drafter.config.mask_token_id] * (block_size - 1)])
            noise = drafter.embed_block(block_ids, target.embedding_weight)
            mine = drafter(noise, torch.arange(n, n + block_size)[None], hidden, torch.arange(n)[None],
                           cache=DrafterCache(len(drafter.layers)))[:, 1:]
            logits = target.lm_head(mine)
            ours.append((drafter.propose(mine, logits, block_ids[:, 0], 0.0)[0] if drafter.candidate_selector
                         is not None else logits.argmax(-1)).tolist())
            other = reference(target_hidden=hidden, noise_embedding=noise,
                              position_ids=torch.arange(n + block_size)[None])[:, 1:]
            theirs.append(reference.compute_logits(other, target.lm_head).argmax(-1).tolist())
    return ours, theirs


@pytest.fixture(scope="module")
def prompts(tiny_qwen3):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(6, tiny_qwen3.vocab_size, (n,), generator=generator).tolist() for n in (3, 9, 17)]


# --- recognised by content, every tensor mapped ----------------------------------------------------------------


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_a_zlab_parent_drafts_the_reference_packages_own_tokens(tiny_qwen3, variant, tmp_path, reference_dflash,
                                                                prompts):
    drafter = random_drafter(tiny_qwen3, variant, block_size=4)
    folder = write_zlab(drafter, tmp_path / "speculators-dspark")  # a misleading name: content decides
    imported = import_drafter(folder, num_target_layers=tiny_qwen3.num_layers)
    assert (imported.origin.format, imported.origin.variant, imported.origin.dropped_tensors) == ("z-lab", variant, [])
    same_weights(imported.drafter, drafter)
    reference = getattr(reference_dflash, REFERENCE_CLASSES[variant]).from_pretrained(folder, dtype=torch.float32).eval()
    if variant == "dflash":
        ours_drafts, their_drafts = first_drafts(tiny_qwen3, imported.drafter, reference, prompts, 4)
        assert ours_drafts == their_drafts
    for prompt, (tokens, lengths) in zip(prompts, drafts(tiny_qwen3, imported.drafter, prompts, 30), strict=True):
        theirs = reference_dflash.dflash_generate(reference, tiny_qwen3.model, torch.tensor([prompt]), 30,
                                                  tiny_qwen3.stop_token_ids(), return_stats=True)
        assert tokens == theirs.output_ids[0, len(prompt):].tolist()
        assert lengths == theirs.acceptance_lengths


def test_a_dflash2_parent_under_the_v1_architecture_name_is_read_by_its_tensors(tiny_qwen3, tmp_path):
    drafter = random_drafter(tiny_qwen3, "dflash2")
    folder = write_zlab(drafter, tmp_path / "dflash", architecture="DFlashDraftModel", widths_in_config=False)
    parent = read_parent(folder)
    assert parent.config.variant == "dflash2" and parent.origin.architecture == "DFlashDraftModel"
    assert (parent.config.conv_kernel_size, parent.config.conv_group_size, parent.config.selector_rank) == (
        drafter.config.conv_kernel_size, drafter.config.conv_group_size, drafter.config.selector_rank)
    assert any("selector_top_k is not recorded" in note for note in parent.origin.notes)
    same_weights(load_drafter(folder), drafter.float())


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_a_speculators_parent_loads_with_its_taps_and_the_verifiers_copies_dropped(tiny_qwen3, variant, tmp_path,
                                                                                   prompts):
    drafter = random_drafter(tiny_qwen3, variant, block_size=4)
    folder = write_speculators(drafter, tiny_qwen3, tmp_path / "z-lab-release")
    imported = import_drafter(folder, num_target_layers=tiny_qwen3.num_layers)
    assert (imported.origin.format, imported.origin.variant) == ("speculators", variant)
    assert imported.drafter.config.target_layer_ids == drafter.config.target_layer_ids  # aux ids - 1
    assert imported.drafter.config.num_target_layers == tiny_qwen3.num_layers
    assert [d.split(":")[0] for d in imported.origin.dropped_tensors] == ["embed_tokens.weight", "lm_head.weight"]
    same_weights(imported.drafter, drafter)
    assert drafts(tiny_qwen3, imported.drafter, prompts) == drafts(tiny_qwen3, drafter, prompts)


def test_a_speculators_draft_vocabulary_maps_its_ids_and_codebook_rows(tiny_qwen3, tmp_path, prompts):
    drafter = random_drafter(tiny_qwen3, "dflash2", block_size=4)
    draft_ids = torch.arange(6, tiny_qwen3.vocab_size, 2)
    with torch.no_grad():  # the rows outside the draft vocabulary are ones training never touches: zero
        outside = torch.ones(tiny_qwen3.vocab_size, dtype=torch.bool)
        outside[draft_ids] = False
        drafter.candidate_selector.predecessor_codebook.weight[outside] = 0
        drafter.candidate_selector.successor_codebook.weight[outside] = 0
    drafter.draft_vocab = draft_ids
    folder = write_speculators(drafter, tiny_qwen3, tmp_path / "parent", draft_ids=draft_ids,
                               codebooks_over_draft_vocab=True)
    imported = import_drafter(folder, num_target_layers=tiny_qwen3.num_layers)
    assert torch.equal(imported.drafter.draft_vocab, draft_ids)
    assert imported.drafter.config.draft_vocab_size == len(draft_ids)
    assert any("one row per draft token" in note for note in imported.origin.notes)
    same_weights(imported.drafter, drafter)
    assert drafts(tiny_qwen3, imported.drafter, prompts) == drafts(tiny_qwen3, drafter, prompts)


@pytest.mark.parametrize("writer", ["speculators", "specforge", "specforge-legacy"])
def test_a_dspark_parent_gives_its_backbone_and_names_the_heads_it_drops(tiny_qwen3, writer, tmp_path):
    drafter = random_drafter(tiny_qwen3, "dflash")
    folder = (write_speculators(drafter, tiny_qwen3, tmp_path / "p", kind="dspark", sample_from_anchor=True)
              if writer == "speculators"
              else write_specforge_dspark(drafter, tmp_path / "p", legacy_prefix=writer.endswith("legacy")))
    imported = import_drafter(folder, num_target_layers=tiny_qwen3.num_layers)
    assert imported.origin.variant == "dspark"
    assert imported.origin.format == writer.removesuffix("-legacy")
    prefix = "logit_head." if writer.endswith("legacy") else ""
    dropped = {line.split(":")[0]: line for line in imported.origin.dropped_tensors}
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                 "confidence_head.proj.bias"):
        assert prefix + name in dropped
    assert "Markov head" in dropped[f"{prefix}markov_head.markov_w1.weight"]
    assert "confidence head" in dropped[f"{prefix}confidence_head.proj.bias"]
    same_weights(imported.drafter, drafter)
    # speculators' DSpark default predicts from the anchor, one position ahead of our blocks: said, not hidden.
    assert any("sample_from_anchor" in note for note in imported.origin.notes) == (writer == "speculators")


def test_a_tensor_with_no_place_or_a_missing_part_is_an_error_naming_it(tiny_qwen3, tmp_path):
    drafter = random_drafter(tiny_qwen3, "dflash2")
    folder = write_zlab(drafter, tmp_path / "extra")
    tensors = {RELEASED_NAMES.get(k, k): v for k, v in drafter.state_dict().items()}
    save_file({**tensors, "layers.0.self_attn.g_proj.weight": torch.zeros(2, 64)}, folder / "model.safetensors")
    with pytest.raises(DrafterFormatError, match=r"layers\.0\.self_attn\.g_proj\.weight"):
        load_drafter(folder)
    del tensors["layers.1.mlp_conv.base_kernel"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(DrafterFormatError, match=r"lacks 1 tensors our drafter needs: layers\.1\.mlp_conv\.base_kernel"):
        load_drafter(folder)


def test_a_pickle_only_parent_is_refused_unread(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {}}))
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle: it must never be opened")
    with pytest.raises(DrafterFormatError, match=r"only pickled weights \(pytorch_model\.bin\).*safetensors only"):
        load_drafter(folder)


def test_a_folder_of_no_known_format_is_refused(tiny_qwen3, tmp_path):
    folder = write_zlab(random_drafter(tiny_qwen3, "dflash"), tmp_path / "p")
    config = json.loads((folder / "config.json").read_text())
    for key in ("dflash_config", "num_target_layers"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterFormatError, match="neither dflash_config .* nor speculators_config"):
        read_parent(folder)


def test_what_our_drafter_computes_differently_is_refused_or_said(tiny_qwen3, tmp_path):
    """Another MLP activation (speculators' --draft-hidden-act) or sliding-window layers would draft other tokens:
    refused, naming them. A RoPE scaling only moves long-range positions: imported, with a note."""
    folder = write_zlab(random_drafter(tiny_qwen3, "dflash"), tmp_path / "p")
    config = json.loads((folder / "config.json").read_text())
    for change, message in (({"hidden_act": "gelu"}, "hidden_act gelu"),
                            ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_attention")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(DrafterFormatError, match=message):
            read_parent(folder)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    (folder / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    assert any("yarn RoPE scaling" in note for note in read_parent(folder).origin.notes)


# --- upgrades instead of refusals ------------------------------------------------------------------------------


def job_shape(target, parent, **changes) -> DrafterConfig:
    """The job's shape as prepare builds it for `target`: the parent's mask token and taps unless changed."""
    shape = DrafterConfig.for_target(target, variant="dflash2", num_layers=parent.config.num_layers,
                                     block_size=parent.config.block_size, mask_token_id=parent.config.mask_token_id,
                                     target_layer_ids=list(parent.config.target_layer_ids))
    return shape.replace(**changes)


def test_a_dflash_parent_upgraded_to_dflash2_drafts_exactly_the_parents_tokens(tiny_qwen3, tmp_path,
                                                                              reference_dflash, prompts):
    parent = random_drafter(tiny_qwen3, "dflash", block_size=4)
    folder = write_zlab(parent, tmp_path / "v1")
    torch.manual_seed(0)
    started = start_from_parent(job_shape(tiny_qwen3, parent), str(folder))
    upgraded = started.drafter.eval()
    assert upgraded.config.variant == "dflash2" and upgraded.candidate_selector is not None
    assert started.origin.upgrades and started.origin.upgrades[0].startswith("DFlash to DFlash 2")
    # The parent as the reference package runs it, DFlash v1 from its own folder, against the upgraded drafter:
    # block by block, the same draft tokens (the selector's walk is the parent's argmax) ...
    reference = reference_dflash.DFlashDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    ours_drafts, their_drafts = first_drafts(tiny_qwen3, upgraded, reference, prompts, 4)
    assert ours_drafts == their_drafts
    with torch.no_grad():  # the comparison has power: a selector that is no longer neutral drafts otherwise
        trained_like = start_from_parent(job_shape(tiny_qwen3, parent), str(folder)).drafter.eval()
        trained_like.candidate_selector.successor_codebook.weight.normal_(std=10.0)
    assert first_drafts(tiny_qwen3, trained_like, reference, prompts, 4)[0] != their_drafts
    # ... and so, decoding, the same tokens and acceptance lengths as its `dflash_generate`.
    ours = drafts(tiny_qwen3, upgraded, prompts, 30)
    for prompt, (tokens, lengths) in zip(prompts, ours, strict=True):
        theirs = reference_dflash.dflash_generate(reference, tiny_qwen3.model, torch.tensor([prompt]), 30,
                                                  tiny_qwen3.stop_token_ids(), return_stats=True)
        assert tokens == theirs.output_ids[0, len(prompt):].tolist()
        assert lengths == theirs.acceptance_lengths


def test_a_different_block_size_and_named_taps_are_mapped(tiny_qwen3, tmp_path, prompts):
    parent = random_drafter(tiny_qwen3, "dflash2", block_size=8)
    folder = write_zlab(parent, tmp_path / "p")
    started = start_from_parent(job_shape(tiny_qwen3, parent, block_size=4), str(folder))
    assert any(line.startswith("block size 8 to 4") for line in started.origin.upgrades)
    # No weight depends on the block size: at 4, the upgraded drafter drafts what the parent drafts at 4.
    same_weights(started.drafter, parent)
    assert drafts(tiny_qwen3, started.drafter, prompts) == drafts(tiny_qwen3, parent, prompts, block_size=4)

    taps = parent.config.target_layer_ids
    named = (taps[0], taps[2], tiny_qwen3.num_layers - 1)  # keeps two, drops one, adds one
    moved = start_from_parent(job_shape(tiny_qwen3, parent, target_layer_ids=named), str(folder))
    hidden = parent.config.hidden_size
    fc = moved.drafter.fc.weight
    assert torch.equal(fc[:, :hidden], parent.fc.weight[:, :hidden])
    assert torch.equal(fc[:, hidden:2 * hidden], parent.fc.weight[:, 2 * hidden:3 * hidden])
    assert not fc[:, 2 * hidden:].any()
    assert any(f"[{named[2]}] start unread" in line and f"[{taps[1]}] no longer read" in line
               for line in moved.origin.upgrades)


@pytest.mark.parametrize("change,message", [
    ({"num_layers": 3}, r"num_layers is 2 in the parent but 3 here \(set drafter\.num_layers to 2"),
    ({"mask_token_id": 7}, r"mask_token_id is \d+ in the parent but 7 here \(set drafter\.mask_token_id"),
    ({"variant": "dflash"}, r"variant is 'dflash2' in the parent but 'dflash' here \(set drafter\.variant to "
                            r"'dflash2'"),
    ({"hidden_size": 32, "conv_group_size": 16}, r"hidden_size is 64 in the parent but 32 here \(the parent drafts "
                                                 r"for another target: give the base model's own drafter in "
                                                 r"init\.from_drafter"),
])
def test_what_no_upgrade_bridges_is_refused_naming_the_field(tiny_qwen3, change, message):
    parent = random_drafter(tiny_qwen3, "dflash2")
    with pytest.raises(IncompatibleDrafter, match=message):
        check_warm_start(parent.config, job_shape(tiny_qwen3, parent, **change), "parent/")


def test_a_parent_tapping_layers_the_target_lacks_is_refused_at_prepare(tiny_qwen3, tmp_path):
    from tiny_targets import make_tiny_target

    from trainer.pipeline import Layout, RunConfig, run_stage

    parent = random_drafter(tiny_qwen3, "dflash")  # taps up to layer 3 of a 6-layer target
    folder = write_speculators(parent, tiny_qwen3, tmp_path / "parent")
    shallow = make_tiny_target(tmp_path / "shallow", "qwen3", num_layers=3)
    config = RunConfig(target=str(shallow), prompts=str(write_prompts(tmp_path / "prompts.jsonl", n=8)),
                       variant="dflash2", num_layers=2, block_size=4, train=TrainConfig(init=f"drafter:{folder}"))
    layout = Layout.under(tmp_path / "work", tmp_path / "out")
    with pytest.raises(IncompatibleDrafter, match=r"tap layers \[\d+\] this 3-layer target lacks \(set "
                                                  r"drafter\.target_layer_ids to taps below 3"):
        run_stage("prepare", config, layout)
    assert not layout.prepared.exists()


def test_prepare_records_an_imported_parents_origin_and_keeps_its_taps(tiny_qwen3, tmp_path):
    from trainer.pipeline import Layout, RunConfig, run_stage

    parent = random_drafter(tiny_qwen3, "dflash", block_size=8)
    folder = write_speculators(parent, tiny_qwen3, tmp_path / "parent", kind="dspark")
    config = RunConfig(target=str(tiny_qwen3.path), prompts=str(write_prompts(tmp_path / "prompts.jsonl", n=8)),
                       variant="dflash2", num_layers=2, block_size=4, train=TrainConfig(init=f"drafter:{folder}"))
    layout = Layout.under(tmp_path / "work", tmp_path / "out")
    run_stage("prepare", config, layout)
    prepared = PreparedTarget.load(layout.prepared)
    assert prepared.tap_layer_ids == list(parent.config.target_layer_ids)
    assert prepared.mask_token_id == parent.config.mask_token_id
    origin = prepared.parent_drafter.origin
    assert (origin.format, origin.variant) == ("speculators", "dspark")
    assert any(line.startswith("markov_head.markov_w1.weight: DSpark's Markov head") for line in origin.dropped_tensors)
    assert origin.upgrades[:2] == ["DFlash to DFlash 2: identity convolutions and an argmax selector, so its first "
                                   "drafts are the parent's", "block size 8 to 4 (no weight depends on it)"]
    # The trainer's first drafter is that parent, upgraded.
    shape = job_shape(tiny_qwen3, parent, block_size=4)
    start = warm_start_drafter(shape, str(folder))
    for name, tensor in parent.state_dict().items():
        assert torch.equal(start.state_dict()[name], tensor.float()), name


def test_the_parent_comparison_measures_a_parent_in_speculators_format(tiny_qwen3, tmp_path):
    """compare_with_parent (validation's before/after and the audit) reads a parent whose format does not record
    its target's depth: the target's own is taken, and its taps fit."""
    from trainer.audit import compare_with_parent
    from trainer.data.prompts import load_prompts

    parent = random_drafter(tiny_qwen3, "dflash2", block_size=4)
    folder = write_speculators(parent, tiny_qwen3, tmp_path / "parent", kind="dspark")
    prompts = load_prompts(write_prompts(tmp_path / "prompts.jsonl", n=2))
    measured = compare_with_parent(tiny_qwen3, folder, prompts, SamplingParams(max_new_tokens=8), max_new_tokens=8,
                                   tau=1.0)
    assert 1.0 <= measured["parent_tau"] <= 4.0


def test_a_job_trains_a_dflash2_drafter_from_a_zlab_dflash_parent(tiny_qwen3, tmp_path):
    """End to end through the stages a job runs: prepare records the origin, training starts from the upgraded
    parent and writes a DFlash 2 drafter of the job's block size."""
    from trainer.pipeline import Layout, RunConfig, open_job, run_stage

    parent = random_drafter(tiny_qwen3, "dflash", block_size=8)
    folder = write_zlab(parent, tmp_path / "parent")
    config = RunConfig(target=str(tiny_qwen3.path), sampling=SamplingParams(max_new_tokens=8),
                       prompts=str(write_prompts(tmp_path / "prompts.jsonl", n=8)), holdout=0.25, variant="dflash2",
                       num_layers=2, block_size=4, generation_batch_size=8,
                       train=TrainConfig(init=f"drafter:{folder}", steps=2, batch_size=2, anchors_per_sequence=4,
                                         warmup_steps=1, checkpoint_every=1000))
    layout = Layout.under(tmp_path / "work", tmp_path / "out")
    job = open_job(config, layout)
    for stage in ("prepare", "generate", "train"):
        run_stage(stage, config, layout, job=job)
    origin = PreparedTarget.load(layout.prepared).parent_drafter.origin
    assert (origin.format, origin.variant) == ("z-lab", "dflash")
    assert origin.upgrades[:2] == ["DFlash to DFlash 2: identity convolutions and an argmax selector, so its first "
                                   "drafts are the parent's", "block size 8 to 4 (no weight depends on it)"]
    trained = load_drafter(layout.drafter)
    assert (trained.config.variant, trained.config.block_size) == ("dflash2", 4)
    assert trained.config.target_layer_ids == parent.config.target_layer_ids


def test_draftsmith_run_from_drafter_starts_the_job_from_that_parent(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import trainer.pipeline
    from draftsmith.cli import main as cli

    parent = tmp_path / "published-drafter"
    parent.mkdir()
    seen = {}

    def stop_at_execute(self, resume=False):
        seen["config"] = self.config
        raise SystemExit(0)

    monkeypatch.setattr(trainer.pipeline.Run, "execute", stop_at_execute)
    CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--from-drafter", str(parent),
                             "--out", str(tmp_path / "o")])
    assert seen["config"].train.init == f"drafter:{parent.resolve()}"
    assert seen["config"].train.parent_drafter == str(parent.resolve())
