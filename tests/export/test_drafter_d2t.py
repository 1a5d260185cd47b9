"""The exported folders as vLLM reads them (cheap, always run; loading them in real engines is tests/engines/).

What vLLM 0.32's DFlash loader does with a folder (qwen3_dflash.py, read in the installed wheel): it loads every
`*.safetensors` in it; it creates `draft_id_to_target_id` only when `draft_vocab_size` is a top-level config key
differing from the target's vocabulary, and then its `lm_head` has `draft_vocab_size` rows; `load_weights` renames
`d2t` to `draft_id_to_target_id`, skips `t2d`, and prefixes every other name but `lm_head` with `model.`;
`compute_logits` scatters the draft logits to `arange(draft_vocab_size) + d2t`. These tests hold the export to
exactly that, and `drafter/` to the reference format with nothing extra.
"""

from __future__ import annotations

import json

import pytest
import torch
from drafters import random_drafter
from safetensors.torch import load_file

from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import ids_from_d2t, load_drafter, save_drafter
from trainer.drafter.draft_vocab import save_draft_vocab
from trainer.errors import DrafterError
from trainer.export.artifacts import write_engine_drafters
from trainer.speculative import SpeculativeDecoder

DRAFT_IDS = torch.tensor([0, 1, 2, 5, 9, 17, 33, 40, 64, 100, 101, 102, 150, 200, 201, 202, 203, 230, 250, 255])


@pytest.fixture
def exported(tiny_qwen3, tmp_path):
    drafter = random_drafter(tiny_qwen3, "dflash", block_size=4)
    drafter.config = drafter.config.replace(draft_vocab_size=len(DRAFT_IDS))
    save_drafter(drafter, tmp_path / "trained")
    save_draft_vocab(DRAFT_IDS, tiny_qwen3.vocab_size, tmp_path / "trained")
    write_engine_drafters(tmp_path / "trained", DRAFT_IDS, tiny_qwen3, tmp_path / "out", ggufs=())
    return tmp_path / "out", drafter


def test_vllm_layout_of_the_draft_vocabulary(tiny_qwen3, exported, monkeypatch):
    out, drafter = exported
    config = json.loads((out / "drafter-d2t" / "config.json").read_text())
    assert config["draft_vocab_size"] == len(DRAFT_IDS) != config["vocab_size"]  # top level: vLLM makes its d2t
    assert config["architectures"] == ["DFlashDraftModel"] and "dflash_config" in config
    assert sorted(p.name for p in (out / "drafter-d2t").iterdir()) == ["config.json", "model.safetensors"]
    tensors = load_file(str(out / "drafter-d2t" / "model.safetensors"))
    reference = load_file(str(out / "drafter" / "model.safetensors"))
    assert set(tensors) == set(reference) | {"d2t", "lm_head.weight"}
    assert all(torch.equal(tensors[name], reference[name]) for name in reference)
    d2t = tensors["d2t"]
    assert d2t.dtype == torch.int64 and d2t.shape == (len(DRAFT_IDS),)
    targets = torch.arange(len(d2t)) + d2t  # vLLM's compute_logits
    assert torch.equal(targets, DRAFT_IDS)
    assert torch.equal(tensors["lm_head.weight"], tiny_qwen3.lm_head.weight.detach()[DRAFT_IDS].float())


def test_reference_folder_has_nothing_but_the_weights(exported):
    out, drafter = exported
    assert sorted(p.name for p in (out / "drafter").iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert "draft_vocab_size" not in config and "draft_vocab_size" not in config.get("draftsmith", {})
    names = set(load_file(str(out / "drafter" / "model.safetensors")))
    assert names == set(drafter.state_dict())  # no d2t, t2d or head: nothing vLLM would call unknown


def test_our_decoder_reads_both_folders_and_drafts_the_same(tiny_qwen3, exported):
    out, drafter = exported
    trained, d2t_folder = load_drafter(out.parent / "trained"), load_drafter(out / "drafter-d2t")
    assert torch.equal(d2t_folder.draft_vocab, DRAFT_IDS) and load_drafter(out / "drafter").draft_vocab is None
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    a = SpeculativeDecoder(tiny_qwen3, trained, record_candidates=True).generate([7, 8, 9], greedy)
    b = SpeculativeDecoder(tiny_qwen3, d2t_folder, record_candidates=True).generate([7, 8, 9], greedy)
    assert a.tokens == b.tokens and a.cycles == b.cycles


def test_a_d2t_that_is_not_a_sorted_map_is_refused():
    assert ids_from_d2t(torch.tensor([3, 3, 5]), 10, "x").tolist() == [3, 4, 7]
    with pytest.raises(DrafterError, match="d2t does not map"):
        ids_from_d2t(torch.tensor([3, 2, 5]), 10, "x")  # ids 3, 3, 7: a duplicate
    with pytest.raises(DrafterError, match="below 10"):
        ids_from_d2t(torch.tensor([3, 3, 9]), 10, "x")  # id 11
