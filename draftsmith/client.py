"""`draftsmith.Client`: the REST API from Python, for scripts and `draftsmith submit`.

    from draftsmith import Client
    client = Client("http://127.0.0.1:8000", api_key="dsk_...")      # or DRAFTSMITH_URL / DRAFTSMITH_API_KEY
    job = client.create_job({"target": {"uri": "bundled:smollm2-135m"}})
    job = client.wait(job["id"], on_event=print)                     # follows the live event stream
    client.download(job["id"], "drafter/")                           # every artifact, checked against the manifest

Errors come back as `ApiError` carrying the problem+json body (status, detail, the fields at fault). The
event stream reconnects by itself after a dropped connection, resuming after the last event received.
Only httpx and the standard library: no ML stack needed to drive the service.

A download trusts nothing the server sends: an artifact's name must be a plain relative path that resolves
inside the download directory (`artifact_destination`), the API key goes only to the API's own origin
(`Client._get`: a presigned URL elsewhere is fetched with no key at all), and a file is renamed into place only
after its sha256 matched.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PureWindowsPath
from typing import Any

import httpx

from schemas.manifest import Manifest, sha256_file, verify_manifest
from schemas.validation_report import ValidationReport
from trainer.atomic import atomic_path

TERMINAL = {"succeeded", "failed", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"
MAX_REDIRECTS = 10
DEFAULT_PORTS = {"http": 80, "https": 443}
DOWNLOAD_TIMEOUT = httpx.Timeout(30.0, read=300.0)


class ApiError(Exception):
    def __init__(self, status: int, problem: dict[str, Any]):
        self.status, self.problem = status, problem
        errors = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in problem.get("errors") or [])
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}"
                         + (f" ({errors})" if errors and errors not in str(problem.get("detail")) else ""))


class Unreachable(Exception):
    """No answer from the server at all (refused, unresolvable, timed out): nothing was sent or changed."""


class DownloadError(Exception):
    """A download refused or failed: an artifact does not match its recorded sha256 or the manifest, its name
    would land outside the download directory, or the server named a URL that is not one to fetch."""


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when the URL names none): what must match for a request to
    carry the API key."""
    return url.scheme, url.host, url.port or DEFAULT_PORTS.get(url.scheme)


def artifact_name_problem(name: object) -> str | None:
    """Why `name` (as the server sent it) is no relative path of plain '/'-separated segments, or None."""
    if not isinstance(name, str) or not name:
        return "is empty" if name == "" else "is not a string"
    if any(ord(char) < 32 or char == "\x7f" for char in name):
        return "contains a control character (NUL, newline, ...)"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    if PureWindowsPath(name).drive:
        return "names a drive"
    segments = name.split("/")
    if ".." in segments:
        return "has a '..' segment"
    if "" in segments or "." in segments:
        return "has an empty or '.' segment"
    return None


def artifact_destination(directory: str | Path, name: object) -> Path:
    """Where artifact `name` is written below `directory`, or DownloadError naming it. The name is checked by its
    spelling (`artifact_name_problem`) and then by where it resolves: with symbolic links followed (a link already
    in the directory may point anywhere), it must lie strictly inside the resolved directory."""
    if problem := artifact_name_problem(name):
        raise DownloadError(f"artifact {name!r}: refused, its name {problem} (artifacts are written only inside "
                            "the download directory)")
    root = Path(directory).resolve()
    target = (root / name).resolve()
    if target == root or not target.is_relative_to(root):
        raise DownloadError(f"artifact {name!r}: refused, it resolves to {target}, outside {root}")
    return target


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None):
        self.url = (url or os.environ.get("DRAFTSMITH_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("DRAFTSMITH_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        # For URLs on any other origin (presigned object-storage URLs): a client of its own, so that neither the
        # key's header nor the API's cookies can be inherited by a request elsewhere.
        self.anonymous = httpx.Client(timeout=timeout, transport=transport)
        self.origin = origin(httpx.URL(self.url))
        self.timeout = httpx.Timeout(timeout)

    def close(self) -> None:
        self.http.close()
        self.anonymous.close()

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
            with self._get(artifact["download_path"], what="report.json") as response:  # S3 storage answers 307
                response.read()
        except httpx.TransportError as error:
            raise Unreachable(f"report.json of {job_id} did not arrive from {self.url} ({error})") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, _problem(response))
        return ValidationReport.read(response.json())

    # --- audits, drafters, usage -----------------------------------------------------------------------

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
        then the whole set against manifest.json where the job lists one. Raises DownloadError on any mismatch, and before writing
        anything when a name would land outside `directory`. `on_progress(artifact, bytes)` follows each chunk
        written (a progress bar: the artifact carries `size_bytes`)."""
        directory = Path(directory)
        artifacts = self.artifacts(job_id)
        try:  # every name first: one bad name, and nothing at all is written
            destinations = [artifact_destination(directory, artifact.get("name")) for artifact in artifacts]
        except DownloadError as error:
            raise DownloadError(f"{error}; nothing was downloaded") from None
        for artifact, path in zip(artifacts, destinations, strict=True):
            self._download_artifact(artifact, path, on_progress)
        # Only a manifest.json of this job's: one left in `directory` by an earlier download proves nothing.
        if lists_manifest(artifacts) and (problems := _manifest_problems(directory)):
            raise DownloadError("download does not match manifest.json: " + "; ".join(problems))
        return directory

    def _download_artifact(self, artifact: dict, path: Path, on_progress: Callable[[dict, int], None] | None) -> None:
        """One artifact to `path` (already checked): written to a temporary sibling, renamed into place only when
        its sha256 matched (trainer/atomic.py removes the sibling otherwise)."""
        name = artifact["name"]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as partial:
                with self._get(artifact.get("download_path"), what=name, timeout=DOWNLOAD_TIMEOUT) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise ApiError(response.status_code, _problem(response))
                    with partial.open("wb") as out:
                        for chunk in response.iter_bytes(1 << 20):
                            out.write(chunk)
                            if on_progress:
                                on_progress(artifact, len(chunk))
                if sha256_file(partial) != artifact.get("sha256"):
                    raise DownloadError(f"{name}: sha256 differs from the recorded {artifact.get('sha256')}; "
                                        "nothing of it was kept")
        except httpx.TransportError as error:  # cut short (a dropped connection, a stored file gone short)
            raise DownloadError(f"{name}: the transfer broke off ({error}); nothing of it was kept, run the "
                                "download again") from None
        except OSError as error:  # a name that is a file here and a folder there, a full disk
            raise DownloadError(f"{name}: cannot write {path} ({error})") from None

    @contextmanager
    def _get(self, location: object, *, what: str, timeout: httpx.Timeout | None = None) -> Iterator[httpx.Response]:
        """GET `location` (a path under the API, or a URL the server named), streamed. The API key goes only to
        the API's own origin (`origin`: scheme, host, port): a URL elsewhere (a presigned S3 URL) is fetched by
        `self.anonymous`, with no key and no cookies. Redirects are followed here, not by httpx, which keeps
        Authorization on an http->https redirect to the same host; once a redirect has left the API's origin,
        no later hop carries the key, even one that comes back."""
        url = self._absolute(location, what)
        trusted = True
        for _ in range(MAX_REDIRECTS + 1):
            trusted = trusted and origin(url) == self.origin
            client = self.http if trusted else self.anonymous
            with client.stream("GET", url, follow_redirects=False, timeout=timeout or self.timeout) as response:
                if not response.is_redirect:
                    yield response
                    return
                url = self._absolute(response.headers["location"], what, base=url)
        raise DownloadError(f"{what}: more than {MAX_REDIRECTS} redirects")

    def _absolute(self, location: object, what: str, *, base: httpx.URL | None = None) -> httpx.URL:
        """`location` as an http(s) URL: a redirect's relative to the URL that answered it; the server's own
        download path below the base URL, as httpx joins a path to `base_url`."""
        if not isinstance(location, str) or not location:
            raise DownloadError(f"{what}: the server gave no download path")
        try:
            given = httpx.URL(location)
        except httpx.InvalidURL as error:
            raise DownloadError(f"{what}: the server named {location!r} to download from ({error})") from None
        if base is not None:
            url = base.join(given)
        elif given.scheme or given.host:  # a URL of its own, or '//host/path'
            url = httpx.URL(self.url).join(given)
        else:
            url = httpx.URL(f"{self.url}/{location.lstrip('/')}")
        if url.scheme not in DEFAULT_PORTS or not url.host:
            raise DownloadError(f"{what}: the server named {location!r} to download from, not an http(s) URL")
        return url


MANIFEST_NAME = Manifest.FILE


def lists_manifest(artifacts: list[dict]) -> bool:
    """Whether the job's artifacts include manifest.json, against which a download checks the whole set."""
    return any(artifact.get("name") == MANIFEST_NAME for artifact in artifacts)


def _manifest_problems(directory: Path) -> list[str]:
    """verify_manifest's problems, after checking that manifest.json (a file the server sent) is a manifest whose
    paths all stay inside `directory`: verification reads every file it lists."""
    try:
        names = list(Manifest.load(directory / Manifest.FILE).files)
    except ValueError:  # not JSON, or not the model's shape (pydantic's ValidationError is a ValueError)
        return ["manifest.json is not a manifest ({\"files\": {path: {\"sha256\", \"bytes\"}}})"]
    try:
        for name in names:
            artifact_destination(directory, name)
        return verify_manifest(directory)
    except DownloadError as error:
        return [f"manifest.json lists {error}"]


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
