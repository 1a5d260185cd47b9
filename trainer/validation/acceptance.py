"""Acceptance statistics as serving engines count them, from speculative decoding cycles.

tau: mean tokens committed per target verify pass, bonus included (SGLang / the reference package).
Per-position conditional acceptance alpha_k: P(draft k accepted | drafts 1..k-1 accepted).
Oracle tau: the acceptance a perfect choice among the drafter's top-K would reach: per cycle, the longest
prefix of block positions whose target token is anywhere in that position's top-K (greedy only, where the
target's tokens are the known output).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from trainer.speculative import Cycle


@dataclass
class AcceptanceStats:
    block_size: int
    cycles: int = 0
    emitted: int = 0
    reached: list[int] = field(default_factory=list)
    """reached[k-1]: cycles that offered draft k with drafts 1..k-1 all accepted."""
    accepted_at: list[int] = field(default_factory=list)
    """accepted_at[k-1]: of those, cycles that accepted draft k."""
    offered_at: list[int] = field(default_factory=list)
    """offered_at[k-1]: cycles that offered a draft k at all (the denominator of unconditional acceptance)."""
    oracle_cycles: int = 0
    oracle_emitted: int = 0

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * (self.block_size - 1)
        self.accepted_at = self.accepted_at or [0] * (self.block_size - 1)
        self.offered_at = self.offered_at or [0] * (self.block_size - 1)

    def add(self, tokens: list[int], cycles: list[Cycle]) -> None:
        for cycle in cycles:
            self.cycles += 1
            self.emitted += cycle.emitted
            for k in range(1, cycle.offered + 1):
                self.offered_at[k - 1] += 1
            for k in range(1, cycle.offered + 1):
                if k > cycle.accepted + 1:
                    break
                self.reached[k - 1] += 1
                self.accepted_at[k - 1] += k <= cycle.accepted
            if cycle.candidates is not None:
                self.oracle_cycles += 1
                self.oracle_emitted += 1 + _oracle_accepted(tokens, cycle)

    @property
    def tau(self) -> float:
        return self.emitted / max(self.cycles, 1)

    @property
    def per_position(self) -> list[float | None]:
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached, strict=True)]

    def by_position(self) -> list[dict]:
        """Per draft position k: the counts behind the conditional acceptance (a late position's 1.0 may rest on
        two cycles), and the unconditional acceptance P(drafts 1..k all accepted)."""
        return [{"position": k, "reached": reached, "accepted": accepted, "offered": offered,
                 "conditional": round(accepted / reached, 4) if reached else None,
                 "unconditional": round(accepted / offered, 4) if offered else None}
                for k, (reached, accepted, offered) in enumerate(
                    zip(self.reached, self.accepted_at, self.offered_at, strict=True), start=1)]

    @property
    def oracle_tau(self) -> float | None:
        return self.oracle_emitted / self.oracle_cycles if self.oracle_cycles else None

    def expected_tau(self, block_size: int) -> float:
        """tau with a smaller verify window, from the conditional acceptances (the drafts of the first
        positions barely change when fewer mask tokens follow them)."""
        tau, survive = 1.0, 1.0
        for alpha in self.per_position[:block_size - 1]:
            survive *= alpha or 0.0
            tau += survive
        return tau


def _oracle_accepted(tokens: list[int], cycle: Cycle) -> int:
    accepted = 0
    for k, candidates in enumerate(cycle.candidates, start=1):
        index = cycle.anchor_index + k
        if index >= len(tokens) or tokens[index] not in candidates:
            break
        accepted += 1
    return accepted


class CategoryStats:
    """AcceptanceStats overall and per prompt category."""

    def __init__(self, block_size: int):
        self.overall = AcceptanceStats(block_size)
        self.by_category: dict[str, AcceptanceStats] = defaultdict(lambda: AcceptanceStats(block_size))

    def add(self, category: str, tokens: list[int], cycles: list[Cycle]) -> None:
        self.overall.add(tokens, cycles)
        self.by_category[category].add(tokens, cycles)

    def acceptance_by_category(self) -> dict[str, dict]:
        return {name: {"tau": round(stats.tau, 4), "cycles": stats.cycles}
                for name, stats in sorted(self.by_category.items())}
