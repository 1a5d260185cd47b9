"""Parent drafters in the field's formats, recognised by their content and read into our Drafter.

A customer's base model usually has a published drafter, written by one of four tools. Which one wrote a folder
is told by what config.json holds and which tensors the weights hold, never by the folder's or the repo's name:

    format       config.json                                   tensors (besides the DFlash body)
    draftsmith   dflash_config + our `draftsmith` block         d2t (+ the head's rows) or draft_vocab.safetensors
    z-lab        dflash_config (the reference `dflash` format)  DFlash 2: convolutions, candidate_selector.*
    specforge    dflash_config with SpecForge's own keys         DSpark: markov_head.*, confidence_head.* (or
                 (projector_type, attention_mode, shift_label,   under logit_head.); a plain SpecForge DFlash export
                 markov_*) or DSpark heads                       is the reference format and reads as z-lab
    speculators  speculators_config / speculators_model_type,   embed_tokens, lm_head, verifier_lm_head,
                 transformer_layer_config, aux_hidden_state_     verifier_norm (frozen copies of the target's),
                 layer_ids (HF hidden_states index = ours + 1)   d2t/t2d; DSpark: markov_head.*, confidence_head.*

The DFlash body has the reference tensor names in every format (layers.N.*, fc, hidden_norm, norm, and for
DFlash 2 layers.N.{attention,mlp}_conv.*, candidate_selector.*), so each converter is one table of rules
(`RULES`): a tensor is kept under our name, or dropped with the reason the report shows (a DSpark head our
drafter has no part for; a frozen copy of the target's embedding or head, which our drafter borrows from the
target itself), or read as the draft vocabulary. A tensor no rule names is an error naming it, and so is a part
of our drafter the parent lacks: nothing is guessed. The variant is told by the tensors too (NeMo's DFlash 2
exports carry the v1 architecture name), and the DFlash 2 widths (kernel taps, group size, selector rank) are
read from the tensors' shapes and checked against whatever the config says.

Weights are read from safetensors only: a folder of pickles (pytorch_model.bin, SpecForge's training_state.pt) is
refused, since unpickling runs code. Nothing here runs a format's own code.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from schemas.work_files import ParentOrigin
from trainer.drafter.config import ARCHITECTURES, DrafterConfig, build_target_layer_ids
from trainer.drafter.draft_vocab import FILE_NAME as DRAFT_VOCAB_FILE
from trainer.drafter.draft_vocab import ids_from_d2t, load_draft_vocab
from trainer.errors import DrafterError

if TYPE_CHECKING:  # reading a config never imports the model
    from trainer.drafter.model import Drafter

DRAFTSMITH, ZLAB, SPECFORGE, SPECULATORS = "draftsmith", "z-lab", "specforge", "speculators"
FORMATS = (DRAFTSMITH, ZLAB, SPECFORGE, SPECULATORS)
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SPECFORGE_KEYS = frozenset({"projector_type", "attention_mode", "shift_label", "pure_draft_prefix_len", "markov_rank",
                            "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
                            "confidence_head_alpha"})
"""dflash_config keys only SpecForge writes (its DSpark and Domino options); the reference format has none."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

_LAYER = r"layers\.\d+\."
BODY = re.compile(rf"^({_LAYER}(self_attn\.[qkvo]_proj|self_attn\.[qk]_norm|mlp\.(gate|up|down)_proj|input_layernorm"
                  r"|post_attention_layernorm)\.weight|(norm|fc|hidden_norm)\.weight)$")
DFLASH2_PARTS = re.compile(rf"^({_LAYER}(attention_conv|mlp_conv)\.(base_kernel|kernel_projection\.weight)"
                           r"|candidate_selector\.hidden_projection\.weight)$")
CODEBOOK = re.compile(r"^candidate_selector\.(predecessor|successor)_codebook(\.weight)?$")
DSPARK_HEADS = re.compile(r"^(logit_head\.)?(markov_head|confidence_head)\.")

TARGETS_OWN = "a frozen copy of the target's; our drafter reads the target's own"
HEAD_ROWS = "drop:the target's LM head rows at the draft ids (the d2t layout); our drafter reads the target's own"
RULES: dict[str, list[tuple[re.Pattern, str]]] = {
    DRAFTSMITH: [],
    ZLAB: [],
    SPECFORGE: [(re.compile(r"^(logit_head\.)?markov_head\."), "drop:DSpark's Markov head; our drafter has none "
                                                               "(a DFlash 2 selector takes its place)"),
                (re.compile(r"^(logit_head\.)?confidence_head\."), "drop:DSpark's confidence head; our drafter has "
                                                                   "none"),
                (re.compile(r"^embed_tokens\.weight$"), f"drop:{TARGETS_OWN}")],
    SPECULATORS: [(re.compile(r"^(embed_tokens|lm_head|verifier_lm_head|verifier_norm)\.weight$"),
                   f"drop:{TARGETS_OWN}"),
                  (re.compile(r"^markov_head\."), "drop:DSpark's Markov head; our drafter has none (a DFlash 2 "
                                                  "selector takes its place)"),
                  (re.compile(r"^confidence_head\."), "drop:DSpark's confidence head; our drafter has none")],
}
"""Per format, what its tensors beyond the DFlash body are: `drop:<reason>`. The body, the DFlash 2 parts and the
draft vocabulary (d2t, t2d) are common to all."""


class DrafterFormatError(DrafterError):
    """A parent drafter folder this service cannot read: an unknown layout, pickled weights, a tensor no rule names,
    or a feature our drafter does not have."""

    code = "drafter_format_unsupported"


@dataclass(frozen=True)
class ParentCheckpoint:
    """A parent drafter folder as recognised, before any weight is read: its shape as our DrafterConfig and its
    origin. Reading it costs the config and the safetensors headers only (prepare refuses a misfit with this)."""

    path: Path
    config: DrafterConfig
    origin: ParentOrigin
    shapes: dict[str, tuple[int, ...]]
    files: tuple[Path, ...]


@dataclass
class ImportedDrafter:
    """A parent's weights in our Drafter (its own shape: an upgrade to a job's shape is trainer/drafter/upgrade.py),
    with where it came from and what the import left out."""

    drafter: Drafter
    origin: ParentOrigin


def weight_files(path: Path) -> list[Path]:
    """The folder's safetensors weight files: its index's shards, else model.safetensors, else every
    *.safetensors but a draft vocabulary's. Refuses a folder whose weights are pickles only."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as exc:
            raise DrafterFormatError(f"{index} has no usable weight_map: {exc}") from None
        if any("/" in name or not (path / name).is_file() for name in names):
            raise DrafterFormatError(f"{index} names shards that are not files of this folder")
        return [path / name for name in names]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(f for f in path.glob("*.safetensors") if f.name != DRAFT_VOCAB_FILE)
    if files:
        return files
    pickles = sorted(f.name for f in path.iterdir() if f.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if pickles:
        raise DrafterFormatError(
            f"drafter {path} holds only pickled weights ({', '.join(pickles[:3])}); Draftsmith reads safetensors "
            "only, since loading a pickle runs code: save it with safetensors (save_pretrained's default; for a "
            "SpecForge training checkpoint, its export to an HF folder) and give that folder as init.from_drafter")
    raise DrafterFormatError(f"drafter {path}: no *.safetensors weights (give a drafter folder: config.json and "
                             "model.safetensors)")


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(file, framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in shapes:
                    raise DrafterFormatError(f"{file}: tensor {name} is stored twice in the drafter's weights")
                shapes[name] = tuple(weights.get_slice(name).get_shape())
    return shapes


def recognise(config: dict, names: set[str]) -> str:
    """The format that wrote a drafter folder, from its config.json and its tensor names."""
    if "speculators_config" in config or "speculators_model_type" in config:
        return SPECULATORS
    if "dflash_config" in config or "num_target_layers" in config:
        if "draftsmith" in config:
            return DRAFTSMITH
        if SPECFORGE_KEYS & set(config.get("dflash_config") or {}) or any(n.startswith("logit_head.") for n in names):
            return SPECFORGE
        return ZLAB
    raise DrafterFormatError(
        "config.json is not a DFlash drafter's this service reads: it has neither dflash_config (the reference "
        "dflash format, which z-lab, SpecForge and Draftsmith write) nor speculators_config (vLLM speculators'); "
        "give the folder of a DFlash, DFlash 2 or DSpark drafter")


def parent_variant(names: set[str]) -> str:
    """dflash, dflash2 or dspark, by the tensors the weights hold."""
    if any(DSPARK_HEADS.match(n) for n in names):
        return "dspark"
    return "dflash2" if any(DFLASH2_PARTS.match(n) or CODEBOOK.match(n) for n in names) else "dflash"


def _value(config: dict, section: dict, name: str):
    """A DFlash key where the reference reads it: its dflash_config first, then the top level."""
    return section.get(name, config.get(name))


def dflash2_widths(shapes: dict[str, tuple[int, ...]], stated: dict, hidden_size: int,
                   notes: list[str]) -> dict[str, int]:
    """conv_kernel_size, conv_group_size and selector_rank from the tensors' shapes, checked against the config's
    values where it states them; selector_top_k (no tensor depends on it) from the config or our default."""
    kernel = shapes.get("layers.0.attention_conv.base_kernel")
    projection = shapes.get("layers.0.attention_conv.kernel_projection.weight")
    codebook = next((s for n, s in shapes.items() if CODEBOOK.match(n)), None)
    if kernel is None or projection is None or codebook is None:
        raise DrafterFormatError("a DFlash 2 parent lacks layers.0.attention_conv.* or the selector's codebooks")
    taps = kernel[1]
    widths = {"conv_kernel_size": taps, "conv_group_size": hidden_size // (projection[0] // (2 * taps)),
              "selector_rank": codebook[1]}
    for name, read in widths.items():
        if stated.get(name) is not None and int(stated[name]) != read:
            raise DrafterFormatError(f"config.json says {name} {stated[name]} but the weights' shapes say {read}")
    top_k = stated.get("selector_top_k")
    if top_k is None:
        top_k = DrafterConfig.selector_top_k  # the dataclass default
        notes.append(f"selector_top_k is not recorded by the parent: our default {top_k}")
    return {**widths, "selector_top_k": int(top_k)}


def refuse_unsupported(config: dict, section: dict, where: Path) -> None:
    """Features of a parent that our drafter cannot compute the same way; importing would change its drafts."""
    problems = []
    if config.get("attention_bias"):
        problems.append("attention_bias is true (our drafter's projections have no bias)")
    activation = config.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):  # speculators' --draft-hidden-act sets it
        problems.append(f"hidden_act {activation} (our drafter's MLP is SwiGLU: silu)")
    layer_types = config.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        problems.append(f"layer_types {sorted(set(layer_types))} (our drafter's layers attend fully; speculators "
                        "trains sliding-window layers unless told --full-attention-indices)")
    multiplier = _value(config, section, "output_multiplier")
    if multiplier is not None and float(multiplier) != 1.0:
        problems.append(f"output_multiplier {multiplier} (our drafter feeds the target's head unscaled)")
    if _value(config, section, "final_logit_softcapping"):
        problems.append("final_logit_softcapping (our drafter does not cap its logits)")
    if problems:
        raise DrafterFormatError(f"drafter {where} uses what our drafter does not compute: {'; '.join(problems)}; "
                                 "train from scratch (drop init.from_drafter)")


def completed_layer_config(layer: dict, where: Path) -> dict:
    """speculators writes its drafter's layer config as a diff against the config class's defaults
    (`to_diff_dict`): the class itself fills in what was left out (a config class only, no model code)."""
    from transformers import AutoConfig

    settings = {k: v for k, v in layer.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(layer.get("model_type", "qwen3"), **settings).to_dict()
    except (ValueError, TypeError) as exc:
        raise DrafterFormatError(f"drafter {where}: transformer_layer_config is not a config transformers "
                                 f"knows: {exc}") from None


def reference_config(config: dict, fmt: str, shapes: dict, num_target_layers: int | None, notes: list[str],
                     where: Path) -> dict:
    """The parent's config.json in the reference form (DrafterConfig.from_hf_dict reads it): one parser for all."""
    if fmt == SPECULATORS:
        layer = completed_layer_config(dict(config.get("transformer_layer_config") or {}), where)
        section = dict(config.get("dflash_config") or {})
        for key in ("block_size", "mask_token_id", "draft_vocab_size", *DFLASH2_KEYS):
            if config.get(key) is not None:
                section.setdefault(key, config[key])
        aux = config.get("aux_hidden_state_layer_ids")
        if not aux or min(aux) < 1:
            raise DrafterFormatError(f"drafter {where}: aux_hidden_state_layer_ids {aux} must name target layers "
                                     "(1 and up: speculators counts the embeddings as 0)")
        section["target_layer_ids"] = [i - 1 for i in aux]  # its ids index HF hidden_states; ours are layer ids
        hidden = config.get("target_hidden_size")
        if hidden is not None and hidden != layer.get("hidden_size"):
            raise DrafterFormatError(f"drafter {where}: target_hidden_size {hidden} differs from its own hidden "
                                     f"size {layer.get('hidden_size')}; our drafter's width is the target's")
        if config.get("sample_from_anchor"):
            notes.append("trained with sample_from_anchor (block slot k predicts anchor + k + 1; ours, anchor + "
                         "k): its drafts here start one position late, until training re-aligns them")
        base = {**layer, "draft_vocab_size": config.get("draft_vocab_size")}
    else:
        section, base = dict(config.get("dflash_config") or {}), dict(config)
        if section.get("shift_label"):
            notes.append("trained with shift_label (block slot k predicts anchor + k + 1; ours, anchor + k): its "
                         "drafts here start one position late, until training re-aligns them")
    refuse_unsupported(base, section, where)
    rope = base.get("rope_parameters") or base.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        notes.append(f"trained with {rope.get('rope_type', rope.get('type'))} RoPE scaling (ours: plain RoPE at its "
                     "rope_theta): its drafts here differ from its own, most at long range, until training re-aligns "
                     "them")
    depth = base.get("num_target_layers")
    taps = _value(base, section, "target_layer_ids")
    if taps is None:
        known = depth or num_target_layers
        if known is None:
            raise DrafterFormatError(f"drafter {where} records neither its taps nor its target's depth")
        taps = build_target_layer_ids(known, base["num_hidden_layers"])  # the reference's own rule
        notes.append(f"taps not recorded: the reference rule's {taps} for a {known}-layer target")
    if depth is None:
        # Unrecorded (speculators'): the job target's, or what its taps imply when they reach beyond it, so that
        # the misfit is told by the warm-start check, naming the field, rather than by a parse error here.
        depth = max(num_target_layers or 0, max(taps) + 1)
        notes.append("the parent does not record its target's depth; taken as this target's")
    mask = _value(base, section, "mask_token_id")
    if mask is None:
        raise DrafterFormatError(f"drafter {where} records no mask_token_id; a DFlash drafter is trained with one")
    dflash = {"block_size": int(_value(base, section, "block_size") or 16), "mask_token_id": int(mask),
              "target_layer_ids": [int(t) for t in taps]}
    if section.get("input_embedding_scale") is not None:
        dflash["input_embedding_scale"] = section["input_embedding_scale"]
    backbone = "dflash2" if any(DFLASH2_PARTS.match(n) for n in shapes) else "dflash"
    if backbone == "dflash2":
        stated = {k: _value(base, section, k) for k in DFLASH2_KEYS}
        dflash.update(dflash2_widths(shapes, stated, int(base["hidden_size"]), notes))
    return {**base, "architectures": [ARCHITECTURES[backbone]], "num_target_layers": int(depth),
            "dflash_config": dflash}


def read_parent(path: str | Path, *, num_target_layers: int | None = None) -> ParentCheckpoint:
    """Recognise the drafter in `path` (config.json and safetensors headers only). `num_target_layers`: the
    job target's depth, for a format that does not record the target's (speculators')."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise DrafterError(f"drafter {path}: config.json is missing")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise DrafterFormatError(f"{config_file} is not JSON: {exc}") from None
    files = weight_files(path)
    shapes = tensor_shapes(files)
    fmt = recognise(config, set(shapes))
    variant, notes = parent_variant(set(shapes)), list[str]()
    reference = reference_config(config, fmt, shapes, num_target_layers, notes, path)
    try:
        parsed = DrafterConfig.from_hf_dict(reference)
    except (KeyError, TypeError, ValueError) as exc:
        raise DrafterFormatError(f"drafter {path}: config.json lacks or misstates {exc}") from None
    architecture = (config.get("architectures") or [None])[0]
    parent = ParentCheckpoint(path=path, config=parsed, shapes=shapes, files=tuple(files),
                              origin=ParentOrigin(format=fmt, variant=variant, architecture=architecture, notes=notes))
    _, dropped = tensor_plan(parent)  # every tensor accounted for before any weight is read
    origin = parent.origin.model_copy(update={
        "dropped_tensors": [f"{name}: {reason}" for name, reason in sorted(dropped.items())]})
    return dataclasses.replace(parent, origin=origin)


def tensor_plan(parent: ParentCheckpoint) -> tuple[dict[str, str], dict[str, str]]:
    """(each kept tensor's name in our drafter, each dropped tensor's reason); d2t and t2d are in neither (the
    draft vocabulary). A tensor no rule names is an error naming it."""
    kept, dropped, unknown = {}, {}, []
    has_d2t = "d2t" in parent.shapes
    for name in parent.shapes:
        if name in ("d2t", "t2d"):
            continue
        if BODY.match(name) or DFLASH2_PARTS.match(name):
            kept[name] = name
        elif CODEBOOK.match(name):
            kept[name] = name if name.endswith(".weight") else f"{name}.weight"  # the released spelling
        else:
            rule = next((action for pattern, action in RULES.get(parent.origin.format or "", []) if pattern.match(name)), None)
            if rule is None and name == "lm_head.weight" and has_d2t:  # vLLM's d2t layout, which our export writes
                rule = HEAD_ROWS
            if rule is None:
                unknown.append(name)
            else:
                dropped[name] = rule.removeprefix("drop:")
    if unknown:
        raise DrafterFormatError(f"drafter {parent.path} ({parent.origin.format} format) holds tensors with no "
                                 f"place in a DFlash drafter: {', '.join(sorted(unknown)[:5])}"
                                 f"{' ...' if len(unknown) > 5 else ''}")
    return kept, dropped


def draft_vocabulary(parent: ParentCheckpoint, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Sorted target ids the parent drafts among: its d2t (vLLM's and our export's layout, checked against t2d
    when both are there), else a draft_vocab.safetensors beside the weights (our training's), else None."""
    vocab_size = parent.config.vocab_size
    if "d2t" not in tensors:
        return load_draft_vocab(parent.path)
    ids = ids_from_d2t(tensors["d2t"], vocab_size, str(parent.path))
    if "t2d" in tensors and not torch.equal(tensors["t2d"].to(torch.bool).nonzero()[:, 0], ids):
        raise DrafterFormatError(f"drafter {parent.path}: its d2t and t2d name different draft vocabularies")
    return None if len(ids) == vocab_size else ids  # a map of the whole vocabulary is no draft vocabulary


def full_vocabulary_rows(name: str, rows: torch.Tensor, vocab: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """A selector codebook over the whole vocabulary. A parent that trained one row per draft token gets its rows
    at those tokens and zero elsewhere: a zero row adds no pair score, so those tokens rank by the logits alone."""
    if rows.shape[0] == vocab_size:
        return rows
    if vocab is None or rows.shape[0] != len(vocab):
        raise DrafterFormatError(f"{name} has {rows.shape[0]} rows; expected the vocabulary's {vocab_size} or the "
                                 f"draft vocabulary's {None if vocab is None else len(vocab)}")
    full = rows.new_zeros(vocab_size, rows.shape[1])
    full[vocab] = rows
    return full


def import_drafter(path: str | Path, *, num_target_layers: int | None = None, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> ImportedDrafter:
    """The drafter in `path`, whichever format wrote it, as our Drafter of the parent's own shape: every tensor
    of the folder kept under our name or dropped with its reason (origin.dropped_tensors), every part of our
    drafter filled from the folder."""
    from safetensors.torch import load_file

    from trainer.drafter.model import Drafter

    parent = read_parent(path, num_target_layers=num_target_layers)
    kept, _ = tensor_plan(parent)
    tensors: dict[str, torch.Tensor] = {}
    for file in parent.files:
        tensors.update(load_file(file))
    vocab = draft_vocabulary(parent, tensors)
    config = parent.config
    if (None if vocab is None else len(vocab)) != config.draft_vocab_size:
        raise DrafterFormatError(f"drafter {parent.path}: config.json says draft_vocab_size "
                                 f"{config.draft_vocab_size} but its d2t or {DRAFT_VOCAB_FILE} holds "
                                 f"{'none' if vocab is None else len(vocab)}")
    state = {ours: tensors[name] for name, ours in kept.items()}
    notes = list(parent.origin.notes)
    for name, ours in kept.items():
        if CODEBOOK.match(name) and state[ours].shape[0] != config.vocab_size:
            state[ours] = full_vocabulary_rows(name, state[ours], vocab, config.vocab_size)
            notes.append(f"{name}: one row per draft token, placed at those tokens of the full vocabulary")
    drafter = Drafter(config)
    try:
        missing, _ = drafter.load_state_dict(state, strict=False)  # every kept name is ours by construction
    except RuntimeError as exc:  # a shape that disagrees with the config
        raise DrafterFormatError(f"drafter {parent.path}: a tensor's shape disagrees with its config.json: "
                                 f"{str(exc).splitlines()[-1].strip()}") from None
    if missing:
        raise DrafterFormatError(f"drafter {parent.path} ({parent.origin.format} format) lacks {len(missing)} "
                                 f"tensors our drafter needs: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    drafter = drafter.to(device=device, dtype=dtype).eval()
    drafter.draft_vocab = vocab
    return ImportedDrafter(drafter=drafter, origin=parent.origin.model_copy(update={"notes": notes}))
