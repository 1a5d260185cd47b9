"""Prompt rendering through the target's own chat template, and the choice of the mask token."""

from __future__ import annotations

from schemas.sampling import ChatTemplateOptions
from trainer.errors import TargetError

_PROBE_CONVERSATION = [
    {"role": "system", "content": "probe"},
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "probe"},
]


def render_prompt(tokenizer, messages: list[dict], options: ChatTemplateOptions | None = None,
                  tools: list[dict] | tuple[dict, ...] | None = None) -> list[int]:
    """Token ids of `messages` (and the request's `tools`, if any) rendered with the generation prompt, exactly
    as a server would."""
    options = options or ChatTemplateOptions()
    if options.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": options.system_prompt}, *messages]
    kwargs = {}
    if tools:
        kwargs["tools"] = list(tools)
    if options.enable_thinking is not None:
        kwargs["enable_thinking"] = options.enable_thinking
    if not getattr(tokenizer, "chat_template", None):
        raise TargetError("the target tokenizer has no chat template; add one to tokenizer_config.json "
                          "or chat_template.jinja in the target directory")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    # The template already wrote any BOS it wants; adding special tokens again would double it.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def choose_mask_token_id(tokenizer, vocab_size: int) -> tuple[int, str]:
    """The token id whose (frozen) embedding marks the masked block positions, and why it was chosen.

    Rule, first that applies:
      1. the tokenizer's own mask token;
      2. the first embedding row beyond the tokenizer (padded vocabularies such as Qwen's): never produced;
      3. the added special token with the highest id that is not bos/eos/pad/unk and that the chat template
         does not emit: a reserved token the target never generates in a conversation;
      otherwise the caller must name one explicitly.
    """
    if tokenizer.mask_token_id is not None and tokenizer.mask_token_id < vocab_size:
        return int(tokenizer.mask_token_id), "the tokenizer's mask token"
    if len(tokenizer) < vocab_size:
        return len(tokenizer), "the first embedding row beyond the tokenizer's vocabulary (never generated)"
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    used: set[int] = set()
    if getattr(tokenizer, "chat_template", None):
        used = set(tokenizer.apply_chat_template(_PROBE_CONVERSATION, tokenize=True, add_generation_prompt=True,
                                                 return_dict=True)["input_ids"])
    candidates = [
        token_id for token_id, token in tokenizer.added_tokens_decoder.items()
        if token.special and token_id not in reserved and token_id not in used and token_id < vocab_size
    ]
    if candidates:
        return max(candidates), f"the unused special token {tokenizer.convert_ids_to_tokens(max(candidates))!r}"
    raise TargetError("the target tokenizer has no mask token and no unused special token; "
                      "pass mask_token_id explicitly (any token id the target never generates)")
