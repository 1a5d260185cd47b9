"""A warm start's before and after, as words: the rows and the advice that report.html, the model card and the CLI
show from report.json's `warm_start` (schemas/validation_report.py `WarmStart`). One wording for all of them, so the
card never says "serve it" where the report says "keep the parent"."""

from __future__ import annotations

from schemas.validation_report import DrafterAdapterFigures, PairedGain, TauAtTemperature, WarmStart


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{round(value, digits):g}"


def _interval(ci: list[float] | None) -> str:
    return f" [{_num(ci[0])}, {_num(ci[1])}]" if ci and len(ci) == 2 else ""


def tau_with_interval(figure: TauAtTemperature | None) -> str:
    if figure is None or figure.tau is None:
        return "–"
    return f"{_num(figure.tau)}{_interval(figure.ci95)}"


def gain_with_interval(gain: PairedGain | None) -> str:
    if gain is None or gain.ratio is None:
        return "–"
    return f"{_num(gain.ratio)}x{_interval(gain.ci95)}"


def before_after_rows(warm_start: WarmStart) -> list[tuple[str, str, str, str]]:
    """(setting, parent tau [95 % interval], new tau [interval], paired ratio new/parent [interval]): at T=0, then
    at the job's own sampling parameters unless the job is greedy (the same figure). Empty for a report written
    before the paired measurement existed."""
    rows = []
    if warm_start.gain_greedy is not None:
        rows.append(("T=0 (greedy)", tau_with_interval(warm_start.parent_tau_greedy),
                     tau_with_interval(warm_start.tau_greedy), gain_with_interval(warm_start.gain_greedy)))
    sampled = warm_start.tau_sampled
    if warm_start.gain_sampled is not None and not (sampled is not None and sampled.same_as_greedy):
        at = f"T={_num(warm_start.gain_sampled.temperature)}"
        if sampled is not None:
            at += f", top-p {_num(sampled.top_p)}, top-k {sampled.top_k} (the job's)"
        rows.append((at, tau_with_interval(warm_start.parent_tau_sampled), tau_with_interval(sampled),
                     gain_with_interval(warm_start.gain_sampled)))
    return rows


def advice_text(warm_start: WarmStart) -> str:
    """The serving advice in one sentence: keep the parent, or serve the new drafter, and why."""
    if warm_start.advice_reason:
        reason = warm_start.advice_reason
        return reason[0].upper() + reason[1:] + ("" if reason.endswith(".") else ".")
    if warm_start.advice == "keep_parent":
        return "Keep serving the parent: the gain's 95 % interval does not lie above 1."
    if warm_start.advice == "serve_new":
        return "Serve the new drafter: it beats its parent."
    return ""


def parent_text(warm_start: WarmStart) -> str:
    """The parent's origin and format, and what the warm start upgraded or dropped, as far as prepare recorded
    them."""
    parent = warm_start.parent
    if parent is None:
        return ""
    text = f"`{parent.name}`" if parent.name else "the parent"
    kind = ", ".join(part for part in (parent.format and f"{parent.format} format", parent.variant) if part)
    if kind:
        text += f" ({kind})"
    if parent.upgrades:
        text += "; upgraded: " + "; ".join(parent.upgrades)
    if parent.dropped_tensors:
        text += "; dropped: " + "; ".join(parent.dropped_tensors)
    if parent.notes:
        text += "; note: " + "; ".join(parent.notes)
    return text


def _size(count: int | None) -> str:
    return "–" if count is None else f"{count:,}"


def _megabytes(size: int | None) -> str:
    return "–" if size is None else f"{size / 1e6:.3g} MB"


def adapter_text(warm_start: WarmStart) -> str:
    """A drafter adapter job's line (report.json `warm_start.adapter`): the LoRA's rank and size against the whole
    drafter's, and which drafter the taus measure (the merged one, the one to serve); empty for a full warm start."""
    adapter: DrafterAdapterFigures | None = warm_start.adapter
    if adapter is None:
        return ""
    share = "" if adapter.trainable_share is None else f" ({100 * adapter.trainable_share:.3g} % of the drafter's " \
        f"{_size(adapter.drafter_parameters)})"
    alpha = "" if adapter.alpha is None else f", alpha {adapter.alpha:g}"
    return (f"Trained as a drafter adapter (preview): a rank-{adapter.rank} LoRA{alpha} over the parent's layers and "
            f"projection, {_size(adapter.trainable_parameters)} parameters{share}, {_megabytes(adapter.bytes)} in "
            f"`{adapter.folder or 'drafter-adapter'}/` against {_megabytes(adapter.drafter_bytes)} for the drafter. "
            "The taus here are the adapter merged into its parent (`drafter/`, the drafter to serve: no engine loads "
            "drafter adapters yet); bench/specialise.py sets it against a full specialisation at the same budget.")
