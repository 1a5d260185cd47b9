"""`draftsmith.Client`: the REST API from Python, for scripts and `draftsmith submit`.

    from draftsmith import Client
    client = Client("http://127.0.0.1:8000", api_key="dsk_...")      # or DRAFTSMITH_URL / DRAFTSMITH_API_KEY
    job = client.create_job({"target": {"uri": "bundled:smollm2-135m"}})
    job = client.wait(job["id"], on_event=print)                     # follows the live event stream
    client.download(job["id"], "drafter/")                           # every artifact, checked against the manifest

Errors come back as `ApiError` carrying the problem+json body (status, detail, the fields at fault). The
event stream reconnects by itself after a dropped connection, resuming after the last event received.
Only httpx and the standard library: no ML stack needed to drive the service.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from schemas.manifest import sha256_file, verify_manifest
from schemas.validation_report import ValidationReport
from trainer.atomic import atomic_path

TERMINAL = {"succeeded", "failed", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"


class ApiError(Exception):
    def __init__(self, status: int, problem: dict[str, Any]):
        self.status, self.problem = status, problem
        errors = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in problem.get("errors") or [])
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}"
                         + (f" ({errors})" if errors and errors not in str(problem.get("detail")) else ""))


class Unreachable(Exception):
    """No answer from the server at all (refused, unresolvable, timed out): nothing was sent or changed."""


class DownloadError(Exception):
    """A downloaded artifact does not match its recorded sha256 or the manifest."""


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0):
        self.url = (url or os.environ.get("DRAFTSMITH_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("DRAFTSMITH_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise Unreachable(f"cannot reach the Draftsmith server at {self.url} ({error or type(error).__name__}); "
                              "start one with `draftsmith serve`, or pass --url (env DRAFTSMITH_URL)") from None
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"title": response.reason_phrase, "detail": response.text[:500]}
            raise ApiError(response.status_code, problem)
        return response.json() if response.content else None

    # --- jobs ---------------------------------------------------------------------------------------

    def create_job(self, spec: dict, *, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=spec, headers=headers)

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def resume(self, job_id: str) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/resume")

    def jobs(self, *, status: list[str] | tuple[str, ...] = (), labels: dict[str, str] | None = None, limit: int = 20,
             after: str | None = None) -> dict:
        """One page of GET /v1/jobs, newest first: {"data": [...], "has_more", "next_cursor"} (pass next_cursor
        back as `after`). `status`: any of these; `labels`: all of these."""
        params: list[tuple[str, str | int]] = [("limit", limit), *(("status", s) for s in status),
                                               *(("label", f"{k}:{v}") for k, v in (labels or {}).items())]
        if after:
            params.append(("after", after))
        return self._call("GET", "/v1/jobs", params=params)

    def artifacts(self, job_id: str) -> list[dict]:
        return self._call("GET", f"/v1/jobs/{job_id}/artifacts")["data"]

    def report(self, job_id: str) -> ValidationReport | None:
        """The job's validation report (report.json, typed: tau, speedup, `serving_advice`;
        schemas/validation_report.py), or None before validation has written one."""
        artifact = next((a for a in self.artifacts(job_id) if a["name"] == "report.json"), None)
        if artifact is None:
            return None
        try:
            response = self.http.get(artifact["download_path"], follow_redirects=True)  # S3 storage answers 307
        except httpx.TransportError as error:
            raise Unreachable(f"report.json of {job_id} did not arrive from {self.url} ({error})") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, _problem(response))
        return ValidationReport.read(response.json())

    # --- audits, drafters, usage (issue 12) -------------------------------------------------------------

    def create_audit(self, spec: dict) -> dict:
        return self._call("POST", "/v1/audits", json=spec)

    def audit(self, audit_id: str) -> dict:
        return self._call("GET", f"/v1/audits/{audit_id}")

    def wait_audit(self, audit_id: str, *, poll_seconds: float = 2.0, timeout: float | None = None) -> dict:
        """Poll the audit until it succeeds or fails; return it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            audit = self.audit(audit_id)
            if audit["status"] in ("succeeded", "failed"):
                return audit
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"audit {audit_id} still {audit['status']} after {timeout:.0f} s")
            time.sleep(poll_seconds)

    def drafters(self, *, job_id: str | None = None, target_uri: str | None = None, limit: int = 20) -> list[dict]:
        params = {"limit": limit, **({"job_id": job_id} if job_id else {}), **({"target_uri": target_uri}
                                                                              if target_uri else {})}
        return self._call("GET", "/v1/drafters", params=params)["data"]

    def drafter(self, drafter_id: str) -> dict:
        return self._call("GET", f"/v1/drafters/{drafter_id}")

    def usage(self, period: str | None = None) -> dict:
        return self._call("GET", "/v1/usage", params={"period": period} if period else {})

    # --- following a job ------------------------------------------------------------------------------

    def events(self, job_id: str, *, after: int | None = None, reconnect_seconds: float = 1.0) -> Iterator[dict]:
        """Every event of the job from `after` on, live, until the job ends. Reconnects after a dropped
        connection with Last-Event-ID, so nothing is skipped or repeated."""
        last = after
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                with self.http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                                      timeout=httpx.Timeout(30.0, read=None)) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        raise ApiError(response.status_code, response.json())
                    for kind, event_id, data in _sse_messages(response.iter_lines()):
                        if kind == "end":
                            return
                        if data is not None:
                            last = int(event_id) if event_id else last
                            yield json.loads(data)
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass  # dropped: reconnect below, after the last event received
            if self.job(job_id)["status"] in TERMINAL and not self._has_events_after(job_id, last):
                return
            time.sleep(reconnect_seconds)

    def _has_events_after(self, job_id: str, after: int | None) -> bool:
        params = {"limit": 1, **({"after": after} if after is not None else {})}
        return bool(self._call("GET", f"/v1/jobs/{job_id}/events", params=params)["data"])

    def wait(self, job_id: str, *, on_event: Callable[[dict], None] | None = None) -> dict:
        """Follow the job until it succeeds, fails or is cancelled; return the final job."""
        for event in self.events(job_id):
            if on_event:
                on_event(event)
        return self.job(job_id)

    # --- artifacts ------------------------------------------------------------------------------------

    def download(self, job_id: str, directory: str | Path, *,
                 on_progress: Callable[[dict, int], None] | None = None) -> Path:
        """Every artifact of the job into `directory` (same relative names), each checked against its sha256,
        then the whole set against manifest.json. Raises DownloadError on any mismatch. `on_progress(artifact,
        bytes)` follows each chunk written (a progress bar: the artifact carries `size_bytes`)."""
        directory = Path(directory)
        for artifact in self.artifacts(job_id):
            path = directory / artifact["name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as partial:  # removed unless it is whole and checked (trainer/atomic.py)
                try:
                    with self.http.stream("GET", artifact["download_path"], follow_redirects=True,
                                          timeout=httpx.Timeout(30.0, read=300.0)) as response:
                        if response.status_code >= 400:
                            response.read()
                            raise ApiError(response.status_code, _problem(response))
                        with partial.open("wb") as out:
                            for chunk in response.iter_bytes(1 << 20):
                                out.write(chunk)
                                if on_progress:
                                    on_progress(artifact, len(chunk))
                except httpx.TransportError as error:  # cut short (a dropped connection, a stored file gone short)
                    raise DownloadError(f"{artifact['name']}: the transfer broke off ({error}); nothing of it was "
                                        "kept, run the download again") from None
                if sha256_file(partial) != artifact["sha256"]:
                    raise DownloadError(f"{artifact['name']}: sha256 differs from the recorded {artifact['sha256']}")
        if (directory / "manifest.json").is_file() and (problems := verify_manifest(directory)):
            raise DownloadError("download does not match manifest.json: " + "; ".join(problems))
        return directory


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The problem+json body of an error answer; a proxy's HTML page becomes its status line and text."""
    try:
        return response.json()
    except ValueError:
        return {"title": response.reason_phrase, "detail": response.text[:500]}


def _sse_messages(lines: Iterator[str]) -> Iterator[tuple[str | None, str | None, str | None]]:
    """(event type, id, data) per Server-Sent Events message; comments (keep-alives) skipped."""
    kind = event_id = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data or kind:
                yield kind, event_id, "\n".join(data) if data else None
            kind, event_id, data = None, None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "id":
                event_id = value
            elif field == "event":
                kind = value
