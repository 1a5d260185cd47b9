"""The dashboard's files and download links, over HTTP (no browser): the page and everything it loads
are served with the right types and a strict policy, nothing outside the asset folders is reachable,
the dashboard stays out of the API document, download links are signed, short-lived and die with
their key, and a built wheel carries every asset."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from api.dashboard.downloads import LINK_TTL_SECONDS, sign_download
from api.dashboard.router import DASHBOARD_STATIC, SHARED_STATIC

ROOT = Path(__file__).resolve().parents[2]
TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}


def test_the_page_and_everything_it_loads_are_served(dashboard):
    page = httpx.get(dashboard.direct_url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    # Every file the page names, then every module those modules import: a renamed file fails here.
    pending = re.findall(r'(?:src|href)="(/assets/[^"]+)"', page.text)
    seen = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        response = httpx.get(dashboard.direct_url + path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith(TYPES[Path(path).suffix]), path
        if path.endswith(".js"):
            base = path.rsplit("/", 1)[0]
            pending += [f"{base}/{name}" for name in re.findall(r'from "\./([\w.]+\.js)"', response.text)]
    modules = {f"/assets/js/{p.name}" for p in (DASHBOARD_STATIC / "js").glob("*.js")}
    assert modules <= seen, f"modules nothing imports: {modules - seen}"
    assert {"/assets/shared/charts.js", "/assets/shared/vendor/uPlot.iife.min.js"} <= seen


@pytest.mark.parametrize("path", [
    "/assets/../api/main.py", "/assets/%2e%2e/%2e%2e/api/main.py", "/assets/js/../../router.py",
    "/assets/shared/../../api/main.py", "/assets/shared/README.md", "/assets/js/missing.js", "/assets/.hidden.js",
    "/assets/shared/vendor/uPlot.LICENSE", "/assets/", "/assets/js",
])
def test_nothing_outside_the_asset_folders_is_served(dashboard, path):
    response = httpx.get(dashboard.direct_url + path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_the_dashboard_is_not_part_of_the_api_document(dashboard):
    paths = httpx.get(dashboard.direct_url + "/openapi.json").json()["paths"]
    assert not [p for p in paths if not p.startswith("/v1/") and p not in ("/healthz", "/readyz", "/metrics")]


def test_download_links_are_signed_short_lived_and_die_with_their_key(dashboard):
    job = dashboard.create_job()
    data = b"drafter bytes " * 1000
    dashboard.driver.claim(job["id"], "prepare")
    dashboard.driver.store(job["id"], "gguf/drafter-q8_0.gguf", data, kind="gguf", content_type="application/octet-stream")
    key_id, key = dashboard.new_key(("read",))  # read scope is enough to download
    create = {"job_id": job["id"], "name": "gguf/drafter-q8_0.gguf"}

    link = httpx.post(dashboard.direct_url + "/dashboard/download-links", json=create,
                      headers={"Authorization": f"Bearer {key}"}).json()
    assert link["expires_in"] == LINK_TTL_SECONDS and key not in link["url"]
    got = httpx.get(dashboard.direct_url + link["url"])  # no Authorization: the link is the credential
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-disposition"] == 'attachment; filename="drafter-q8_0.gguf"'
    sha256 = dashboard.api("GET", f"/v1/jobs/{job['id']}/artifacts").json()["data"][0]["sha256"]
    assert got.headers["etag"] == f'"{sha256}"'

    payload, signature = link["url"].rsplit("/", 1)[1].split(".")
    forged = f"{payload}.{signature[:-2]}{'AA' if signature[-2:] != 'AA' else 'BB'}"
    settings = dashboard.services.settings
    expired = sign_download(settings, key_id=key_id, job_id=job["id"], name=create["name"],
                            now=time.time() - LINK_TTL_SECONDS - 1)
    for bad in (forged, expired, "not-a-token", f"{payload}."):
        response = httpx.get(f"{dashboard.direct_url}/dashboard/downloads/{bad}")
        assert response.status_code == 404 and "invalid or has expired" in response.json()["detail"], bad

    assert httpx.post(dashboard.direct_url + "/dashboard/download-links", json=create).status_code == 401
    missing = dashboard.api("POST", "/dashboard/download-links", json={**create, "name": "nope.bin"})
    assert missing.status_code == 404
    with dashboard.services.session_factory() as session:
        from api.auth import create_api_key
        from domain.models import ApiKey, utcnow

        stranger = create_api_key(session, settings, org_name="another-org-dashboard", scopes=("read",))
        session.commit()
        other = httpx.post(dashboard.direct_url + "/dashboard/download-links", json=create,
                           headers={"Authorization": f"Bearer {stranger.plaintext}"})
        assert other.status_code == 404  # another organisation's job is not there for it
        session.get(ApiKey, key_id).revoked_at = utcnow()
        session.commit()
    assert httpx.get(dashboard.direct_url + link["url"]).status_code == 404  # revoking the key kills its links


def test_a_built_wheel_carries_every_dashboard_and_chart_file(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("api", "domain", "draftsmith", "report", "schemas", "trainer", "kernels", "migrations", "worker"):
        if (ROOT / package).is_dir():
            shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    names = set(zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist())
    expected = {f"api/dashboard/static/{p.relative_to(DASHBOARD_STATIC).as_posix()}"
                for p in DASHBOARD_STATIC.rglob("*") if p.is_file()}
    expected |= {f"report/static/{p.relative_to(SHARED_STATIC).as_posix()}"
                 for p in SHARED_STATIC.rglob("*") if p.is_file()}
    assert expected - names == set()


def test_the_page_reads_small_artifacts_through_the_api_as_inert_text(dashboard, monkeypatch):
    job = dashboard.create_job()
    dashboard.driver.claim(job["id"], "prepare")
    dashboard.driver.store(job["id"], "report.json", b'{"tau": 1.5}', kind="report", content_type="application/json")
    dashboard.driver.store(job["id"], "report.html", b"<script>alert(1)</script>", kind="report-html",
                           content_type="text/html")
    base = f"/dashboard/jobs/{job['id']}/artifacts"
    report = dashboard.api("GET", f"{base}/report.json")
    assert report.status_code == 200 and report.json() == {"tau": 1.5}
    page = dashboard.api("GET", f"{base}/report.html")
    assert page.headers["content-type"] == "text/plain; charset=utf-8"  # never rendered as this origin's HTML
    assert page.headers["content-security-policy"] == "sandbox" and page.text == "<script>alert(1)</script>"
    assert httpx.get(dashboard.direct_url + f"{base}/report.json").status_code == 401
    assert dashboard.api("GET", f"{base}/missing.json").status_code == 404
    monkeypatch.setattr("api.dashboard.downloads.INLINE_MAX_BYTES", 4)
    too_big = dashboard.api("GET", f"{base}/report.json")
    assert too_big.status_code == 413 and "download it instead" in too_big.json()["detail"]
