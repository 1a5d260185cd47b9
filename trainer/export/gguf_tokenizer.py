"""The target tokenizer's part of a DFlash GGUF, written the way llama.cpp's converter writes it.

llama.cpp's DFlash converter takes the vocabulary from the target model directory and runs the
target architecture's own vocab export. For byte-level BPE tokenizers (the `gpt2` tokenizer model
in llama.cpp terms) that is: the token table from the HF tokenizer, the pre-tokenizer name found
by hashing the tokenizer's own token ids for a probe text (never the model type), and gguf-py's
SpecialVocab rules for merges, special ids, add-BOS/EOS flags and chat templates. Gemma's
SentencePiece-style vocabularies (the `llama` and `gemma4` tokenizer models) take their token table
from gguf_sentencepiece.py and the same SpecialVocab rules. Other SentencePiece vocabularies (a
Llama-family `tokenizer.model`) are refused with an error that points to llama.cpp's converter.
"""

from __future__ import annotations

import functools
import re
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf

from trainer.errors import DrafterError, TargetError
from trainer.export.gguf_sentencepiece import (
    GEMMA4_FAMILY,
    SENTENCEPIECE_FAMILY,
    gemma4_vocab,
    looks_special,
    read_json,
    sentencepiece_vocab,
)

if TYPE_CHECKING:
    from trainer.export.gguf_writer import OrderedMetadata

V = gguf.GGUFValueType

# llama.cpp names a BPE pre-tokenizer by hashing the token ids its tokenizer gives for this probe
# text (convert_hf_to_gguf_update.py); the text must stay byte-identical for the hashes to match.
PRE_TOKENIZER_PROBE = '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'  # noqa: E501
# The llama.cpp identifiers of the tokenizer families our targets use (hash -> tokenizer.ggml.pre).
KNOWN_PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3.x
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen 1.5-2.5, 3
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3 (embedding)
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4": "qwen35",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM 1/2
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral Nemo
    "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5": "deepseek-v3",
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",
}
# Target architectures whose vocabulary llama.cpp exports the Llama way (add_space_prefix from
# tokenizer_config, SmolLM's 49152-token vocab without BOS) vs. the plain BPE way.
LLAMA_FAMILY = {"LlamaForCausalLM", "LLaMAForCausalLM", "LlamaModel", "MistralForCausalLM",
                "MixtralForCausalLM"}
BPE_FAMILY = {"Qwen2ForCausalLM", "Qwen2Model", "Qwen3ForCausalLM", "Qwen3Model",
              "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
              "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM",
              "GptOssForCausalLM"} | SENTENCEPIECE_FAMILY  # Gemma 3 without a tokenizer.model: byte-level BPE
_SPECIAL_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                    "sep": "seperator_token_id", "pad": "padding_token_id", "mask": "mask_token_id",
                    "eot": "eot_token_id", "eom": "eom_token_id"}  # `seperator` is llama.cpp's spelling


def add_tokenizer_metadata(kv: OrderedMetadata, hp: dict[str, Any], target_dir: Path, target_arch: str,
                           tokenizer_pre: str | None) -> None:
    """tokenizer.* keys from the target directory, sized to the drafter's vocab_size (`hp`), then the
    drafter's mask token id, exactly where llama.cpp's DFlash converter puts them."""
    target_dir = Path(target_dir)
    for key, value, vtype in _tokenizer_items(target_dir.resolve(), _folder_stamp(target_dir), target_arch,
                                              tokenizer_pre, hp.get("vocab_size")):
        kv.set(key, value, vtype)
    if (mask_id := hp["dflash_config"].get("mask_token_id")) is not None:
        kv.set("tokenizer.ggml.mask_token_id", int(mask_id), V.UINT32)


def _folder_stamp(target_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of every file in the target folder but its weights: a tokenizer
    rewritten in place has another stamp, so `_tokenizer_items` reads it again."""
    return tuple(sorted((path.name, stat.st_size, stat.st_mtime_ns) for path in target_dir.iterdir()
                        if path.is_file() and path.suffix not in (".safetensors", ".bin")
                        for stat in (path.stat(),)))


# One export writes several GGUFs over one target (one per type, and the d2t one); their tokenizer part is the
# same, and building it (a 150k-entry table, the merges, the tokenizer loaded) takes seconds each time.
@functools.lru_cache(maxsize=4)
def _tokenizer_items(target_dir: Path, stamp: tuple, target_arch: str, tokenizer_pre: str | None,
                     drafter_vocab_size: int | None) -> tuple[tuple[str, Any, gguf.GGUFValueType], ...]:
    from transformers import AutoTokenizer

    from trainer.export.gguf_writer import OrderedMetadata  # here: gguf_writer imports this module

    kv = OrderedMetadata()
    tokenizer_json = read_json(target_dir / "tokenizer.json")
    tokenizer_config = read_json(target_dir / "tokenizer_config.json")
    if target_arch in GEMMA4_FAMILY or (target_arch in SENTENCEPIECE_FAMILY
                                        and (target_dir / "tokenizer.model").is_file()):
        _sentencepiece_items(kv, target_dir, target_arch, tokenizer_json, tokenizer_config, drafter_vocab_size)
        return tuple((key, value, vtype) for key, (value, vtype) in kv.items.items())
    model = tokenizer_json.get("model", {})
    # llama.cpp takes SentencePiece files, and byte-fallback BPE of Llama-family targets, as `llama` vocabs
    sentencepiece = (target_dir / "tokenizer.model").is_file() or (
        target_arch in LLAMA_FAMILY and model.get("byte_fallback", False)
        and (tokenizer_json.get("decoder") or {}).get("type") == "Sequence")
    if sentencepiece or model.get("type") != "BPE":
        kind = "SentencePiece-style" if sentencepiece else f"{model.get('type')!r}"
        raise TargetError(f"{target_dir}: the target's tokenizer is {kind}, not byte-level BPE, which is all "
                          "this exporter writes; convert the drafter with llama.cpp's convert_hf_to_gguf.py")
    if target_arch in LLAMA_FAMILY and tokenizer_config.get("add_prefix_space") is not None:
        kv.set("tokenizer.ggml.add_space_prefix", bool(tokenizer_config["add_prefix_space"]), V.BOOL)

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    vocab_size = drafter_vocab_size if drafter_vocab_size is not None else len(tokenizer.vocab)
    if max(tokenizer.vocab.values()) >= vocab_size:
        raise DrafterError(f"the target tokenizer has ids up to {max(tokenizer.vocab.values())} but the "
                           f"drafter's vocab_size is {vocab_size}: the drafter was not made for this target")
    probe_hash = sha256(str(tokenizer.encode(PRE_TOKENIZER_PROBE)).encode()).hexdigest()
    pre = tokenizer_pre or KNOWN_PRE_TOKENIZERS.get(probe_hash)
    if pre is None:
        raise TargetError(f"{target_dir}: BPE pre-tokenizer with probe hash {probe_hash} is unknown; pass "
                          "tokenizer_pre= with the name llama.cpp's convert_hf_to_gguf.py gives this hash")
    tokens, token_types = _token_table(tokenizer, vocab_size)
    kv.set("tokenizer.ggml.model", "gpt2", V.STRING)
    kv.set("tokenizer.ggml.pre", pre, V.STRING)
    kv.set("tokenizer.ggml.tokens", tokens, V.ARRAY)
    kv.set("tokenizer.ggml.token_type", token_types, V.ARRAY)
    _special_vocabulary(kv, target_dir, tokenizer_json, tokenizer_config, merges=True)
    if target_arch in LLAMA_FAMILY and (drafter_vocab_size or 32000) == 49152:
        kv.set("tokenizer.ggml.add_bos_token", False, V.BOOL)  # llama.cpp's rule for SmolLM/Granite vocabs
    return tuple((key, value, vtype) for key, (value, vtype) in kv.items.items())


def _sentencepiece_items(kv: OrderedMetadata, target_dir: Path, target_arch: str, tokenizer_json: dict[str, Any],
                         tokenizer_config: dict[str, Any], drafter_vocab_size: int | None) -> None:
    """Gemma 3's SentencePiece (`llama`) and Gemma 4's (`gemma4`) vocabularies, with the flags llama.cpp's
    converter sets for each after the special vocabulary."""
    gemma4 = target_arch in GEMMA4_FAMILY
    tokens, scores, types = gemma4_vocab(target_dir) if gemma4 else sentencepiece_vocab(target_dir, drafter_vocab_size)
    if gemma4 and drafter_vocab_size is not None and len(tokens) > drafter_vocab_size:
        raise DrafterError(f"the target tokenizer has {len(tokens)} tokens but the drafter's vocab_size is "
                           f"{drafter_vocab_size}: the drafter was not made for this target")
    kv.set("tokenizer.ggml.model", "gemma4" if gemma4 else "llama", V.STRING)
    if not gemma4:  # SentencePiece splits on its own: no pre-tokenizer to name
        kv.set("tokenizer.ggml.pre", "default", V.STRING)
    kv.set("tokenizer.ggml.tokens", tokens, V.ARRAY)
    kv.set("tokenizer.ggml.scores", scores, V.ARRAY)
    kv.set("tokenizer.ggml.token_type", types, V.ARRAY)
    _special_vocabulary(kv, target_dir, tokenizer_json, tokenizer_config, merges=gemma4,
                        n_vocab=None if gemma4 else len(tokens))
    kv.set("tokenizer.ggml.add_space_prefix", False, V.BOOL)
    if gemma4:
        kv.set("tokenizer.ggml.add_bos_token", True, V.BOOL)


def _token_table(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int]]:
    """Token strings and llama.cpp token types by id; ids the tokenizer lacks become [PADi] (UNUSED)."""
    by_id = {i: token for token, i in tokenizer.vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = by_id[i]
        if token not in added:
            types.append(gguf.TokenType.NORMAL)
        else:
            if not decoder[i].normalized:  # llama.cpp expects added tokens in normalized form
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        tokens.append(token)
    return tokens, [int(t) for t in types]


def _special_vocabulary(kv: OrderedMetadata, target_dir: Path, tokenizer_json: dict[str, Any],
                        tokenizer_config: dict[str, Any], *, merges: bool, n_vocab: int | None = None) -> None:
    """Merges (if `merges`), special token ids (under `n_vocab`), add-BOS/EOS/SEP flags, chat template and normalizer
    flags, with the precedence llama.cpp's gguf-py SpecialVocab uses: the tokenizer.json post-processor decides the
    add_* flags before tokenizer_config does; tokenizer_config names the special tokens before config.json's ids."""
    special_types = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
    add: dict[str, bool] = {}
    cfg = dict(tokenizer_config)  # the post-processor may fill in bos/cls/sep/eos names
    bos, cls, eos, sep = (cfg.get(f"{t}_token") for t in ("bos", "cls", "eos", "sep"))
    if not bos and cls and cfg:
        cfg["bos_token"] = bos = cls
    if not eos and sep and cfg:
        cfg["eos_token"] = eos = sep
    post = tokenizer_json.get("post_processor") or {}
    for proc in post.get("processors", [post]) if post else []:
        kind = proc.get("type")
        if kind == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            add.update(bos=True, eos=True, sep=True)
            if not cls and cfg:
                cfg["cls_token"] = cls = proc.get("cls", [bos])[0]
            if not sep and cfg:
                cfg["sep_token"] = sep = proc.get("sep", [eos])[0]
        elif kind == "TemplateProcessing":
            single, pair = proc.get("single", []), proc.get("pair", [])
            first = last = None
            if len(single) > 1:
                if first := single[0].get("SpecialToken", {}).get("id"):
                    if not cfg:
                        bos = first
                    elif first not in (bos, cls):
                        if not bos:
                            cfg["bos_token"] = bos = first
                        if not cls:
                            cfg["cls_token"] = cls = first
                    add["bos"] = first in (bos, cls)
                if last := single[-1].get("SpecialToken", {}).get("id"):
                    if not cfg:
                        eos = last
                    elif last != eos:  # the old EOS becomes end-of-turn (or end-of-message)
                        extra = "eot" if "eot" not in special_types else "eom"
                        if extra not in special_types:
                            special_types.append(extra)
                            cfg[f"{extra}_token"] = eos
                        cfg["eos_token"] = eos = last
                    add["eos"] = last == eos
            start = 1 if first and pair and pair[0].get("SpecialToken", {}).get("id") == first else 0
            stop = -1 if last and pair and pair[-1].get("SpecialToken", {}).get("id") == last else None
            middle = pair[start:stop]
            if (middle and middle[0].get("Sequence", {}).get("id") == "A"
                    and middle[-1].get("Sequence", {}).get("id") == "B" and (middle := middle[1:-1])):
                ids = [m.get("SpecialToken", {}).get("id") for m in middle[:2]]
                add_sep = bool(ids[0] and ids[0] in (sep, eos) and not last)
                add_sep = add_sep or (len(middle) == 2 and bool(ids[1]) and ids[1] in (sep, eos))
                add["sep"] = add_sep
                if add_sep and not sep and cfg:
                    cfg["sep_token"] = eos

    special_ids: dict[str, int] = {}

    def set_special(kind: str, token_id: Any) -> None:
        if isinstance(token_id, int) and not isinstance(token_id, bool) and kind not in special_ids:
            if token_id < 0:
                raise TargetError(f"{target_dir}: negative id {token_id} for the {kind} token")
            if n_vocab is None or token_id < n_vocab:  # SpecialVocab skips ids past the vocabulary
                special_ids[kind] = token_id

    template: Any = None
    if cfg:
        template = cfg.get("chat_template", _chat_template_files(target_dir))
        added_tokens = tokenizer_json.get("added_tokens", [])
        for kind in special_types:
            if isinstance(flag := cfg.get(f"add_{kind}_token"), bool):
                add.setdefault(kind, flag)
            entry = cfg.get(f"{kind}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                set_special(kind, next((t.get("id") for t in added_tokens if t.get("content") == content), None))
    model_config = read_json(target_dir / "config.json")
    text_config = model_config.get("text_config") or {}
    for kind in special_types:
        token_id = model_config.get(f"{kind}_token_id")
        set_special(kind, text_config.get(f"{kind}_token_id") if token_id is None else token_id)

    kv.set("tokenizer.ggml.merges", _merges(target_dir, tokenizer_json) if merges else [], V.ARRAY)  # [] sets none
    for kind, token_id in special_ids.items():
        if kind in _SPECIAL_ID_KEYS:  # llama.cpp has no key for a CLS id
            kv.set(f"tokenizer.ggml.{_SPECIAL_ID_KEYS[kind]}", token_id, V.UINT32)
    for kind, flag in add.items():
        if kind in ("bos", "eos", "sep"):
            kv.set(f"tokenizer.ggml.add_{kind}_token", flag, V.BOOL)
    # Named templates: one key each, their names, then the default. (llama.cpp's converter lists the
    # names from a Python set, so its order varies from run to run; ours keeps the files' order.)
    if isinstance(template, list):
        named = {re.sub(r"[^A-Za-z0-9]", "_", t.get("name", "")): t.get("template") for t in template}
        names = [n for n, text in named.items() if n and n != "default" and text is not None]
        for name in names:
            kv.set(f"tokenizer.chat_template.{name}", named[name], V.STRING)
        kv.set("tokenizer.chat_templates", names, V.ARRAY)
        template = named.get("default")
    if isinstance(template, str):
        kv.set("tokenizer.chat_template", template, V.STRING)
    lowercase, strip_accents = _normalizer_flags(tokenizer_json.get("normalizer") or {})
    if lowercase is not None:
        kv.set("tokenizer.ggml.normalizer.lowercase", lowercase, V.BOOL)
    if strip_accents is not None:
        kv.set("tokenizer.ggml.normalizer.strip_accents", strip_accents, V.BOOL)


def _chat_template_files(target_dir: Path) -> Any:
    jinja = target_dir / "chat_template.jinja"
    if jinja.is_file():
        default = jinja.read_text(encoding="utf-8")
        extra = sorted((target_dir / "additional_chat_templates").glob("*.jinja"))
        if not extra:
            return default
        return [{"name": "default", "template": default}] + [
            {"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
    return read_json(target_dir / "chat_template.json").get("chat_template")


def _merges(target_dir: Path, tokenizer_json: dict[str, Any]) -> list[str]:
    merges = (tokenizer_json.get("model") or {}).get("merges") or []
    if merges and isinstance(merges[0], list):
        # pair format (transformers >= 4.45); a space inside a part is stored as U+0120 like GPT-2 bytes
        return [" ".join(part.replace(" ", chr(ord(" ") + 256)) for part in pair) for pair in merges]
    if merges:
        return list(merges)
    merges_txt = target_dir / "merges.txt"
    if not merges_txt.is_file():
        raise TargetError(f"{target_dir}: the BPE tokenizer has no merges (tokenizer.json or merges.txt)")
    lines = [line.split() for line in merges_txt.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    return [f"{parts[0]} {parts[1]}" for parts in lines if len(parts) == 2]


def _normalizer_flags(normalizer: dict[str, Any]) -> tuple[bool | None, bool | None]:
    kind = normalizer.get("type")
    if kind == "Lowercase":
        return True, None
    if kind == "StripAccents":
        return None, True
    if kind == "BertNormalizer":
        return normalizer.get("lowercase"), normalizer.get("strip_accents")
    lowercase = strip_accents = None
    for inner in normalizer.get("normalizers", []) if kind == "Sequence" else []:
        inner_lower, inner_strip = _normalizer_flags(inner)
        lowercase = inner_lower if inner_lower is not None else lowercase
        strip_accents = inner_strip if inner_strip is not None else strip_accents
    return lowercase, strip_accents
