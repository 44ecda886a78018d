"""The dashboard (GET /) in a real headless Chromium, checked for what a person would see.

How: selenium drives the system's Chromium and chromedriver (Debian `chromium`,
`chromium-driver`; `./dev test` installs them). The page is loaded from a node's admin
address, a wrong token is typed first (the page must say "401: wrong token" and show no
data), then the right one. The tables are read as rendered (`innerText` of each cell, plus
the `data-value` the page sets beside it), all in one script call, so a refresh in between
cannot mix two polls.

* Against the example cluster (`example_view`, served by uvicorn in a thread): exact
  values, including what the real daemon does not report yet (replica lag in seconds,
  records) and a shard not hosted on the answering node.
* Against a real local cluster (3 node processes, 2 shards) with appends running: one row
  per shard whose leader is the leader the data plane names (and the admin API), an LSN
  range that grows, an append rate above zero, replica lag cells for the shard the page's
  node leads, every shard ready.

* The admin API's /docs page (Swagger UI) renders every operation with no request leaving
  loopback (Chromium's performance log lists every request the page made).

Skips only when no Chromium or chromedriver can be found; waits are bounded
(WebDriverWait), the driver is quit and the appender stopped whatever happens.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from logsvc.admin.app import create_app
from logsvc.admin.port import example_view
from logsvc.client import LogsvcError

from .conftest import LocalCluster
from .test_admin_api import call, node_configs

T = TypeVar("T")

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver",)
DRIVER_PATHS = ("/usr/lib/chromium/chromedriver",)  # Debian's, if not on PATH
WAIT_S_MAX = 30.0  # any one thing the page should show; refreshes are every 2 s
APPEND_S_MAX = 120.0  # the appender stops by itself after this, or this many batches:
APPEND_BATCHES_MAX = 20_000
FAKE_TOKEN = "dashb0ard-t0ken-Kq3Vx8LmWp2Z"

# Every row of a table as rendered: {"shard": ..., "<field>": {"text", "value"}}.
READ_TABLE_JS = """
return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr')).map((row) => {
  const cells = {};
  for (const cell of row.querySelectorAll('[data-field]')) {
    cells[cell.dataset.field] = {text: cell.innerText.trim(), value: cell.dataset.value ?? null};
  }
  return {shard: row.dataset.shardId ?? null, node: row.dataset.nodeId ?? null, cells: cells};
});
"""

Row = dict[str, Any]
Cells = dict[str, dict[str, str | None]]  # field -> {"text", "value"}


def find_program(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((path for path in extra if Path(path).is_file()), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium = find_program(BROWSER_NAMES)
    driver_path = find_program(DRIVER_NAMES, DRIVER_PATHS)
    if chromium is None or driver_path is None:
        missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver_path)) if not p]
        pytest.skip(
            f"headless Chromium not found ({', '.join(missing)} missing): install the Debian "
            "packages chromium and chromium-driver (./dev test does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    # Every request the browser makes, read back by `requested_urls` (the /docs test).
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # Explicit paths: selenium then never tries to download a browser or a driver.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        driver.set_page_load_timeout(WAIT_S_MAX)
        driver.set_script_timeout(WAIT_S_MAX)
        yield driver
    finally:
        driver.quit()


def wait_for(driver: WebDriver, what: str, probe: Callable[[WebDriver], T | Literal[False]]) -> T:
    """`probe` until it returns something truthy (returned), at most WAIT_S_MAX seconds."""
    waiter = WebDriverWait(
        driver,
        WAIT_S_MAX,
        poll_frequency=0.2,
        ignored_exceptions=(StaleElementReferenceException,),
    )
    return waiter.until(probe, f"the dashboard never showed {what}")


def read_table(driver: WebDriver, table_id: str) -> list[Row]:
    rows: list[Row] = driver.execute_script(READ_TABLE_JS, f"#{table_id}")
    return rows


def shard_rows(driver: WebDriver) -> dict[int, Cells]:
    return {int(row["shard"]): row["cells"] for row in read_table(driver, "shards")}


def shard_rows_where(
    predicate: Callable[[dict[int, Cells]], bool],
) -> Callable[[WebDriver], dict[int, Cells] | Literal[False]]:
    def probe(driver: WebDriver) -> dict[int, Cells] | Literal[False]:
        rows = shard_rows(driver)
        return rows if predicate(rows) else False

    return probe


def refreshes(driver: WebDriver) -> int:
    return int(driver.find_element(By.ID, "updated").get_attribute("data-refreshes") or 0)


def enter_token(driver: WebDriver, token: str) -> None:
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "connect").click()


def error_text(driver: WebDriver) -> str:
    box = driver.find_element(By.ID, "error")
    return box.text if box.is_displayed() else ""


def check_a_wrong_token_is_shown_as_such(driver: WebDriver) -> None:
    enter_token(driver, "not-the-admin-token")
    message = wait_for(driver, "the 401 message", lambda d: error_text(d))
    assert message.startswith("401: wrong token"), message
    assert read_table(driver, "shards") == []


def connect_with(driver: WebDriver, token: str) -> None:
    before = refreshes(driver)
    enter_token(driver, token)
    wait_for(driver, "a refresh", lambda d: refreshes(d) > before)
    assert error_text(driver) == ""
    # The token is kept in the tab's storage, not left in the page.
    assert token not in driver.page_source


def number(cell: dict[str, str | None]) -> int:
    """A numeric cell: the number shown is the number in data-value."""
    value = cell["value"]
    assert value is not None and cell["text"] == value, cell
    return int(value)


# ------------------------------------------------------------------ the example cluster


@pytest.fixture(scope="module")
def fake_admin() -> Iterator[str]:
    """The admin app over `example_view`, served by uvicorn on a free loopback port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    config = uvicorn.Config(
        create_app(example_view(), FAKE_TOKEN), log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S_MAX
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield address
    finally:
        server.should_exit = True
        thread.join(WAIT_S_MAX)
        listener.close()


def test_the_dashboard_shows_the_example_cluster(
    browser: WebDriver, fake_admin: str, tmp_path: Path
) -> None:
    browser.get(f"http://{fake_admin}/")
    assert browser.title == "logsvc cluster"
    try:
        check_a_wrong_token_is_shown_as_such(browser)
        connect_with(browser, FAKE_TOKEN)
        shards = wait_for(browser, "three shards", shard_rows_where(lambda rows: len(rows) == 3))
        assert browser.find_element(By.ID, "node-id").text == "n1"
        assert browser.find_element(By.ID, "readiness").text == "ready"

        one = shards[1]
        assert one["leader"]["text"] == "n1" and one["role"]["text"] == "leader"
        assert number(one["term"]) == 3
        assert (number(one["first-lsn"]), number(one["last-lsn"])) == (11, 500)
        assert number(one["truncated-lsn"]) == 10
        assert one["replicas"]["text"] == "n1, n2, n3"
        assert one["ready"]["text"] == "yes"
        two = shards[2]
        assert two["leader"]["text"] == "n2" and two["role"]["text"] == "follower"
        assert two["last-lsn"]["text"] == "—"  # an empty log
        link = browser.find_element(By.CSS_SELECTOR, '#shards tr[data-shard-id="2"] a')
        assert link.get_attribute("href") == "http://127.0.0.1:7202/"  # the leader's page
        three = shards[3]
        assert three["role"]["text"] == "not hosted" and three["replicas"]["text"] == "n2, n3, n4"
        # Two polls of an unchanged log: a rate of zero, shown as such.
        wait_for(browser, "a rate", lambda d: shard_rows(d)[1]["rate"]["value"] is not None)
        assert float(shard_rows(browser)[1]["rate"]["value"] or "nan") == 0.0

        lag = {
            (int(row["shard"]), row["node"]): row["cells"]
            for row in read_table(browser, "replicas")
        }
        assert sorted(lag) == [(1, "n1"), (1, "n2"), (1, "n3"), (2, "n1"), (2, "n2"), (2, "n3")]
        assert number(lag[1, "n3"]["lag-entries"]) == 5
        assert lag[1, "n3"]["lag-seconds"]["text"] == "0.2"
        assert number(lag[1, "n2"]["lag-records"]) == 0
        assert lag[1, "n2"]["lag-seconds"]["text"] == "—"  # unknown, not zero
        assert lag[2, "n3"]["lag-entries"]["text"] == "—"  # a follower cannot tell
    finally:
        browser.save_screenshot(str(tmp_path / "dashboard-example.png"))


# ------------------------------------------------------------------ the /docs page


def requested_urls(driver: WebDriver) -> list[str]:
    """The URL of every request the browser started since the last call (Chromium's
    performance log, which reading empties)."""
    urls = []
    for entry in driver.get_log("performance"):  # type: ignore[attr-defined]  # Chromium only
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_docs_page_renders_every_operation_from_the_node_alone(
    browser: WebDriver, fake_admin: str, tmp_path: Path
) -> None:
    """Issue 24 item 6: /docs loads Swagger UI from the node (no CDN), shows one block per
    operation of the OpenAPI description, and no request leaves loopback."""
    with urllib.request.urlopen(f"http://{fake_admin}/openapi.json", timeout=WAIT_S_MAX) as got:
        spec = json.load(got)
    operations = sum(len(methods) for methods in spec["paths"].values())
    requested_urls(browser)  # forget what earlier tests loaded
    browser.get(f"http://{fake_admin}/docs")
    try:
        wait_for(
            browser,
            "every operation",
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) == operations,
        )
        title = browser.find_element(By.CSS_SELECTOR, ".info .title").text
        assert title.startswith("logsvc admin API"), title
        paths = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")]
        assert "/v1/shards/{shard_id}/truncate" in [p.replace("\u200b", "") for p in paths]
        urls = requested_urls(browser)
        assert f"http://{fake_admin}/docs/assets/swagger-ui-bundle.js" in urls
        assert f"http://{fake_admin}/openapi.json" in urls
        elsewhere = [
            url
            for url in urls
            if urllib.parse.urlsplit(url).hostname != "127.0.0.1" and not url.startswith("data:")
        ]
        assert elsewhere == []
    finally:
        browser.save_screenshot(str(tmp_path / "docs.png"))


# -------------------------------------------------------------------- a real cluster


class Appender:
    """Appends small batches to every shard from a thread until stopped (bounded in time
    and count), counting acknowledged records."""

    def __init__(self, cluster: LocalCluster) -> None:
        self._cluster = cluster
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.acked = 0
        self.errors: list[str] = []

    def __enter__(self) -> Appender:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S_MAX)

    def _run(self) -> None:
        client = self._cluster.client()
        deadline = time.monotonic() + APPEND_S_MAX
        try:
            for _ in range(APPEND_BATCHES_MAX):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                for shard in range(1, self._cluster.shards + 1):
                    try:
                        self.acked += len(client.append(shard, [b"dashboard"] * 4))
                    except (LogsvcError, OSError, TimeoutError) as exc:
                        self.errors.append(repr(exc))
                self._stop.wait(0.02)
        finally:
            client.close()


def data_plane_leaders(cluster: LocalCluster) -> dict[int, str | None]:
    client = cluster.client()
    try:
        leaders: dict[int, str | None] = {}
        for shard in range(1, cluster.shards + 1):
            address = client.status(shard).leader
            leaders[shard] = None if address is None else cluster.node_of(address)
        return leaders
    finally:
        client.close()


def test_the_dashboard_of_a_real_cluster_under_appends(
    browser: WebDriver, cluster: LocalCluster, tmp_path: Path
) -> None:
    configs = node_configs(cluster)
    token = configs[0].token
    admin = {config.node_id: config.node.admin_address for config in configs}

    def leader_by_admin(node: str, shard: int) -> str | None:
        """None while unknown, and while the node's admin API is not up yet: it may start
        listening after the data plane, which is what the cluster fixture waits for."""
        try:
            status, body, _ = call(admin[node], "GET", f"/v1/shards/{shard}", token)
        except OSError:
            return None
        if status != 200 or body["leader"] is None:
            return None
        return str(body["leader"]["node_id"])

    # Load the page from shard 1's leader, as it sees itself: it knows its replicas' lag.
    deadline = time.monotonic() + WAIT_S_MAX
    while (page_node := leader_by_admin("n1", 1)) is None or leader_by_admin(
        page_node, 1
    ) != page_node:
        assert time.monotonic() < deadline, "shard 1 has no leader"
        time.sleep(0.2)

    with Appender(cluster) as appender:
        browser.get(f"http://{admin[page_node]}/")
        try:
            check_a_wrong_token_is_shown_as_such(browser)
            connect_with(browser, token)
            rows = wait_for(browser, "one row per shard", shard_rows_where(bool))
            assert sorted(rows) == list(range(1, cluster.shards + 1))
            assert browser.find_element(By.ID, "node-id").text == page_node

            # The leader shown is the leader the data plane and the admin API name (equal
            # once an election in between has settled: polled, bounded).
            def leaders_agree(driver: WebDriver) -> bool:
                shown = {
                    shard: cells["leader"]["value"] for shard, cells in shard_rows(driver).items()
                }
                plane = data_plane_leaders(cluster)
                api = {shard: leader_by_admin(page_node, shard) for shard in plane}
                return shown == plane == api and None not in shown.values()

            wait_for(browser, "the data plane's leaders", leaders_agree)

            # The LSN range grows while appends run, and so does the append rate.
            first_seen = {
                shard: number(cells["last-lsn"])
                for shard, cells in rows.items()
                if cells["last-lsn"]["value"] is not None
            }
            wait_for(
                browser,
                "growing last LSNs",
                lambda d: all(
                    (cells["last-lsn"]["value"] is not None)
                    and number(cells["last-lsn"]) > first_seen.get(shard, 0)
                    for shard, cells in shard_rows(d).items()
                ),
            )
            wait_for(
                browser,
                "a positive append rate on every shard",
                lambda d: all(
                    float(cells["rate"]["value"] or 0) > 0 for cells in shard_rows(d).values()
                ),
            )
            for cells in shard_rows(browser).values():
                assert number(cells["first-lsn"]) <= number(cells["last-lsn"])
                assert number(cells["term"]) >= 1
                assert cells["role"]["text"] in ("leader", "follower")

            # Replica lag: every member of a shard the page's node leads, in Raft entries,
            # from its leader; a replica whose node has just started shows as not connected
            # until it is. Which shards it leads may change meanwhile (the leadership
            # balancer hands some to the other nodes; a node leading one keeps one), so the
            # shard is whichever the page shows as led when the lag is read.
            def replica_lag(driver: WebDriver) -> dict[int, dict[str, Cells]]:
                lag: dict[int, dict[str, Cells]] = {}
                for row in read_table(driver, "replicas"):
                    lag.setdefault(int(row["shard"]), {})[str(row["node"])] = row["cells"]
                return lag

            def lag_known(driver: WebDriver) -> tuple[int, dict[str, Cells]] | Literal[False]:
                for shard, lag in sorted(replica_lag(driver).items()):
                    if all(c["lag-entries"]["value"] is not None for c in lag.values()):
                        return shard, lag
                return False

            led, lag = wait_for(browser, "a led shard's replica lag", lag_known)
            assert sorted(lag) == sorted(str(rows[led]["replicas"]["text"]).split(", "))
            for cells in lag.values():
                assert number(cells["lag-entries"]) >= 0
                assert number(cells["match-index"]) >= 0
                assert cells["lag-records"]["text"] and cells["lag-seconds"]["text"]
            wait_for(
                browser,
                "every replica of a led shard connected",
                lambda d: any(
                    all(
                        c["lag-entries"]["value"] is not None
                        and c["connected"]["text"] in ("yes", "self")
                        for c in lag.values()
                    )
                    for lag in replica_lag(d).values()
                ),
            )

            wait_for(
                browser,
                "every shard ready",
                lambda d: (
                    d.find_element(By.ID, "readiness").text == "ready"
                    and all(cells["ready"]["text"] == "yes" for cells in shard_rows(d).values())
                ),
            )
            assert error_text(browser) == ""
        finally:
            browser.save_screenshot(str(tmp_path / "dashboard-cluster.png"))
    assert appender.acked > 0, appender.errors[:5]
