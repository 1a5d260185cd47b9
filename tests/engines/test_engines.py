"""The exported folders load in the real engines as exported, and greedy speculative output in each engine equals
that engine's target alone, token for token.

Each test is skipped, with the reason, when its engine is not installed (bench/setup/llama_cpp.sh,
bench/setup/vllm_cpu.sh; CI installs neither: vLLM alone would push the suite past its 20 minutes). The drafter is
a random one with a draft vocabulary on the real SmolLM2-135M-Instruct: drafts are mostly rejected, which is
exactly when a wrong verify would show, and the files are the ones `export_artifacts` writes.
"""

from __future__ import annotations

import pytest
import torch
from drafters import random_drafter

from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import save_drafter
from trainer.drafter.draft_vocab import save_draft_vocab
from trainer.export.artifacts import export_artifacts
from trainer.speculative import SpeculativeDecoder
from trainer.targets.chat import render_prompt
from trainer.validation import engine_paths
from trainer.validation.engines import run_engines

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 24
PROMPTS = ["Write a haiku about rain.", "List three prime numbers."]


def _export(target, variant: str, root):
    drafter = random_drafter(target, variant, block_size=8, num_layers=1, scale=0.02)
    ids = torch.tensor(sorted(set(range(4096)) | set(target.stop_token_ids())))
    drafter.config = drafter.config.replace(draft_vocab_size=len(ids))
    save_drafter(drafter, root / "trained")
    save_draft_vocab(ids, target.vocab_size, root / "trained")
    export_artifacts(root / "trained", target, root / "export")
    return root / "export"


@pytest.fixture(scope="module")
def prompts(smollm2):
    rendered = [render_prompt(smollm2.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS)
    return rendered, [SpeculativeDecoder(smollm2).generate(ids, greedy).tokens for ids in rendered]


def _lossless_in_engine(section: dict, engine: str) -> list[dict]:
    rows = [r for r in section["rows"] if r["engine"] == engine]
    assert rows, section
    for row in rows:
        assert "error" not in row and "refused" not in row, row
        if row["spec"] != "none":  # every drafted run, and the n-gram baseline, against the same engine alone
            equal = row["greedy_equals_engine_target"]
            assert equal["equal"] == equal["of"] == len(PROMPTS), row
            assert row["tau"] is None or row["tau"] >= 1.0
    return rows


def test_llama_cpp_loads_both_exported_ggufs_and_stays_lossless(smollm2, prompts, tmp_path):
    if engine_paths.llama_cpp_bin() is None:
        pytest.skip(engine_paths.missing("llama.cpp"))
    export = _export(smollm2, "dflash2", tmp_path)
    rendered, reference = prompts
    section = run_engines(smollm2, export / "drafter", rendered, reference, work_dir=tmp_path / "work",
                          engines=("llama.cpp",), max_new_tokens=MAX_NEW_TOKENS, export_dir=export,
                          llama_targets=("quantised",), draft_lengths=(3,), p_mins=(0.0,))
    rows = _lossless_in_engine(section, "llama.cpp")
    drafted = {r["drafter"] for r in rows if r["spec"] == "draft-dflash"}
    assert drafted == {"drafter-q8_0-d2t.gguf", "drafter-q8_0.gguf"}  # both exported files load and draft
    assert any("-md ./gguf/drafter-q8_0-d2t.gguf --spec-type draft-dflash" in r["command"] for r in rows)


def test_vllm_loads_the_dflash_export_and_refuses_dflash2_on_cpu(smollm2, prompts, tmp_path):
    if engine_paths.vllm_python() is None:
        pytest.skip(engine_paths.missing("vllm"))
    rendered, reference = prompts
    export = _export(smollm2, "dflash", tmp_path / "v1")
    section = run_engines(smollm2, export / "drafter", rendered, reference, work_dir=tmp_path / "work1",
                          engines=("vllm",), max_new_tokens=MAX_NEW_TOKENS, export_dir=export)
    rows = _lossless_in_engine(section, "vllm")
    drafted = next(r for r in rows if r["spec"] == "dflash")
    assert drafted["drafter"] == "drafter-d2t" and '"model": "./drafter-d2t"' in drafted["command"]
    assert drafted["tau"] >= 1.0

    export2 = _export(smollm2, "dflash2", tmp_path / "v2")
    section2 = run_engines(smollm2, export2 / "drafter", rendered, reference, work_dir=tmp_path / "work2",
                           engines=("vllm",), max_new_tokens=MAX_NEW_TOKENS, export_dir=export2, vllm_baselines=False)
    refused = next(r for r in section2["rows"] if r["name"].startswith("dflash"))
    assert "DFlash candidate-head drafts" in refused["refused"]
