"""The path one job id takes through the code: a real job (a tiny BPE target, every stage, in this process:
`run_job` on PostgreSQL with local storage) run under a profiler that records each call of our own packages whose
arguments carry the job (its id, a row or object whose `id`/`job_id` is it, or a storage key holding it).

What it counts: stops (functions) and files on the path, then the distinct links between files (a caller's file ->
a callee's file: a loop over stages or steps is one link, and splitting a function inside a file changes nothing),
the links between top-level packages (moves), and per file how many other files enter it. Callbacks count: the
trainer calling back into the worker's progress reporter is a move as much as the worker calling the trainer. Fewer moves and re-entries mean a reader follows a job
without going back and forth between rooms. The bounds are what the code achieves today: a change that makes the
path longer fails here, and says where (`pytest -s` prints the whole path).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePath

import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database
from tiny_targets import make_bpe_target
from worker_harness import tiny_spec

from domain.queue import all_queues

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "domain", "worker", "trainer", "schemas", "kernels")
MAX_MOVES = 16
"""Links between packages today (22 before the worker read a job's records through one door each, 18 on
2026-12-06): the goal is 12."""
MAX_ENTRIES = 10
"""The most other files entering one file today (trainer/atomic.py, the atomic writes every stage makes)."""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Iterator[Harness]:
    from migrations.revisions import upgrade

    url, drop = fresh_postgres_database("draftsmith_job_path")
    upgrade(url)
    models = tmp_path_factory.mktemp("models")
    make_bpe_target(models / "bpe", num_layers=4)
    try:
        settings = make_settings(url, tmp_path_factory.mktemp("storage"), allowed_file_roots=[str(models)],
                                 worker_cache_dir=str(tmp_path_factory.mktemp("worker-cache")))
        yield from build_harness(settings)
    finally:
        drop()


def _carries(value: object, job_id: str, depth: int = 1) -> bool:
    """The job's id itself, a string or path holding it (a storage key, the job's local folder), or one of our own
    objects (a row, a layout, a run config) holding one of those in a field."""
    if isinstance(value, str | PurePath):
        return job_id in str(value)
    if depth == 0 or not type(value).__module__.startswith(PACKAGES):
        return False
    try:
        fields = vars(value)
    except TypeError:  # slots or a C type: nothing to read
        return False
    return any(_carries(field, job_id, depth - 1) for field in list(fields.values()))


class JobPath:
    """The calls of our packages that carry `job_id`, each linked to the nearest such call above it."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.recorded: dict[int, str] = {}  # id(frame) -> stop, for frames alive on the stack
        self.edges: dict[tuple[str, str], None] = {}  # ordered, distinct
        self.first: list[str] = []
        self.stops: dict[object, str | None] = {}  # code object -> its stop (None: not ours); the profiler is hot

    def stop_of(self, frame) -> str | None:
        code = frame.f_code
        if code not in self.stops:
            path = Path(code.co_filename)
            ours = path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PACKAGES
            self.stops[code] = f"{path.relative_to(ROOT).as_posix()}:{code.co_qualname}" if ours else None
        return self.stops[code]

    def __call__(self, frame, event, _arg) -> None:
        if event == "return":
            self.recorded.pop(id(frame), None)
            return
        if event != "call" or (stop := self.stop_of(frame)) is None:
            return
        if not any(_carries(value, self.job_id) for value in list(frame.f_locals.values())):
            return
        caller, above = None, frame.f_back
        while above is not None and caller is None:
            caller = self.recorded.get(id(above))
            above = above.f_back
        self.recorded[id(frame)] = stop
        if stop not in self.first:
            self.first.append(stop)
        if caller is not None and caller != stop:
            self.edges.setdefault((caller, stop), None)

    def figures(self) -> dict:
        """Counted between files, so that splitting a function inside one file changes nothing."""
        def file(stop: str) -> str:
            return stop.split(":")[0]

        links = {(file(a), file(b)) for a, b in self.edges if file(a) != file(b)}
        return {"stops": len(self.first), "files": len({file(s) for s in self.first}), "links": len(links),
                "moves": sorted((a, b) for a, b in links if a.split("/")[0] != b.split("/")[0]),
                "entries": Counter(b for _, b in links)}


def test_one_job_ids_path_through_the_code(harness, capsys):
    from worker.context import WorkerContext
    from worker.runner import Outcome, run_job

    org = harness.new_org()
    models = harness.settings.allowed_file_roots[0]
    job_id = harness.create_job(org, tiny_spec(f"file://{models}/bpe"))["id"]
    ctx = WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))
    path = JobPath(job_id)
    sys.setprofile(path)
    try:
        outcome = run_job(ctx, job_id, lambda job, stage: None)
    finally:
        sys.setprofile(None)
    assert outcome is Outcome.SUCCEEDED, harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json().get("error")
    figures = path.figures()
    with capsys.disabled():
        print(f"\njob id path: {figures['stops']} stops in {figures['files']} files, {figures['links']} links between "
              f"files, {len(figures['moves'])} of them between packages; files entered from most others: "
              f"{figures['entries'].most_common(6)}")
        for caller, callee in figures["moves"]:
            print(f"  {caller} -> {callee}")
    assert figures["stops"] > 10 and "worker/runner.py:run_job" in path.first  # the profiler saw the job
    assert len(figures["moves"]) <= MAX_MOVES, figures["moves"]
    assert max(figures["entries"].values()) <= MAX_ENTRIES, figures["entries"].most_common(5)
