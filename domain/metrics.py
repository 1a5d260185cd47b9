"""A job's metric series as the API serves them: each series whole, or downsampled to at most `max_points`.

The worker writes the points (domain/runs.py `record_metrics`); `GET /v1/jobs/{id}/metrics` reads them here. A
series with more points than `max_points` in the step range is split into at most `max_points` equal step buckets,
each reported as its mean value at its last step, computed in SQL (a long run holds millions of points).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, select, true

from domain.errors import FieldError, InvalidRequest, NotFound
from domain.models import Job, MetricPoint


@dataclass(frozen=True)
class Series:
    """One metric's points ({"step": int, "value": float | None}, by step), how many it has in the range, and
    whether `points` are bucket means rather than the points themselves."""

    name: str
    points: list[dict[str, Any]]
    total_points: int
    downsampled: bool


@functools.lru_cache(maxsize=16)
def _metrics_queries(step_max: bool, names: bool) -> tuple[Select[*tuple[Any, ...]], Select[*tuple[Any, ...]], Select[*tuple[Any, ...]], list[Any]]:
    """The statements of `metric_series` for one shape of filters, built once (values are bound parameters): the
    job's check with the series' statistics, every point of the series, and of some of them; and the filters."""
    conditions = [MetricPoint.job_id == bindparam("job_id"), MetricPoint.step >= bindparam("step_min")]
    if step_max:
        conditions.append(MetricPoint.step <= bindparam("step_max"))
    if names:
        conditions.append(MetricPoint.name.in_(bindparam("names", expanding=True)))
    # The job's check and the series' statistics in one round trip: the statistics (a derived table) LEFT JOINed
    # to the organisation's job row; no row at all is the 404, one row without a name a job without such points.
    stats = (
        select(MetricPoint.name.label("name"), func.count().label("count"), func.min(MetricPoint.step).label("low"),
               func.max(MetricPoint.step).label("high"))
        .where(*conditions).group_by(MetricPoint.name).subquery("stats")
    )
    found = (
        select(Job.id, stats.c.name, stats.c.count, stats.c.low, stats.c.high)
        .select_from(Job).outerjoin(stats, true())
        .where(Job.id == bindparam("job_id"), Job.org_id == bindparam("org_id")).order_by(stats.c.name)
    )
    points = select(MetricPoint.name, MetricPoint.step, MetricPoint.value).where(*conditions)
    order = (MetricPoint.name, MetricPoint.step, MetricPoint.id)
    return (found, points.order_by(*order),
            points.where(MetricPoint.name.in_(bindparam("whole", expanding=True))).order_by(*order), conditions)


def metric_series(db: Connection, org_id: str, job_id: str, name: list[str] | None, step_min: int,
                  step_max: int | None, max_points: int) -> list[Series]:
    """The organisation's job's series (all, or those named), by name; 404 for another organisation's job, 422
    for `step_max < step_min`."""
    found_query, all_points, some_points, conditions = _metrics_queries(step_max is not None, bool(name))
    params = {"job_id": job_id, "org_id": org_id, "step_min": step_min, "step_max": step_max, "names": name}
    found = db.execute(found_query, params).all()
    if not found:
        raise NotFound(f"no job {job_id!r} in your organisation")
    if step_max is not None and step_max < step_min:
        raise InvalidRequest("step_max must be >= step_min",
                             errors=[FieldError(field="step_max", message="must be >= step_min")])
    stats = [(metric, count, low, high) for _, metric, count, low, high in found if metric is not None]
    # Every series short enough to send whole comes from one query (not one per series), grouped here by name.
    whole = [metric for metric, count, _, _ in stats if count <= max_points]
    points_of: dict[str, list[dict[str, Any]]] = {metric: [] for metric in whole}
    if whole:
        query = all_points if len(whole) == len(stats) else some_points
        # .all(): one fetch of every row (iterating a result fetches row by row, a third of this route's CPU).
        # A whole series' rows are already an int step and a float (or null) value.
        for metric, step, value in db.execute(query, {**params, "whole": whole}).all():
            points_of[metric].append({"step": step, "value": value})
    series = []
    for metric, count, low, high in stats:
        if count <= max_points:
            series.append(Series(metric, points_of[metric], count, downsampled=False))
            continue
        # Integer bucket index computed in SQL on both databases. `//` is SQLAlchemy's floor
        # division; plain `/` is true division since SQLAlchemy 2.0 and would round buckets.
        width = -(-(high - low + 1) // max_points)
        bucket = (MetricPoint.step - low) // width
        rows = db.execute(
            select(func.max(MetricPoint.step), func.avg(MetricPoint.value))
            .where(*conditions, MetricPoint.name == metric).group_by(bucket).order_by(func.max(MetricPoint.step)),
            params,
        ).all()
        series.append(Series(metric, [{"step": int(step), "value": None if value is None else float(value)}
                                      for step, value in rows], count, downsampled=True))
    return series
