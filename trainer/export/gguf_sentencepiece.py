"""SentencePiece-style vocabularies in a DFlash GGUF, written the way llama.cpp's converter writes them.

llama.cpp's DFlash converter runs the target architecture's own vocab export. Gemma 3 with a `tokenizer.model`
is a SentencePiece (`llama`) vocabulary: every piece of the model with its score and kind, sized to the
drafter's vocab_size (ids past the model are `[PADi]`, UNUSED, score -10000), the added tokens of
added_tokens.json and tokenizer_config.json over them (score -1000), pre-tokenizer `default`, no merges, and no
space prefix. Gemma 4 is the HF tokenizer's byte-fallback BPE table under the tokenizer model `gemma4`: base
tokens then added ones (score -1000; byte tokens `<0xNN>` BYTE, special ones CONTROL, a few chat-parser tokens
USER_DEFINED so they render), with merges, no space prefix and BOS added. Gemma 3 without a `tokenizer.model`
takes the byte-level BPE path (gguf_tokenizer.py), as the converter does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf

from trainer.errors import DrafterError, TargetError

SENTENCEPIECE_FAMILY = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}
GEMMA4_FAMILY = {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"}
T = gguf.TokenType
# Gemma 4's chat parser reads these out of the text, so llama.cpp keeps them visible (USER_DEFINED).
_GEMMA4_VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                   "<tool_response|>", '<|"|>'}
_ADDED_SCORE, _PAD_SCORE = -1000.0, -10000.0


def sentencepiece_vocab(target_dir: Path, vocab_size: int | None) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and llama.cpp token types by id, from the target's `tokenizer.model`, `vocab_size` long
    (the drafter's; the model's own size when None)."""
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor()
    processor.LoadFromFile(str(target_dir / "tokenizer.model"))
    size = vocab_size if vocab_size is not None else processor.vocab_size()
    if processor.vocab_size() > size:
        raise DrafterError(f"the target tokenizer has {processor.vocab_size()} pieces but the drafter's vocab_size "
                           f"is {size}: the drafter was not made for this target")
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = [_PAD_SCORE] * size
    types = [int(T.UNUSED)] * size
    for i in range(processor.vocab_size()):
        tokens[i], scores[i], types[i] = processor.IdToPiece(i), processor.GetScore(i), int(_piece_type(processor, i))
    added = read_json(target_dir / "added_tokens.json")
    for token, i in added.items():
        if i < size:
            tokens[i], scores[i], types[i] = token, _ADDED_SCORE, int(T.USER_DEFINED)
    decoder = read_json(target_dir / "tokenizer_config.json").get("added_tokens_decoder", {})
    for key, entry in decoder.items():
        if (i := int(key)) >= size:
            continue
        token = entry["content"]
        if entry.get("special") or looks_special(token):
            types[i] = int(T.CONTROL)
        else:  # llama.cpp stores user-defined tokens with their spaces already normalised
            token = token.replace("\u2581", " ")
            types[i] = int(T.USER_DEFINED)
        tokens[i], scores[i] = token, _ADDED_SCORE
    return tokens, scores, types


def _piece_type(processor: Any, i: int) -> gguf.TokenType:
    if processor.IsUnknown(i):
        return T.UNKNOWN
    if processor.IsControl(i):
        return T.CONTROL
    if processor.IsUnused(i):
        return T.UNUSED
    return T.BYTE if processor.IsByte(i) else T.NORMAL


def gemma4_vocab(target_dir: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of Gemma 4's byte-fallback BPE tokenizer.json, in llama.cpp's order: the
    base vocabulary by id (added tokens inside it skipped), then the added tokens past it by id."""
    from transformers import AutoTokenizer

    tokenizer_json = json.loads((target_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback") or \
            (tokenizer_json.get("decoder") or {}).get("type") != "Sequence":
        raise TargetError(f"{target_dir}: a Gemma 4 tokenizer.json is byte-fallback BPE with a Sequence decoder "
                          "(what llama.cpp's converter reads); this one is not: convert the drafter with "
                          "llama.cpp's convert_hf_to_gguf.py")
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    vocab = tokenizer.get_vocab()
    base_size = tokenizer.vocab_size
    added = sorted(((i, token) for token, i in tokenizer.get_added_vocab().items() if i >= base_size))
    added_ids = {i for i, _ in added}
    special_ids = set(tokenizer.all_special_ids)
    specials = {token: vocab[token] for token in tokenizer.all_special_tokens}
    by_id = {i: token for token, i in vocab.items()}
    entries = [(by_id[i], _hf_type(i, by_id[i], special_ids)) for i in range(base_size) if i not in added_ids]
    entries += [(token, _hf_type(specials[token], "", special_ids) if token in specials else T.USER_DEFINED)
                for _, token in added]
    tokens = [token for token, _ in entries]
    types = [int(T.USER_DEFINED if token in _GEMMA4_VISIBLE else kind) for token, kind in entries]
    return tokens, [_ADDED_SCORE] * len(tokens), types


def _hf_type(i: int, token: str, special_ids: set[int]) -> gguf.TokenType:
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
        return T.BYTE
    return T.CONTROL if i in special_ids else T.NORMAL


def looks_special(token: str) -> bool:
    """Added tokens llama.cpp marks CONTROL even when the tokenizer does not flag them special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
