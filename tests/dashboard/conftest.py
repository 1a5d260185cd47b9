"""Fixtures for the dashboard tests: the real API app under uvicorn (SQLite, local storage) behind a
cuttable proxy, an organisation with a key, a job driver using the stage-runner API, and Debian's
headless Chromium driven by Playwright.

Chromium must be /usr/bin/chromium (`apt-get install chromium chromium-driver`; `make test` installs it when it can);
Playwright never downloads a browser here. Without it the browser tests fail and say so, unless
DRAFTSMITH_TEST_SKIP_BROWSER=1 asks to skip them. Screenshots and report.html go to
$DRAFTSMITH_TEST_OUTPUT/dashboard (default: test-output/dashboard in the checkout).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from api_harness import make_settings
from dashboard_browser import SAVED, TIMEOUT_MS, sign_in
from dashboard_job_driver import JobDriver, sample_records, sample_report
from dashboard_live_server import CuttableProxy, LiveServer

from api.auth import create_api_key
from api.deps import Services, services_for
from api.main import create_app
from migrations.revisions import upgrade

CHROMIUM = os.environ.get("DRAFTSMITH_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@dataclass
class Dashboard:
    url: str  # through the proxy: what the browser uses
    direct_url: str  # uvicorn itself: for the tests' own API calls, which a proxy cut must not break
    proxy: CuttableProxy
    services: Services
    driver: JobDriver
    org_name: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.request(method, self.direct_url + path, headers=headers, timeout=30, **kwargs)

    def create_job(self, body: dict | None = None) -> dict:
        response = self.api("POST", "/v1/jobs", json=body or {"target": {"uri": "bundled:smollm2-135m"}})
        assert response.status_code == 201, response.text
        return response.json()

    def new_key(self, scopes: tuple[str, ...] = ("read", "write")) -> tuple[str, str]:
        """Another key of the same organisation: (key id, plaintext)."""
        with self.services.session_factory() as session:
            issued = create_api_key(session, self.services.settings, org_name=self.org_name, scopes=scopes)
            session.commit()
        return issued.key_id, issued.plaintext


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    work = tmp_path_factory.mktemp("dashboard")
    database_url = f"sqlite:///{work / 'draftsmith.db'}"
    upgrade(database_url)
    # Streams may stay open for the whole test; keep-alives every 5 s keep a quiet stream observably alive.
    settings = make_settings(database_url, work / "storage", sse_max_stream_seconds=600, sse_keepalive_seconds=5)
    app = create_app(settings)
    server = LiveServer(app)
    direct_url = server.start()
    proxy = CuttableProxy(server.port)
    url = proxy.start()
    services = services_for(app)
    org_name = f"dash-{secrets.token_hex(4)}"
    with services.session_factory() as session:
        issued = create_api_key(session, settings, org_name=org_name, scopes=("read", "write", "admin"))
        session.commit()
    try:
        yield Dashboard(url=url, direct_url=direct_url, proxy=proxy, services=services,
                        driver=JobDriver(services.session_factory, services.storage), org_name=org_name,
                        key=issued.plaintext)
    finally:
        proxy.stop()
        server.stop()


# Module scope, not session: Playwright's sync API keeps an asyncio loop running in this thread while it
# is open, and later tests that call asyncio.run() (tests/api) would fail.
@pytest.fixture(scope="module")
def chromium():
    if not Path(CHROMIUM).is_file():
        if os.environ.get("DRAFTSMITH_TEST_SKIP_BROWSER") == "1":
            pytest.skip("browser tests disabled by DRAFTSMITH_TEST_SKIP_BROWSER=1")
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: apt-get install -y chromium chromium-driver "
                    "(.ci/run does), or set DRAFTSMITH_TEST_SKIP_BROWSER=1 to skip the browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # launch() gives every run a fresh temporary profile (--user-data-dir) and removes it afterwards.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@contextmanager
def dashboard_page(chromium, dashboard: Dashboard):
    """A fresh browser context (empty session storage) on the dashboard; fails on a script error or a
    Content-Security-Policy violation."""
    context = chromium.new_context(base_url=dashboard.url, viewport={"width": 1280, "height": 900},
                                   accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=dashboard.url)
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.on("console", lambda message: problems.append(f"console: {message.text}")
            if message.type == "error" and "Content-Security-Policy" in message.text else None)
    yield page
    context.close()
    assert not problems, f"the page reported errors: {problems}"


@pytest.fixture
def page(chromium, dashboard: Dashboard):
    with dashboard_page(chromium, dashboard) as page:
        yield page


@pytest.fixture(scope="module")
def finished_job(dashboard: Dashboard) -> dict:
    """One job run to success with the sample report and curves, shared by the tests that only read it."""
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "finished, read by several tests"})
    dashboard.driver.run_to_success(job["id"], sample_report(), sample_records())
    return job


@pytest.fixture(scope="module")
def finished_page(chromium, dashboard: Dashboard, finished_job: dict):
    """That job's page, opened once with every chart drawn, for the tests that only read it (they put back
    any viewport size they change)."""
    with dashboard_page(chromium, dashboard) as page:
        sign_in(page, dashboard.key, f"/#/jobs/{finished_job['id']}")
        for figure in ("loss", "position-accuracy", "acceptance-by-position", "acceptance-by-category",
                       "speedup-by-block-size"):
            page.wait_for_selector(f'figure[data-chart="{figure}"]', timeout=TIMEOUT_MS)
        yield page


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest hook
    if SAVED:
        terminalreporter.write_sep("-", "dashboard screenshots and reports")
        for path in SAVED:
            terminalreporter.write_line(str(path))
