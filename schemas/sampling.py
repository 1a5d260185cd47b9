"""Sampling parameters: the settings a customer serves with, and therefore trains and validates with."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from schemas import recipe
from schemas.bounds import SEED_MAX, JsonBody, MultilineText


class ChatTemplateOptions(JsonBody):
    """How prompts are rendered through the target's own chat template."""

    model_config = ConfigDict(frozen=True)

    enable_thinking: bool | None = Field(
        default=None,
        description="Passed to the chat template as `enable_thinking` (Qwen3-style reasoning on/off). "
        "None leaves the template's own default.",
    )
    system_prompt: MultilineText | None = Field(
        default=None,
        max_length=8000,
        description="A system message prepended to every conversation that has none.",
    )


class SamplingParams(JsonBody):
    """Decoding settings. temperature 0 means greedy; top_k 0 and top_p 1 disable those filters."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0,
        description="Softmax temperature; 0 is greedy decoding. Range [0, 2].",
    )
    top_p: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="Nucleus filter: keep the smallest set of tokens whose probability reaches top_p. Range (0, 1].",
    )
    top_k: int = Field(
        default=0, ge=0, le=100_000,
        description="Keep only the k most likely tokens; 0 disables the filter.",
    )
    max_new_tokens: int = Field(
        default=recipe.MAX_NEW_TOKENS, ge=1, le=32_768,
        description="Most tokens generated per response.",
    )
    seed: int = Field(
        default=recipe.SEED, ge=0, le=SEED_MAX,
        description=f"Seed for every random choice of the job, 0 to {SEED_MAX}.",
    )
    chat_template: ChatTemplateOptions = Field(default_factory=ChatTemplateOptions)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
