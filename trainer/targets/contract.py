"""The target contract: what the pipeline relies on in a target, read from the loaded model and the cache it builds.

A target is any decoder-only causal LM transformers loads. What speculative decoding, generation and training need
of it is read here, not looked up by `model_type`, so an architecture nobody listed is described the same way as a
listed one (trainer/targets/families.py keeps only what cannot be read: which engines serve it, its tokenizer's
GGUF quirks):

- the decoder layers (`get_decoder().layers`) and the final norm the LM head reads (the last tap): the decoder's
  child whose output the head is fed, found by one probe forward, not by a list of attribute names;
- each layer's kind, from the layer types transformers builds the cache from (config `layer_types` where the
  config has them, else the window and chunk settings: transformers' own `get_layer_types_and_kwargs`): full,
  sliding (window), chunked, linear (a recurrent state: Gated DeltaNet, Mamba), conv (a short convolution's
  state only: LFM2), none (no cache of its own: MLP/MoE-only layers, KV-sharing consumers), other;
- each layer's rollback, from the cache layer object after a probe forward: `crop` where transformers says a crop
  puts the layer back exactly (`is_croppable`: per-token keys and values, a recorded window, a convolution state
  recorded in full), `replay` where the layer carries a state a crop cannot take back (restore a snapshot, replay
  the accepted tokens: trainer/targets/loading.py `Target.mark` / `rewind`), `none` where it holds nothing;
- the embedding scale (the embedding module's output over the raw table's row: Gemma's sqrt(hidden)), the final
  logit soft-cap, a tied head (one tensor for the table and the head), routed experts and their active share.

Whether all of that holds on a given checkpoint is not assumed: trainer/targets/self_test.py decodes a few tokens
speculatively against the target alone at prepare and refuses the job naming the layer that failed.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass

import torch


class Rollback(enum.Enum):
    CROP = "crop"
    """Every layer keeps per-token keys and values (or a state recorded in full): drop the rejected tokens."""
    REPLAY = "replay"
    """A layer carries a recurrent state: restore the state saved before the verify, replay the accepted tokens."""


KINDS = ("full", "sliding", "chunked", "linear", "conv", "none", "other")
"""Layer kinds in the order descriptions list them."""
_KIND_OF_LAYER_TYPE = {
    "full_attention": "full", "indexed_attention": "full", "sliding_attention": "sliding",
    "chunked_attention": "chunked", "linear_attention": "linear", "hybrid": "linear", "hybrid_sliding": "linear",
    "conv": "conv", "dummy": "none",
}
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Config keys that count a layer's routed experts, as transformers' MoE configs spell them."""


@dataclass(frozen=True)
class LayerContract:
    index: int
    kind: str
    """One of KINDS."""
    cache_layer: str
    """The class of the cache layer transformers built for it (what its rollback was read from)."""
    rollback: str
    """crop, replay (snapshot and replay) or none (no cache)."""


@dataclass(frozen=True)
class Contract:
    layers: tuple[LayerContract, ...]
    final_norm: str
    """The decoder's child the LM head reads (its output is HF's hidden_states[-1], the last tap)."""
    embedding_scale: float
    final_logit_softcap: float | None
    tied_head: bool
    moe: bool
    active_expert_fraction: float

    @property
    def rollback(self) -> Rollback:
        return Rollback.REPLAY if any(layer.rollback == "replay" for layer in self.layers) else Rollback.CROP

    @property
    def replay_layers(self) -> tuple[int, ...]:
        return tuple(layer.index for layer in self.layers if layer.rollback == "replay")

    def layer_kinds(self) -> dict[str, int]:
        kinds = [layer.kind for layer in self.layers]
        return {kind: kinds.count(kind) for kind in KINDS if kind in kinds}

    def rollback_by_kind(self) -> dict[str, str]:
        """Each kind's rollback ('crop', 'replay', 'none'; 'mixed' if layers of one kind differ)."""
        found: dict[str, str] = {}
        for layer in self.layers:
            found[layer.kind] = layer.rollback if found.get(layer.kind, layer.rollback) == layer.rollback else "mixed"
        return found


def decoder_layers(model) -> tuple[torch.nn.ModuleList, str] | None:
    """The decoder's list of layers and its name: `layers` in most architectures, `h` (GPT-2, BLOOM, StarCoder),
    `blocks` (MPT), ...: the first module list under the decoder as long as the config's layer count (the longest,
    when the config does not say). None: no list of layers, so nothing to tap."""
    decoder = model.get_decoder()
    count = getattr(model.config.get_text_config(decoder=True), "num_hidden_layers", None)
    lists: list[tuple[str, torch.nn.ModuleList]] = [
        (name, module) for name, module in decoder.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0]
    found = [item for item in lists if len(item[1]) == count] or sorted(lists, key=lambda item: -len(item[1]))
    return (found[0][1], found[0][0]) if found else None


def kinds_from_config(text_config) -> list[str]:
    """Each decoder layer's kind from the layer types transformers builds the cache from."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, _ = get_layer_types_and_kwargs(text_config)
    return [_KIND_OF_LAYER_TYPE.get(layer_type, "other") for layer_type in types]


def layer_rollback(layer) -> str:
    """How a verify's rejected tokens are taken back from one cache layer, read from the layer itself after a
    forward: transformers' `is_croppable` says whether a crop puts it back as it was."""
    from transformers.cache_utils import DummyLayer

    if isinstance(layer, DummyLayer):
        return "none"
    return "crop" if getattr(layer, "is_croppable", False) else "replay"


def read_contract(model, new_cache, probe_ids: torch.Tensor, cache_argument: str) -> Contract:
    """The contract of a loaded causal LM: one probe forward of `probe_ids` (1 x n, n >= 2) through a fresh
    `new_cache()` (passed to the forward as `cache_argument`) initialises every cache layer (a linear layer says
    whether it holds a recurrent state only once it has one) and shows which module the LM head reads."""
    text = model.config.get_text_config()
    decoder = model.get_decoder()
    kinds = kinds_from_config(model.config.get_text_config(decoder=True))
    cache = new_cache()
    final_norm = _probe(model, decoder, {cache_argument: cache}, probe_ids)
    layers = tuple(LayerContract(index, kinds[index] if index < len(kinds) else "other", type(layer).__name__,
                                 layer_rollback(layer)) for index, layer in enumerate(cache.layers))
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    experts = next((text_value for key in EXPERT_COUNT_KEYS if (text_value := getattr(text, key, None))), None)
    chosen = getattr(text, "num_experts_per_tok", None)
    moe = bool(experts) and any(".experts." in name for name, _ in model.named_parameters())
    return Contract(
        layers=layers, final_norm=final_norm, embedding_scale=embedding_scale(embedding, probe_ids),
        final_logit_softcap=getattr(text, "final_logit_softcapping", None) or None,
        tied_head=head is not None and head.weight.data_ptr() == embedding.weight.data_ptr(),
        moe=moe, active_expert_fraction=min(1.0, chosen / experts) if moe and chosen else 1.0,
    )


@torch.inference_mode()
def _probe(model, decoder, cache: dict, probe_ids: torch.Tensor) -> str:
    """Runs the probe forward; returns the name of the decoder child whose output the LM head reads (HF's last
    hidden state: the final norm, whatever the architecture calls it: norm, norm_f, embedding_norm, ...)."""
    outputs: dict[str, torch.Tensor] = {}
    head_input: list[torch.Tensor] = []
    handles = [module.register_forward_hook(lambda _m, _a, out, name=name: outputs.__setitem__(
        name, out[0] if isinstance(out, tuple) else out)) for name, module in decoder.named_children()
        if name != "layers"]
    handles.append(model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: head_input.append(args[0])))
    try:
        model(input_ids=probe_ids, use_cache=True, logits_to_keep=0, **cache)
    finally:
        for handle in handles:
            handle.remove()
    read = head_input[-1] if head_input else None
    for name, output in outputs.items():
        if (isinstance(output, torch.Tensor) and read is not None and output.shape == read.shape
                and torch.equal(output, read)):
            return name
    return ""


def embedding_scale(embedding: torch.nn.Module, probe_ids: torch.Tensor) -> float:
    """What the embedding module multiplies the raw table's rows by (1.0 for a plain lookup; Gemma's sqrt(hidden)):
    measured on the probe tokens, rounded to 6 significant digits (a float32 product's last bits are noise)."""
    with torch.inference_mode():
        table = embedding.weight
        assert isinstance(table, torch.Tensor)
        raw = torch.nn.functional.embedding(probe_ids, table).float()
        scaled = embedding(probe_ids).float()
    norm = float((raw * raw).sum())
    if norm == 0.0:
        return 1.0
    return float(f"{float((scaled * raw).sum()) / norm:.6g}")


@dataclass(frozen=True)
class LayerSnapshot:
    """A copy of one cache layer's state that a crop cannot take back, taken before a verify."""

    state: object
    whole: bool
    """The layer object copied whole (a class the decoder knows nothing finer of); else a linear-attention layer's
    convolution and recurrent states only (its attention part, if any, is cropped like any other)."""


_STATE_FIELDS = ("conv_states", "recurrent_states", "is_conv_states_initialized", "is_recurrent_states_initialized",
                 "has_previous_state")


def is_linear(layer) -> bool:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return isinstance(layer, LinearAttentionCacheLayerMixin)


def _copied(fields: dict) -> dict:
    return {name: {i: (value.clone() if isinstance(value, torch.Tensor) else value) for i, value in states.items()}
            for name, states in fields.items()}


def snapshot_layer(layer) -> LayerSnapshot:
    if is_linear(layer):
        return LayerSnapshot(_copied({name: getattr(layer, name) for name in _STATE_FIELDS}), whole=False)
    return LayerSnapshot(copy.deepcopy(layer), whole=True)


def restore_layer(layer, snapshot: LayerSnapshot):
    """The layer as `snapshot` saw it (copies again: one mark may be rewound to more than once); the object to keep
    in the cache's list."""
    if snapshot.whole:
        return copy.deepcopy(snapshot.state)
    assert isinstance(snapshot.state, dict)
    for name, states in _copied(snapshot.state).items():
        setattr(layer, name, states)
    return layer


def trim_convolutions(cache, indices) -> None:
    """Past recording grows a linear layer's convolution state by every forward; only the kernel's width is needed
    once the verify is settled (a crop of 0 keeps exactly that)."""
    for index in indices:
        layer = cache.layers[index]
        if is_linear(layer) and any(layer.is_conv_states_initialized.values()):
            layer.crop(0)


LENGTH_ATTRIBUTE = "draftsmith_length"
"""Where the decoder counts the tokens of a cache that cannot say (recurrent layers only: Mamba, RWKV-like)."""


def counts_itself(cache) -> bool:
    """Whether the cache can say how many tokens it holds: transformers reads that from an attention layer, and a
    cache of recurrent layers only (a pure state-space model) has none."""
    from transformers.cache_utils import CacheLayerMixin

    return not cache.layers or any(isinstance(layer, CacheLayerMixin) for layer in cache.layers)


def cache_length(cache) -> int:
    return cache.get_seq_length() if counts_itself(cache) else getattr(cache, LENGTH_ATTRIBUTE, 0)


def set_length(cache, length: int) -> None:
    """Records the token count of a cache that cannot say it (a no-op for one that can)."""
    if not counts_itself(cache):
        setattr(cache, LENGTH_ATTRIBUTE, length)
