"""What the browser tests do again and again: sign in, check that a chart was really drawn, run axe-core,
save a screenshot.

axe-core 4.14.1 is vendored under vendor/ (see vendor/README.md); it is evaluated in the page through
the DevTools protocol, which the page's Content-Security-Policy does not apply to, so the page under
test runs with its real policy.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_DIR = Path(os.environ.get("DRAFTSMITH_TEST_OUTPUT", ROOT / "test-output")) / "dashboard"
AXE_SOURCE = (Path(__file__).parent / "vendor" / "axe.min.js").read_text(encoding="utf-8")
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]  # colour contrast, labels, names, keyboard basics
SAVED: list[Path] = []  # listed at the end of the pytest run (conftest.pytest_terminal_summary)
TIMEOUT_MS = 15_000


def sign_in(page, key: str, route: str = "/") -> None:  # noqa: ANN001 - a Playwright page
    page.goto(route)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("main:not([data-view=signIn])", timeout=TIMEOUT_MS)


def drawn_pixels(page, figure_id: str) -> int:  # noqa: ANN001
    """Non-blank pixels on the data canvas of figure[data-chart=figure_id] (0: nothing drawn)."""
    return page.evaluate(
        """(id) => {
            const canvas = document.querySelector(`figure[data-chart="${id}"] canvas`);
            if (!canvas || !canvas.width || !canvas.height) return 0;
            const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let count = 0;
            for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) count++;
            return count;
        }""",
        figure_id,
    )


def series_labels(page, figure_id: str) -> list[str]:  # noqa: ANN001
    """The legend's series names of a chart (uPlot writes one legend row per series, x first)."""
    return page.eval_on_selector_all(f'figure[data-chart="{figure_id}"] .u-legend .u-series .u-label',
                                     "nodes => nodes.map(n => n.textContent)")[1:]


def axe_violations(page) -> list[dict]:  # noqa: ANN001
    """axe-core's WCAG 2.1 A/AA violations on the current page, as {id, impact, help, targets}."""
    page.evaluate(AXE_SOURCE)
    result = page.evaluate("(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags}})", AXE_TAGS)
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "targets": [node["target"] for node in v["nodes"]][:5]} for v in result["violations"]]


def screenshot(page, name: str) -> Path:  # noqa: ANN001
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUTPUT_DIR / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SAVED.append(path)
    return path


def legend_text(page, figure_id: str) -> str:  # noqa: ANN001
    """What a line chart's legend reads (series names and their values)."""
    return page.inner_text(f'figure[data-chart="{figure_id}"] .u-legend')


def bar_texts(page, figure_id: str, column: int = 0) -> list[str]:  # noqa: ANN001
    """The text on each bar of a bar chart's `column`, row by row (the first series' bar of each row)."""
    return page.evaluate(
        """([id, column]) => {
            const grid = document.querySelector(`figure[data-chart="${id}"] .ds-bars`);
            const columns = grid.style.gridTemplateColumns.match(/repeat\\((\\d+)/)[1] * 1;
            const cells = [...grid.querySelectorAll(".ds-bars-cell")];
            return cells.filter((_, i) => i % columns === column).map((c) => c.querySelector(".ds-bar-text").textContent);
        }""",
        [figure_id, column],
    )


def overlapping(page, selector: str) -> list[list[str]]:  # noqa: ANN001
    """Pairs of visible elements matching `selector` whose boxes overlap (by more than half a pixel)."""
    return page.evaluate(
        """(selector) => {
            const boxes = [...document.querySelectorAll(selector)].filter((n) => n.offsetParent)
              .map((n) => [n.textContent, n.getBoundingClientRect()]);
            const pairs = [];
            for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
              const [a, b] = [boxes[i][1], boxes[j][1]];
              if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
                  Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5) pairs.push([boxes[i][0], boxes[j][0]]);
            }
            return pairs;
        }""",
        selector,
    )
