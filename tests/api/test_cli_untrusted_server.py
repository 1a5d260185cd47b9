"""`draftsmith download` trusts nothing the server sends: artifact names stay inside --out, the API key goes only
to the API's own origin, and a file is renamed into place only once its sha256 matched.

The server here is a fake, on purpose: the real API never sends these answers (its artifact names are storage keys
of plain segments, its download paths are its own), so a hostile or compromised server is played by a small app on
loopback (`hostile`), with a second one on another port standing in for object storage (another origin, as a
presigned S3 URL is). Both are real HTTP servers (uvicorn, tests/api/live_server.py), so what the CLI sends is what
arrives; each request's headers are recorded. tests/api/test_cli_jobs.py runs the same command against the real API.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from live_server import live_server

from draftsmith.cli import main
from draftsmith.client import Client, DownloadError, artifact_destination, artifact_name_problem, origin

JOB = "job_01JHOSTILEHOSTILEHOSTILE00"
KEY = "dsk_for_the_api_only_0123456789"
GOOD = b"a drafter's bytes"


@dataclass
class Hostile:
    """What the fake servers answer, set by each test, and every request they received."""

    api: str = ""
    storage: str = ""
    job: dict = field(default_factory=dict)
    artifacts: list[dict] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # path -> bytes, on either server
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location, on either server
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # (server, path, headers)

    def reset(self) -> None:
        self.job = {"id": JOB, "status": "succeeded", "stage": "publish", "stage_progress": 100.0, "error": None}
        self.artifacts, self.files, self.redirects, self.seen = [], {}, {}, []

    def serve(self, name: str, data: bytes, path: str, *, sha256: str | None = None) -> None:
        """List artifact `name` with `path` to download it from; `data` is what its sha256 promises."""
        self.artifacts.append({"name": name, "kind": "file", "size_bytes": len(data), "download_path": path,
                               "sha256": sha256 or hashlib.sha256(data).hexdigest()})

    def headers_at(self, server: str) -> list[dict[str, str]]:
        return [headers for where, _, headers in self.seen if where == server]

    def paths_at(self, server: str) -> list[str]:
        return [path for where, path, _ in self.seen if where == server]


def hostile_app(state: Hostile, server: str) -> FastAPI:
    app = FastAPI()

    @app.get("/{path:path}")
    def answer(path: str, request: Request) -> Response:
        path = request.url.path
        state.seen.append((server, path, dict(request.headers)))
        if server == "api" and path == f"/v1/jobs/{JOB}":
            return JSONResponse(state.job)
        if server == "api" and path == f"/v1/jobs/{JOB}/artifacts":
            response = JSONResponse({"data": state.artifacts})
            response.set_cookie("session", "api-cookie")  # must not travel to another origin either
            return response
        if path in state.redirects:
            return RedirectResponse(state.redirects[path], status_code=307)
        if path in state.files:
            return Response(state.files[path], media_type="application/octet-stream")
        return JSONResponse({"title": "Not Found", "detail": path}, status_code=404)

    return app


@pytest.fixture(scope="module")
def servers() -> Iterator[Hostile]:
    state = Hostile()
    with live_server(hostile_app(state, "api")) as api, live_server(hostile_app(state, "storage")) as storage:
        state.api, state.storage = api, storage
        yield state


@pytest.fixture
def hostile(servers: Hostile) -> Hostile:
    servers.reset()
    return servers


def download(state: Hostile, out: Path):  # noqa: ANN201
    return CliRunner().invoke(main, ["download", JOB, "--url", state.api, "--api-key", KEY, "--out", str(out)],
                              catch_exceptions=False)


def files_below(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir()) if path.exists() else []


BAD_NAMES = ["../escaped.bin", "drafter/../../escaped.bin", "..", "..\\escaped.bin", "drafter\\..\\..\\x.bin",
             "C:/escaped.bin", "c:escaped.bin", "drafter/x\x00.bin", "", ".", "drafter//x.bin", "drafter/./x.bin",
             "drafter/", "line\nbreak.bin"]


@pytest.mark.parametrize("name", BAD_NAMES + ["ABSOLUTE"])
def test_a_name_outside_out_is_refused_and_nothing_is_written(hostile: Hostile, tmp_path: Path, name: str):
    out, outside = tmp_path / "a" / "out", tmp_path / "outside"
    if name == "ABSOLUTE":  # an absolute path, spelled to land in a folder the test watches
        name = str(outside / "escaped.bin")
    hostile.serve("drafter/model.safetensors", GOOD, "/files/good")  # listed first: still not written
    hostile.serve(name, GOOD, "/files/bad")
    hostile.files.update({"/files/good": GOOD, "/files/bad": GOOD})

    result = download(hostile, out)

    assert result.exit_code == 1, result.output
    assert f"artifact {name!r}: refused" in result.stderr and "nothing was downloaded" in result.stderr
    assert files_below(tmp_path) == []  # nothing anywhere: not in --out, not beside it, not in `outside`
    assert not any(path.startswith("/files/") for path in hostile.paths_at("api"))  # not even fetched


def test_a_name_through_a_symlink_is_checked_where_it_resolves(hostile: Hostile, tmp_path: Path):
    """`drafter/x.bin` is spelled well, but --out/drafter is a link to a folder elsewhere."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "drafter").symlink_to(elsewhere)
    hostile.serve("drafter/x.bin", GOOD, "/files/x")
    hostile.files["/files/x"] = GOOD

    result = download(hostile, out)

    assert result.exit_code == 1, result.output
    assert "artifact 'drafter/x.bin': refused, it resolves to" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_the_api_key_goes_only_to_the_apis_own_origin(hostile: Hostile, tmp_path: Path):
    """A presigned URL on another origin (and one spelled '//host:port/...'), the API's 307 to one, and a redirect
    from there back to the API: the key (and the API's cookie) reaches only requests made to the API itself."""
    hostile.serve("direct.bin", b"direct", f"{hostile.storage}/bucket/direct?X-Amz-Signature=abc")
    hostile.serve("redirected.bin", b"redirected", f"/v1/jobs/{JOB}/artifacts/redirected.bin")
    hostile.redirects[f"/v1/jobs/{JOB}/artifacts/redirected.bin"] = f"{hostile.storage}/bucket/redirected"
    hostile.serve("bounced.bin", b"bounced", f"{hostile.storage}/bucket/bounce")
    hostile.redirects["/bucket/bounce"] = f"{hostile.api}/files/bounced"  # back to the API's origin
    hostile.serve("schemeless.bin", b"schemeless", f"//{httpx.URL(hostile.storage).netloc.decode()}/bucket/schemeless")
    hostile.files.update({"/bucket/direct": b"direct", "/bucket/redirected": b"redirected",
                          "/files/bounced": b"bounced", "/bucket/schemeless": b"schemeless"})

    result = download(hostile, tmp_path / "out")

    assert result.exit_code == 0, result.output
    assert {name: (tmp_path / "out" / name).read_bytes() for name in files_below(tmp_path / "out")} == {
        "direct.bin": b"direct", "redirected.bin": b"redirected", "bounced.bin": b"bounced", "schemeless.bin":
        b"schemeless"}
    assert sorted(hostile.paths_at("storage")) == ["/bucket/bounce", "/bucket/direct", "/bucket/redirected",
                                                   "/bucket/schemeless"]
    for headers in hostile.headers_at("storage"):
        assert "authorization" not in headers and "cookie" not in headers, headers
        assert KEY not in json.dumps(headers)  # under no header name at all
    bounced = [headers for _, path, headers in hostile.seen if path == "/files/bounced"]
    assert len(bounced) == 1 and KEY not in json.dumps(bounced[0])  # it came from elsewhere: no key
    listing = [headers for _, path, headers in hostile.seen if path == f"/v1/jobs/{JOB}/artifacts"]
    assert listing and all(h["authorization"] == f"Bearer {KEY}" for h in listing)  # the API itself gets it


def test_a_file_that_fails_its_sha256_never_replaces_the_one_in_place(hostile: Hostile, tmp_path: Path):
    out = tmp_path / "out"
    (out / "drafter").mkdir(parents=True)
    (out / "drafter" / "model.safetensors").write_bytes(b"the verified copy from last time")
    hostile.serve("drafter/model.safetensors", GOOD, f"{hostile.storage}/bucket/model")
    hostile.files["/bucket/model"] = b"other bytes than the sha256 promised"

    result = download(hostile, out)

    assert result.exit_code == 1, result.output
    assert "drafter/model.safetensors: sha256 differs" in result.stderr
    assert files_below(out) == ["drafter/model.safetensors"]  # no temporary file left beside it
    assert (out / "drafter" / "model.safetensors").read_bytes() == b"the verified copy from last time"


@pytest.mark.parametrize("path", ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:alert(1)", "", None])
def test_a_download_path_that_is_no_http_url_is_refused(hostile: Hostile, tmp_path: Path, path):
    hostile.serve("x.bin", GOOD, path)

    result = download(hostile, tmp_path / "out")

    assert result.exit_code == 1, result.output
    assert "download failed: x.bin: the server" in result.stderr
    assert files_below(tmp_path) == []


def test_a_manifest_that_lists_paths_outside_out_is_not_followed(hostile: Hostile, tmp_path: Path):
    """Verification reads every file manifest.json lists: a listed '../' path must not be read, or reported on."""
    (tmp_path / "secret").write_text("not the server's business")
    manifest = json.dumps({"files": {"../secret": {"sha256": "0" * 64, "bytes": 1}}}).encode()
    hostile.serve("manifest.json", manifest, "/files/manifest")
    hostile.files["/files/manifest"] = manifest

    result = download(hostile, tmp_path / "out")

    assert result.exit_code == 1, result.output
    assert "manifest.json lists artifact '../secret': refused" in result.stderr


def test_the_closing_line_says_what_was_verified_and_no_more(hostile: Hostile, tmp_path: Path):
    """Each file by its sha256 always; the set by manifest.json only when the job listed one (a manifest.json left
    in --out by an earlier download is no proof of this job's set, and is not read)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"files": {"other.bin": {"sha256": "' + "0" * 64 + '", "bytes": 1}}}')
    hostile.serve("drafter/model.safetensors", GOOD, "/files/good")
    hostile.files["/files/good"] = GOOD

    without = download(hostile, out)

    assert without.exit_code == 0, without.output
    assert without.stderr.strip().splitlines()[-1] == (
        f"1 artifact verified in {out}: each by its sha256; the job listed no manifest.json, so the set was not "
        "checked against one")

    manifest = json.dumps({"files": {"drafter/model.safetensors": {
        "sha256": hashlib.sha256(GOOD).hexdigest(), "bytes": len(GOOD)}}}).encode()
    hostile.serve("manifest.json", manifest, "/files/manifest")
    hostile.files["/files/manifest"] = manifest

    listed = download(hostile, tmp_path / "again")

    assert listed.exit_code == 0, listed.output
    assert listed.stderr.strip().splitlines()[-1] == (
        f"2 artifacts verified in {tmp_path / 'again'}: each by its sha256, and the set by manifest.json")


def test_a_succeeded_job_without_artifacts_is_no_success(hostile: Hostile, tmp_path: Path):
    result = download(hostile, tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert f"job {JOB} has no artifacts" in result.stderr and "0 artifacts verified" not in result.stderr


def test_the_report_is_read_without_the_key_from_another_origin():
    """Client.report fetches report.json through the same door as a download (httpx.MockTransport: the fake
    server's answers, and each request as sent)."""
    sent: list[httpx.Request] = []
    report = json.dumps({"tau": 2.5}).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.path == f"/v1/jobs/{JOB}/artifacts":
            return httpx.Response(200, json={"data": [{"name": "report.json", "sha256": "", "size_bytes": 1,
                                                       "download_path": f"/v1/jobs/{JOB}/artifacts/report.json"}]})
        if request.url.host == "api.example":  # the API's 307, as for a presigned S3 URL
            return httpx.Response(307, headers={"Location": "https://bucket.s3.example/report.json?sig=1"})
        return httpx.Response(200, content=report)

    with Client("https://api.example", KEY, transport=httpx.MockTransport(handler)) as client:
        assert client.report(JOB).tau == 2.5
    assert [str(r.url) for r in sent][-1] == "https://bucket.s3.example/report.json?sig=1"
    assert "authorization" not in sent[-1].headers and "authorization" in sent[0].headers


def test_names_and_origins_are_checked_by_meaning_not_spelling(tmp_path: Path):
    assert artifact_name_problem("drafter/model.safetensors") is None
    assert artifact_destination(tmp_path / "out", "gguf/model-q8_0.gguf") == (tmp_path / "out" / "gguf" /
                                                                               "model-q8_0.gguf").resolve()
    with pytest.raises(DownloadError, match="absolute path"):
        artifact_destination(tmp_path, "/etc/passwd")
    with pytest.raises(DownloadError, match="is not a string"):
        artifact_destination(tmp_path, None)
    assert origin(httpx.URL("HTTPS://API.example:443/v1")) == origin(httpx.URL("https://api.example/x"))
    assert origin(httpx.URL("http://api.example")) != origin(httpx.URL("https://api.example"))  # scheme
    assert origin(httpx.URL("https://api.example")) != origin(httpx.URL("https://api.example:8443"))  # port
    assert origin(httpx.URL("https://api.example")) != origin(httpx.URL("https://api.example.evil"))  # host
