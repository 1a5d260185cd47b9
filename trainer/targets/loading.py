"""Target models: any local Hugging Face causal-LM directory transformers loads (what the pipeline relies on in it is
read from the model: trainer/targets/contract.py; checked on the checkpoint at prepare: trainer/targets/self_test.py).

The drafter borrows the target's embedding and LM head (frozen) and reads the outputs of a few of its
layers ("taps"). `Target` exposes exactly those, plus a KV cache that can be rolled back, so the
speculative decoder, the data generator and the trainer never touch model internals themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
from functools import cached_property
from pathlib import Path

import torch
from torch.nn import functional as F

from schemas.bounds import TargetLimits
from schemas.validation_report import TargetDescription
from trainer.errors import (
    ChatTemplateInvalid,
    TargetError,
    TargetShapeMismatch,
    TokenizerInvalid,
    WeightsHeaderInvalid,
)
from trainer.targets.adapters import adapter_digest, merge_adapter, model_and_adapter
from trainer.targets.contract import (
    Contract,
    Rollback,
    cache_length,
    decoder_layers,
    read_contract,
    restore_layer,
    set_length,
    snapshot_layer,
    trim_convolutions,
)
from trainer.targets.families import describe_loaded
from trainer.targets.preflight import (
    check_config_sizes,
    preflight,
    read_config,
    read_config_file,
    read_weight_map,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))


def inspect_target_dir(path: str | Path, *, allow_pickle: bool = False, base: str | Path | None = None,
                       limits: TargetLimits | None = None) -> dict:
    """Check a target directory without loading it; return its config. Raises TargetError in one line. A LoRA
    adapter folder (trainer/targets/adapters.py) is checked with its base (`base`, which it needs); the base's config
    is returned. Sizes are judged against `limits` (the defaults: TargetLimits()) from config.json and the
    safetensors headers, before anything is allocated (trainer/targets/preflight.py)."""
    model_dir, _ = model_and_adapter(path, allow_pickle=allow_pickle, base=base)
    return _inspect_model_dir(model_dir, allow_pickle, limits or TargetLimits())


def _inspect_model_dir(path: Path, allow_pickle: bool, limits: TargetLimits) -> dict:
    if not path.is_dir():
        raise TargetError(f"target {path}: not a directory; pass a Hugging Face model directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise TargetError(f"target {path}: config.json is missing; a model directory needs config.json, "
                          "*.safetensors weights and tokenizer files")
    config = read_config(path)
    # No list of model types here: any architecture transformers builds is judged by the self-test at prepare.
    weight_files, weight_map = _check_weights(path, allow_pickle)
    if not _has_tokenizer(path):
        raise TargetError(f"target {path}: tokenizer files are missing; save the tokenizer into the model "
                          "directory (tokenizer.json, or tokenizer.model, or vocab.json + merges.txt)")
    if weight_files:
        preflight(path, config, limits, weight_files, weight_map)
    else:  # pickled weights (the job allowed them): no header to read, the config's own sizes are still judged
        check_config_sizes(config, limits)
    return config


def _check_weights(path: Path, allow_pickle: bool) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files the model loads from (empty: pickled weights the job allows) and its index's weight
    map (None: not sharded)."""
    weight_map = read_weight_map(path)
    if weight_map is not None:
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise TargetError(f"target {path}: weight shard {missing[0]} listed in model.safetensors.index.json "
                              "is missing; copy every shard into the directory")
        return [path / s for s in shards], weight_map
    found = sorted(path.glob("*.safetensors"))
    if found:
        return found, None
    pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled and not allow_pickle:
        raise TargetError(f"target {path}: only pickle weights ({pickled[0]}) were found; convert them to "
                          "safetensors (save_pretrained(..., safe_serialization=True)) or set allow_pickle on the job")
    if not pickled:
        raise TargetError(f"target {path}: no weights found; expected model.safetensors or sharded *.safetensors")
    return [], None


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_target(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                allow_pickle: bool = False, trust_remote_code: bool = False, may_split: bool | None = None,
                base: str | Path | None = None, limits: TargetLimits | None = None) -> Target:
    """Load a checked target directory in float32 on CPU (bfloat16 on GPU). Runs code shipped with the
    checkpoint only when `trust_remote_code` is given (a job's explicit, deployment-allowed choice).

    Nothing is allocated before the folder passed `_inspect_model_dir`: config.json's sizes and the safetensors
    headers judged against each other and against `limits` (trainer/targets/preflight.py). The tokenizer and its
    chat template are checked next, the weights read last.

    A LoRA adapter folder is loaded over `base` (required: what the adapter's own config names is never opened) and
    merged into it in `dtype`; its own tokenizer files, when it has them, are the target's tokenizer.

    On a machine with several GPUs, a target too large for `device`'s GPU is split by layers over the next ones
    (trainer/targets/placement.py), or refused naming what to change. `may_split`: whether it may be (None: yes,
    unless this process is one of several training ranks, which each hold a whole target)."""
    from transformers import AutoModelForCausalLM

    path, adapter = model_and_adapter(path, allow_pickle=allow_pickle, base=base)
    config = _inspect_model_dir(path, allow_pickle, limits or TargetLimits())
    tokenizer = load_tokenizer(path, trust_remote_code)
    if adapter is not None and _has_tokenizer(adapter):
        tokenizer = _adapter_tokenizer(adapter, tokenizer, trust_remote_code)
    check_chat_template(tokenizer)
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    placement = gpu_placement(path, config, device, dtype, may_split)
    options = placement.from_pretrained_options() if placement is not None else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not allow_pickle or None,
            **options,
        )
    except Exception as exc:
        if type(exc).__name__ == "SafetensorError":  # the format's own reader refused a file the headers passed
            raise WeightsHeaderInvalid(f"target: a safetensors file could not be read ({exc}); save the weights "
                                       "again") from None
        if isinstance(exc, RuntimeError) and "size mismatch" in str(exc):
            raise TargetShapeMismatch(f"target: {str(exc)[:500]}; hand over the config.json these weights were "
                                      "saved with") from None
        raise
    if adapter is not None:
        model = merge_adapter(model, adapter)
    if options:
        _check_all_on_gpus(model, path)
    else:
        model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    return Target(model, tokenizer, path, adapter_path=adapter)


def load_tokenizer(path: Path, trust_remote_code: bool):
    """The folder's tokenizer; one that does not parse is the target's fault, said so (TokenizerInvalid)."""
    from transformers import AutoTokenizer

    _refuse_file_pointers(path)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise TokenizerInvalid(f"target: its tokenizer files do not load ({type(exc).__name__}: {str(exc)[:300]}); "
                               "save the tokenizer again (tokenizer.save_pretrained) into the model folder") from None


def _refuse_file_pointers(path: Path) -> None:
    """tokenizer_config.json may name files (`tokenizer_file`, `fast_tokenizer_files`, ...); transformers joins such
    a name to the folder, so one with a directory part (`../../other-org/tokenizer.json`, `/etc/x`) would open
    what the folder does not hold. Only bare names of files in the folder are accepted."""
    file = path / "tokenizer_config.json"
    if not file.is_file():
        return
    config = read_config_file(file, TokenizerInvalid)
    for key, value in config.items():
        if not (key.endswith(("_file", "_files")) and value is not None):
            continue
        names = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for name in names:
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise TokenizerInvalid(f"target tokenizer_config.json: {key} names {name!r}; a tokenizer file is "
                                       "named by its bare file name in the model folder (save the tokenizer again)")


_PROBE_MESSAGES = [{"role": "user", "content": "Hello"}]


def check_chat_template(tokenizer) -> None:
    """Render one user turn with the target's chat template, as every prompt will be: a template that raises is
    refused now, with the template's own message, not mid-generation."""
    if not getattr(tokenizer, "chat_template", None):
        return  # a target without one is refused where prompts are rendered, naming what to add
    try:
        tokenizer.apply_chat_template(_PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise ChatTemplateInvalid(f"target: its chat template fails to render a user message "
                                  f"({type(exc).__name__}: {str(exc)[:300]}); fix chat_template in "
                                  "tokenizer_config.json or chat_template.jinja") from None


def _has_tokenizer(path: Path) -> bool:
    return any(all((path / name).is_file() for name in names) for names in TOKENIZER_FILE_SETS)


def _adapter_tokenizer(adapter: Path, base_tokenizer, trust_remote_code: bool):
    """The adapter's own tokenizer (its chat template may be the fine-tune's). Its vocabulary must be the base's:
    the drafter shares the merged model's embedding table, and export writes the GGUF's vocabulary from the base
    folder's tokenizer files."""
    tokenizer = load_tokenizer(adapter, trust_remote_code)
    if tokenizer.get_vocab() != base_tokenizer.get_vocab():
        raise TargetError(f"target {adapter}: the adapter's tokenizer has another vocabulary than its base's "
                          f"({len(tokenizer)} against {len(base_tokenizer)} tokens); an adapter that changes the "
                          "vocabulary is not supported: merge it and hand over the merged model")
    return tokenizer


def gpu_placement(path: Path, config: dict, device: torch.device, dtype: torch.dtype, may_split: bool | None):
    """The placement of a target bound for a GPU of a machine with several (None on the CPU or with one GPU: the
    plain `.to(device)`, as before)."""
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        return None
    from trainer.targets.placement import gpu_memory, plan_placement, target_parameters

    if may_split is None:
        may_split = int(os.environ.get("WORLD_SIZE", "1")) == 1
    return plan_placement(target_parameters(path, config), dtype, gpu_memory(), first_gpu=device.index or 0,
                          may_split=may_split, name=f"target {path.name}")


def _check_all_on_gpus(model, path: Path) -> None:
    """transformers places what does not fit its `max_memory` on the CPU or disk without a word: many times
    slower, so refused (the plan's headroom is meant to leave room; this catches its estimate being wrong)."""
    elsewhere = sorted({str(where) for where in getattr(model, "hf_device_map", {}).values()
                        if not isinstance(where, int) and not str(where).startswith("cuda")})
    if elsewhere:
        raise TargetError(f"target {path}: its layers did not fit the GPUs planned for it and some went to "
                          f"{', '.join(elsewhere)}; run it on a node with more GPU memory")


CACHE_ARGUMENTS = ("cache", "past_key_values")
"""What transformers' model forward calls the KV cache: `cache` in the versions this project installs,
`past_key_values` in earlier 5.x releases (e.g. 5.17, in GPU images users run)."""


def cache_argument(model) -> str:
    """The name the installed transformers' forward takes the KV cache under. Checked once per target: a forward
    with **kwargs swallows a misnamed cache without an error and recomputes from nothing, so decoding would go
    silently wrong; a forward with neither name is refused instead."""
    parameters = inspect.signature(model.forward).parameters
    for name in CACHE_ARGUMENTS:
        if name in parameters:
            return name
    raise TargetError(f"{type(model).__name__}.forward takes no KV cache argument ({' or '.join(CACHE_ARGUMENTS)}) "
                      f"in transformers as installed here; its parameters: {', '.join(parameters)}. Install the "
                      "transformers version of this project's pyproject.toml")


@dataclasses.dataclass(frozen=True)
class CacheMark:
    length: int
    states: dict | None
    """Copies of the states a crop cannot take back, by cache layer index (a linear-attention layer's conv and
    recurrent states; any other such layer whole); None when every layer can be cropped."""


class Target:
    """A frozen causal LM with the handles a DFlash drafter needs."""

    def __init__(self, model, tokenizer, path: Path | None = None, *, adapter_path: Path | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        """The folder of the full model (for an adapter target: its base): config.json and tokenizer files, which
        export's GGUF writer reads. Engines that load a model from a folder (vLLM, llama.cpp) would load it without
        the adapter, so they refuse a target with an `adapter_path`."""
        self.adapter_path = adapter_path
        """The LoRA adapter folder merged into `model` (trainer/targets/adapters.py), else None."""
        self.config = model.config.get_text_config()
        found = decoder_layers(model)  # the taps and the contract read the decoder's layers, whatever their name
        if found is None:
            raise TargetError(f"target {type(model).__name__}: its decoder ({type(model.get_decoder()).__name__}) "
                              "holds no list of layers, so no layer can be tapped for the drafter: not a "
                              "decoder-only architecture this pipeline reads")
        self.layers = found[0]
        self.cache_argument = cache_argument(model)
        self._rollback: Rollback | None = None

    @cached_property
    def contract(self) -> Contract:
        """What the pipeline relies on in this model, read from it (trainer/targets/contract.py): one probe forward
        of two tokens, on first use."""
        probe = torch.tensor([[1, 2]], device=self.device).clamp_max(self.vocab_size - 1)
        return read_contract(self.model, self.new_cache, probe, self.cache_argument)

    @cached_property
    def family(self) -> dict:
        return describe_loaded(self.model.config.to_dict(), self.contract)

    @property
    def rollback(self) -> Rollback:
        """How a verify is taken back: the contract's (replay when a layer holds a state a crop cannot take back).
        Settable, so a test or a bench can plant the wrong one and see it caught or measure it."""
        return self._rollback if self._rollback is not None else self.contract.rollback

    @rollback.setter
    def rollback(self, value: Rollback) -> None:
        self._rollback = value

    def describe(self, name: str | None = None, base: str | None = None) -> TargetDescription:
        """The target as a job names it (`name`, an adapter's `base`; else the local folders) and its family:
        report.json's `target` and the model card's."""
        adapter = self.adapter_path is not None
        return TargetDescription(name=name or str(self.adapter_path or self.path), adapter=adapter,
                                 base=(base or str(self.path)) if adapter else None, **self.family)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding_weight.dtype

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def embedding_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def vocab_size(self) -> int:
        return self.embedding_weight.shape[0]

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Raw token embeddings (no model-specific scaling), as the reference drafter reads them."""
        return F.embedding(input_ids, self.embedding_weight)

    def new_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        cache.activate_past_recording()  # lets every layer type roll back rejected tokens
        return cache

    @staticmethod
    def crop_cache(cache, length: int) -> None:
        """Drop cached tokens past `length`. Exact only for a target whose every layer keeps per-token keys and
        values (`Rollback.CROP`); one with a recurrent state is put back with `mark` and `rewind`."""
        remove = cache_length(cache) - length
        if remove > 0:
            cache.crop(-remove)
            set_length(cache, length)

    def mark(self, cache) -> CacheMark:
        """Where `cache` stands before a forward whose tail may be rejected: its length and, for a target with
        layers whose state no crop can recover (the contract's replay layers), a copy of those states."""
        if self.rollback is Rollback.CROP:
            return CacheMark(cache_length(cache), None)
        return CacheMark(cache_length(cache), {index: snapshot_layer(cache.layers[index])
                                                  for index in self.contract.replay_layers})

    @torch.inference_mode()
    def rewind(self, cache, mark: CacheMark, kept: list[int]) -> None:
        """Leave `cache` exactly as if only `kept` (the first tokens of the forwards since `mark`) had followed
        the marked prefix: croppable layers cropped; the others restored to the marked state and the kept tokens
        replayed through the target (one forward, only when some token was rejected)."""
        length = mark.length + len(kept)
        if mark.states is None:
            self.crop_cache(cache, length)
            trim_convolutions(cache, self._croppable_convolutions)
            return
        remove = cache_length(cache) - mark.length
        if cache_length(cache) != length:  # a token was rejected: back to the mark, then the kept ones again
            for index, layer in enumerate(cache.layers):
                if remove > 0 and not (index in mark.states and mark.states[index].whole):
                    layer.crop(-remove)  # a layer copied whole is not asked to crop: its crop may be the problem
                if index in mark.states:
                    cache.layers[index] = restore_layer(layer, mark.states[index])
            set_length(cache, mark.length)
            if kept:
                positions = torch.arange(mark.length, length, device=self.device)[None]
                self.forward(torch.tensor([kept], device=self.device), positions, cache=cache, logits_to_keep=1)
        trim_convolutions(cache, list(mark.states) + self._croppable_convolutions)

    @cached_property
    def _croppable_convolutions(self) -> list[int]:
        """Linear layers that hold only a convolution state (LFM2's short convolutions): cropped, then trimmed."""
        return [layer.index for layer in self.contract.layers if layer.rollback == "crop" and layer.kind == "conv"]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None,
                tap_layer_ids: list[int] | None = None, logits_to_keep: int = 0,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits and, if asked, the concatenated outputs of the tapped layers (HF hidden_states[id + 1])."""
        seen = None if cache is None else cache_length(cache)
        with self.capture_taps(tap_layer_ids) as taps:
            output = self.model(
                input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                use_cache=cache is not None, logits_to_keep=logits_to_keep, **{self.cache_argument: cache},
            )
        if seen is not None:
            set_length(cache, seen + input_ids.shape[1])  # a cache of recurrent layers only is counted here
        # A target split over GPUs leaves each tap on its layer's GPU: gathered where the inputs are (a no-op when
        # they are all there already).
        return output.logits, (torch.cat([t.to(input_ids.device) for t in taps], dim=-1) if tap_layer_ids else None)

    @contextlib.contextmanager
    def capture_taps(self, layer_ids: list[int] | None):
        """Record the outputs of the given decoder layers during one forward pass, in the given order.

        Hooks instead of output_hidden_states: only the tapped layers are kept in memory.
        """
        captured: dict[int, torch.Tensor] = {}
        handles = []
        for layer_id in layer_ids or []:
            if not 0 <= layer_id < self.num_layers:
                raise TargetError(f"target layer id {layer_id} is out of range [0, {self.num_layers - 1}]")

            def hook(_module, _args, output, layer_id=layer_id):
                captured[layer_id] = output[0] if isinstance(output, tuple) else output

            # HF's hidden_states[L] (what the reference reads for the last layer) is the final norm's output:
            # the state the LM head reads, so the last layer is tapped after the norm.
            module = self.layers[layer_id] if layer_id < self.num_layers - 1 else self.final_norm
            handles.append(module.register_forward_hook(hook))
        ordered: list[torch.Tensor] = []
        try:
            yield ordered
        finally:
            for handle in handles:
                handle.remove()
        ordered.extend(captured[i] for i in layer_ids or [])

    @property
    def final_norm(self) -> torch.nn.Module:
        """The module whose output the LM head reads (the contract found it; `norm` where the probe could not)."""
        decoder = self.model.get_decoder()
        return getattr(decoder, self.contract.final_norm or "norm")

    def stop_token_ids(self) -> list[int]:
        """End-of-turn tokens: the generation config's eos ids plus the tokenizer's eos."""
        ids: list[int] = []
        generation_config = getattr(self.model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
        for value in ([eos] if isinstance(eos, int) else (eos or [])) + [self.tokenizer.eos_token_id]:
            if value is not None and value not in ids:
                ids.append(int(value))
        return ids

    @cached_property
    def fingerprint(self) -> str:
        """Identity of what a drafter depends on: the tokenizer's vocabulary and the embedding table, and the
        adapter merged into the target, if any."""
        digest = hashlib.sha256()
        vocab = sorted(self.tokenizer.get_vocab().items())
        digest.update(json.dumps(vocab, ensure_ascii=False).encode())
        # Rounded to bfloat16 so the same checkpoint fingerprints alike in fp32 on CPU and bf16 on GPU.
        weight = self.embedding_weight.detach().to(torch.bfloat16).cpu().contiguous()
        digest.update(str(tuple(weight.shape)).encode())
        digest.update(weight.view(torch.int16).numpy().tobytes())
        if self.adapter_path is not None:  # a LoRA over the attention leaves the embedding table as the base's
            digest.update(b"adapter" + adapter_digest(self.adapter_path))
        return "sha256:" + digest.hexdigest()[:32]
