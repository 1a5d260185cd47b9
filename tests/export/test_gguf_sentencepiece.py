"""Gemma's SentencePiece-style vocabularies in the drafter's GGUF, against llama.cpp's own converter run on the same
drafter and target: Gemma 3's real SentencePiece model (`tokenizer.model`, tokenizer model `llama`), Gemma 3 over a
byte-level BPE vocabulary (`gpt2`, its pre-tokenizer named from the tokenizer's own ids) and Gemma 4's byte-fallback
BPE tokenizer.json (`gemma4`). Every key must be the converter's, in its order, and the files equal
byte for byte; the tokenizer keys are also checked against the SentencePiece model itself, oracle or not."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import sentencepiece
from conftest import GEMMA_CASES
from test_gguf import _diff_kv, parse_gguf

from trainer.errors import TargetError
from trainer.export.gguf_writer import write_gguf


@pytest.mark.parametrize("case", sorted(GEMMA_CASES))
def test_matches_llama_cpp_converter(sentencepiece_env: Path, case: str) -> None:
    official_file = sentencepiece_env / "official" / f"{case}.gguf"
    if not official_file.is_file():
        problem = json.loads((sentencepiece_env / "built.json").read_text())["oracle_problem"]
        pytest.fail(problem or f"llama.cpp's converter produced nothing for {case}")
    ours, official = parse_gguf(sentencepiece_env / "ours" / f"{case}.gguf"), parse_gguf(official_file)
    problems = _diff_kv(ours.kv, official.kv)
    assert not problems, "metadata differs from llama.cpp's converter:\n" + "\n".join(problems)
    assert ours.raw == official.raw


def test_gemma3_vocabulary_is_the_sentencepiece_model(sentencepiece_env: Path) -> None:
    """Independent of the oracle: every piece, score and kind of the model, the added tokens over it, padding to the
    drafter's vocabulary, and the flags llama.cpp's Gemma 3 export sets."""
    kv = parse_gguf(sentencepiece_env / "ours" / "gemma3.gguf", tensor_data=False).kv
    target = sentencepiece_env / "gemma3" / "target"
    processor = sentencepiece.SentencePieceProcessor(model_file=str(target / "tokenizer.model"))
    pieces = processor.vocab_size()
    tokens, scores, types = (kv[f"tokenizer.ggml.{key}"][-1] for key in ("tokens", "scores", "token_type"))
    assert kv["tokenizer.ggml.model"][-1] == "llama" and kv["tokenizer.ggml.pre"][-1] == "default"
    assert len(tokens) == len(scores) == len(types) == 512
    assert tokens[:pieces] == [processor.IdToPiece(i) for i in range(pieces)]
    # ids 0-3 (pad, eos, bos, unk) are named again in tokenizer_config's added tokens: those take score -1000
    assert scores[:pieces] == pytest.approx([-1000.0] * 4 + [processor.GetScore(i) for i in range(4, pieces)])
    T = gguf.TokenType
    assert types[:4] == [T.CONTROL] * 4 and types[processor.PieceToId("<0x41>")] == T.BYTE
    assert types[processor.PieceToId("▁the")] == T.NORMAL
    assert types[processor.PieceToId("<start_of_turn>")] == T.CONTROL
    assert types[processor.PieceToId("<start_of_image>")] == T.NORMAL  # the converter reads no user-defined kind
    # added past the model: flagged special, special by its look (<unused..>), and a plain one
    assert list(zip(tokens[pieces:pieces + 3], types[pieces:pieces + 3])) == [
        ("<image_soft_token>", T.CONTROL), ("<unused0>", T.CONTROL), ("<custom>", T.USER_DEFINED)]
    assert scores[pieces:pieces + 3] == [-1000.0] * 3
    assert tokens[-1] == "[PAD511]" and types[-1] == T.UNUSED and scores[-1] == -10000.0
    assert "tokenizer.ggml.merges" not in kv
    assert (kv["tokenizer.ggml.bos_token_id"][-1], kv["tokenizer.ggml.eos_token_id"][-1]) == (2, 1)
    assert kv["tokenizer.ggml.add_bos_token"][-1] is True and kv["tokenizer.ggml.add_space_prefix"][-1] is False


def test_gemma4_vocabulary_and_flags(sentencepiece_env: Path) -> None:
    from transformers import AutoTokenizer

    kv = parse_gguf(sentencepiece_env / "ours" / "gemma4.gguf", tensor_data=False).kv
    tokenizer = AutoTokenizer.from_pretrained(sentencepiece_env / "gemma4" / "target")
    tokens, types = kv["tokenizer.ggml.tokens"][-1], kv["tokenizer.ggml.token_type"][-1]
    assert kv["tokenizer.ggml.model"][-1] == "gemma4" and "tokenizer.ggml.pre" not in kv
    assert tokens == [tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))]
    T = gguf.TokenType
    kinds = {token: kind for token, kind in zip(tokens, types)}
    assert (kinds["<0x0A>"], kinds["<|turn>"], kinds["<|channel>"], kinds["<custom>"], kinds["▁t"]) == (
        T.BYTE, T.CONTROL, T.USER_DEFINED, T.USER_DEFINED, T.NORMAL)
    assert "▁t he" in kv["tokenizer.ggml.merges"][-1]
    assert kv["tokenizer.ggml.add_bos_token"][-1] is True and kv["tokenizer.ggml.add_space_prefix"][-1] is False


def test_gemma3_without_a_sentencepiece_model_is_named_by_its_tokenizer(sentencepiece_env: Path) -> None:
    kv = parse_gguf(sentencepiece_env / "ours" / "gemma3_bpe.gguf", tensor_data=False).kv
    assert (kv["tokenizer.ggml.model"][-1], kv["tokenizer.ggml.pre"][-1]) == ("gpt2", "smollm")
    assert "tokenizer.ggml.scores" not in kv and kv["tokenizer.ggml.merges"][-1]


def test_a_llama_sentencepiece_vocabulary_is_still_refused(sentencepiece_env: Path, tmp_path: Path) -> None:
    """Only Gemma's SentencePiece exports are written; a Llama with a tokenizer.model is told to use the converter."""
    import shutil

    target = tmp_path / "target"
    shutil.copytree(sentencepiece_env / "gemma3" / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(TargetError, match="tokenizer.json"):
        write_gguf(sentencepiece_env / "gemma3" / "drafter", target, tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()
