"""The management web UI (served by Warren at / on the HTTP port), driven in a real headless
Chromium through Selenium and Debian's chromedriver.

Warren only (WARREN_BIN): RabbitMQ's UI is another program. Skipped, with the reason, when
chromium or chromedriver is missing (scripts/test.sh installs Debian's `chromium` and
`chromium-driver`) or the selenium package is not installed. Nothing is downloaded: the driver
and browser paths are given explicitly, so Selenium Manager never runs.

One broker of the test's own (so the overview's totals and rates are this test's): log in (a
wrong password first: the API's reason is shown), the overview names the node, `warren perf`
load makes the publish-rate chart's latest plotted value (`data-latest-publish` on its <svg>)
rise above 0; then a queue is created with the "Add a new queue" form, found in the list,
opened, published to through its "Publish message" form, read with "Get messages", purged and
deleted (confirm() dialogs accepted), and the API confirms it is gone. Names and payloads
carry markup characters: they must come back as text, never as elements.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pytest

from conftest import WarrenProcess

try:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:  # the driver fixture skips, saying so
    pass

BIN = os.environ.get("WARREN_BIN")
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(not BIN, reason="the management web UI is Warren's: Warren only (WARREN_BIN)")

WAIT = 20.0


def _major(cmd: str) -> str | None:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.\d+\.\d+", out)
    return m.group(1) if m else None


def _browser_or_skip() -> None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            pytest.skip(f"{path} not found: install Debian's {package} (scripts/test.sh does)")
    b, d = _major(CHROMIUM), _major(CHROMEDRIVER)
    if b is None or d is None or b != d:
        pytest.skip(f"chromium ({b}) and chromedriver ({d}) versions differ or are unknown: "
                    "install both from the same Debian release")


@pytest.fixture(scope="module")
def broker():
    w = WarrenProcess(BIN)
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def driver():
    _browser_or_skip()
    webdriver = pytest.importorskip("selenium.webdriver", reason="the selenium package is not installed "
                                    "(tests/interop/python/requirements.txt)")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="warren-ui-chromium-")
    downloads = os.path.join(profile, "downloads")
    os.makedirs(downloads)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.add_experimental_option("prefs", {"download.default_directory": downloads,
                                           "download.prompt_for_download": False})
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
              f"--user-data-dir={profile}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=subprocess.DEVNULL)
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(WAIT)
    d.set_script_timeout(WAIT)
    d.downloads = downloads  # where "Download broker definitions" saves to
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


def api(broker: WarrenProcess, method: str, path: str, body=None):
    """(status, parsed body) of an HTTP API call as guest."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def wait(d, cond, what: str, timeout: float = WAIT):
    """cond(driver) until truthy; an element redrawn under it (the lists are redrawn every 5 s,
    a message replaces the one before) or not there yet just means "not yet"."""
    return WebDriverWait(d, timeout, poll_frequency=0.2,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                         ).until(cond, message=f"waiting for {what}")


def by_id(d, id_: str, what: str | None = None, timeout: float = WAIT):
    return wait(d, EC.visibility_of_element_located((By.ID, id_)), what or f"#{id_}", timeout)


def flash_text(d, expected: str, timeout: float = WAIT) -> str:
    def seen(drv):
        els = drv.find_elements(By.ID, "flash-text")
        return els[0].text if els and expected in els[0].text else False
    return wait(d, seen, f"the message {expected!r}", timeout)


def accept_confirm(d, what: str) -> None:
    alert = wait(d, EC.alert_is_present(), f"the confirm() for {what}", 5)
    alert.accept()


def login(d, user: str, password: str) -> None:
    u = by_id(d, "login-username", "the login form")
    u.clear()
    u.send_keys(user)
    p = d.find_element(By.ID, "login-password")
    p.clear()
    p.send_keys(password)
    d.find_element(By.ID, "login-submit").click()


def ensure_login(d, base: str, user: str = "guest", password: str = "guest") -> None:
    """The overview, logged in as `user` (logging out whoever was logged in)."""
    d.get(base + "/#/")
    d.execute_script("sessionStorage.clear()")
    d.refresh()
    login(d, user, password)
    wait(d, lambda drv: drv.find_element(By.ID, "hdr-user").text == user, f"logged in as {user}")


def _debug(d) -> str:
    """Where the browser was, and what it logged, for a failure message."""
    try:
        shot = os.path.join(tempfile.gettempdir(), f"warren-ui-failure-{uuid.uuid4().hex[:8]}.png")
        d.save_screenshot(shot)
        logs = "\n".join(str(e) for e in d.get_log("browser"))
        return f"url {d.current_url}; screenshot {shot}\nbrowser log:\n{logs}"
    except Exception as e:  # the browser itself may be gone
        return f"(no browser state: {e})"


def _row(d, attr: str, value: str):
    for r in d.find_elements(By.CSS_SELECTOR, f"tr[{attr}]"):
        if r.get_attribute(attr) == value:
            return r
    return None


def click_in_row(d, attr: str, value: str, selector: str = "button") -> None:
    """Clicks `selector` in the table row whose `attr` is `value` (again if the list was redrawn
    under the click)."""
    def click(drv):
        r = _row(drv, attr, value)
        if r is None:
            return False
        r.find_element(By.CSS_SELECTOR, selector).click()
        return True
    wait(d, click, f"the row {attr}={value!r}")


def _submit(d, form: str, fields: dict[str, str]) -> None:
    """Fills a form's text fields (ids) and presses its submit button."""
    for id_, value in fields.items():
        el = by_id(d, id_)
        el.clear()
        el.send_keys(value)
    d.find_element(By.ID, form + "-submit").click()


@pytest.mark.timeout(150)
def test_ui_login_overview_chart_and_queue_lifecycle(driver, broker):
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    perf = None
    try:
        # The page and its assets need no credentials.
        d.get(base + "/")
        assert d.title == "Warren Management"

        # A wrong password: the API's reason is shown on the login page.
        login(d, "guest", "not-the-password")
        err = wait(d, lambda drv: drv.find_element(By.ID, "login-error").is_displayed()
                   and drv.find_element(By.ID, "login-error"), "the login error")
        assert err.text == "Login failed"

        login(d, "guest", "guest")
        status, ov = api(broker, "GET", "/overview")
        assert status == 200
        node = by_id(d, "node-name", "the overview's node name")
        wait(d, lambda drv: node.text == ov["node"], f"node name {ov['node']!r}")
        assert d.find_element(By.ID, "hdr-node").text == ov["node"]
        assert d.find_element(By.ID, "hdr-user").text == "guest"
        assert d.execute_script("return sessionStorage.getItem('warren.auth')") == \
            "Basic " + base64.b64encode(b"guest:guest").decode()

        # Load: the publish-rate chart's latest plotted value rises above 0 (the UI polls every
        # 5 s; the broker's rates come from 5 s samples).
        chart = d.find_element(By.CSS_SELECTOR, 'svg[data-chart="overview-rates"]')
        perf = subprocess.Popen([BIN, "perf", "-h", broker.url, "-x", "1", "-y", "1", "-a",
                                 "-s", "16", "-z", "40", "-r", "500"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)

        def publishing(_):
            v = chart.get_attribute("data-latest-publish")
            return v is not None and float(v) > 0 and float(v)
        rate = wait(d, publishing, "a publish rate > 0 on the overview chart", 25)
        assert 0 < rate < 5000
        legend = d.find_element(By.CSS_SELECTOR, '.legend-value[data-series="publish"]').text
        assert legend.endswith("/s") and legend not in ("0.0/s", "–"), legend
        assert d.find_elements(By.CSS_SELECTOR, 'svg[data-chart="overview-rates"] path[data-series="publish"]')
        assert int(chart.get_attribute("data-samples")) >= 2
        perf.terminate()
        perf.wait(10)
        perf = None

        # Create a queue through the form; markup in its name stays text.
        name = f"interop-ui-{uuid.uuid4().hex[:8]} <b>&\"é"
        d.find_element(By.CSS_SELECTOR, '#tabs a[data-tab="queues"]').click()
        field = by_id(d, "add-queue-name", "the add-queue form")
        wait(d, lambda drv: [o.text for o in Select(drv.find_element(By.ID, "add-queue-vhost")).options] == ["/"],
             "the vhost list")
        field.send_keys(name)
        Select(d.find_element(By.ID, "add-queue-durable")).select_by_value("false")
        d.find_element(By.ID, "add-queue-submit").click()
        flash_text(d, "added")
        status, q = api(broker, "GET", "/queues/%2F/" + urllib.parse.quote(name, safe=""))
        assert status == 200 and q["durable"] is False, (status, q)

        def listed(drv):
            r = _row(drv, "data-queue", name)
            return r is not None and r.find_element(By.TAG_NAME, "a").text == name \
                and not r.find_elements(By.TAG_NAME, "b")
        wait(d, listed, "the new queue in the list, its name as text")
        click_in_row(d, "data-queue", name, "a")
        wait(d, lambda drv: drv.find_element(By.ID, "queue-name").text == name, "the queue's page")
        assert d.find_elements(By.CSS_SELECTOR, 'svg[data-chart="queue-rates"]')

        # Publish to it through the default exchange.
        payload = '<i>hello</i> & "ui" ' + uuid.uuid4().hex
        d.find_element(By.CSS_SELECTOR, "#publish-panel summary").click()
        by_id(d, "publish-payload").send_keys(payload)
        d.find_element(By.ID, "publish-submit").click()
        flash_text(d, "Message published.")
        assert d.find_element(By.ID, "flash-text").text == "Message published."
        wait(d, lambda drv: drv.find_element(By.ID, "queue-ready").text == "1", "Ready = 1 on the queue page", 15)

        # Get messages (requeue): the payload, as text.
        assert Select(d.find_element(By.ID, "get-ackmode")).first_selected_option.get_attribute("value") == "ack_requeue_true"
        d.find_element(By.ID, "get-submit").click()
        pre = wait(d, lambda drv: drv.find_elements(By.CSS_SELECTOR, "#get-results pre.payload"), "the fetched message")[0]
        assert pre.text == payload
        assert not pre.find_elements(By.TAG_NAME, "i")
        results = d.find_element(By.ID, "get-results").text
        assert "Message 1" in results and "messages remaining" in results, results
        status, q = api(broker, "GET", "/queues/%2F/" + urllib.parse.quote(name, safe=""))
        assert q["messages"] == 1, q

        # Purge (confirm dialog), then "Get messages" finds it empty.
        d.find_element(By.ID, "purge-queue").click()
        accept_confirm(d, "purge")
        flash_text(d, "Queue purged.")
        status, q = api(broker, "GET", "/queues/%2F/" + urllib.parse.quote(name, safe=""))
        assert status == 200 and q["messages"] == 0, q
        d.find_element(By.ID, "get-submit").click()
        by_id(d, "get-empty", "'Queue is empty'")

        # Delete (confirm dialog): back to the list, and the API no longer has it.
        d.find_element(By.ID, "delete-queue").click()
        accept_confirm(d, "delete")
        flash_text(d, "deleted.")
        wait(d, lambda drv: drv.execute_script("return location.hash") == "#/queues", "the queue list")
        status, _ = api(broker, "GET", "/queues/%2F/" + urllib.parse.quote(name, safe=""))
        assert status == 404
        wait(d, lambda drv: _row(drv, "data-queue", name) is None, "the queue gone from the list")

        # No markup from a name or payload ever ran, and the page logged no script error.
        assert d.execute_script("return document.querySelectorAll('main b, main i').length") == 0
        errors = [e for e in d.get_log("browser")
                  if e["level"] == "SEVERE" and e.get("source") != "network"]
        assert not errors, errors

        # Log out: the credentials are forgotten and the login form is back.
        d.find_element(By.ID, "logout").click()
        by_id(d, "login-username", "the login form after logging out")
        assert d.execute_script("return sessionStorage.getItem('warren.auth')") is None
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        if perf is not None:
            perf.kill()
            perf.wait(10)


@pytest.mark.timeout(150)
def test_ui_admin_exchanges_and_definitions(driver, broker):
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    tag = uuid.uuid4().hex[:8]
    vhost, user, policy = f"ui-vh-{tag}", f"ui-user-{tag}", f"ui-pol-{tag}"
    exchange, queue, imported = f"ui-x-{tag}", f"ui-q-{tag}", f"ui-imported-{tag}"
    conn = None
    q = urllib.parse.quote
    try:
        ensure_login(d, base)

        # Virtual hosts: add one.
        d.get(base + "/#/vhosts")
        _submit(d, "add-vhost", {"add-vhost-name": vhost, "add-vhost-description": "made <by> the UI"})
        flash_text(d, "added")
        assert api(broker, "GET", "/vhosts/" + q(vhost, safe=""))[0] == 200
        wait(d, lambda drv: _row(drv, "data-vhost", vhost), "the new vhost in the list")

        # Users: add one with a tag, give it permissions on the new vhost.
        d.get(base + "/#/users")
        _submit(d, "add-user", {"add-user-name": user, "add-user-password": "secret-" + tag,
                                "add-user-tags": "monitoring"})
        flash_text(d, "added")
        status, u = api(broker, "GET", "/users/" + q(user, safe=""))
        assert status == 200 and u["tags"] == ["monitoring"], u
        wait(d, lambda drv: _row(drv, "data-user", user), "the new user in the list")
        d.find_element(By.XPATH, "//summary[text()='Set permission']").click()
        wait(d, lambda drv: user in [o.get_attribute("value") for o in Select(drv.find_element(By.ID, "perm-user")).options], "the user in the permission form")
        Select(d.find_element(By.ID, "perm-user")).select_by_value(user)
        wait(d, lambda drv: vhost in [o.get_attribute("value") for o in Select(drv.find_element(By.ID, "perm-vhost")).options], "the vhost in the permission form")
        Select(d.find_element(By.ID, "perm-vhost")).select_by_value(vhost)
        _submit(d, "set-permission", {"perm-configure": "^ui-", "perm-write": ".*", "perm-read": ".*"})
        flash_text(d, "Permissions of")
        status, p = api(broker, "GET", f"/permissions/{q(vhost, safe='')}/{q(user, safe='')}")
        assert status == 200 and p["configure"] == "^ui-", p

        # Policies: add one (JSON definition), then delete it from its row.
        d.get(base + "/#/policies")
        wait(d, lambda drv: vhost in [o.get_attribute("value") for o in Select(drv.find_element(By.ID, "add-policy-vhost")).options], "the vhost in the policy form")
        Select(d.find_element(By.ID, "add-policy-vhost")).select_by_value(vhost)
        Select(d.find_element(By.ID, "add-policy-apply-to")).select_by_value("queues")
        _submit(d, "add-policy", {"add-policy-name": policy, "add-policy-pattern": "^ui-",
                                  "add-policy-priority": "3", "add-policy-definition": '{"max-length": 5}'})
        flash_text(d, "set.")
        status, pol = api(broker, "GET", f"/policies/{q(vhost, safe='')}/{q(policy, safe='')}")
        assert status == 200 and pol["definition"] == {"max-length": 5} and pol["priority"] == 3 \
            and pol["apply-to"] == "queues", pol
        click_in_row(d, "data-policy", policy)
        accept_confirm(d, "the policy's deletion")
        flash_text(d, "deleted.")
        assert api(broker, "GET", f"/policies/{q(vhost, safe='')}/{q(policy, safe='')}")[0] == 404

        # Exchanges: add a fanout exchange, publish to it unbound, then bound.
        d.get(base + "/#/exchanges")
        Select(by_id(d, "add-exchange-type")).select_by_value("fanout")
        _submit(d, "add-exchange", {"add-exchange-name": exchange})
        flash_text(d, "added")
        status, x = api(broker, "GET", "/exchanges/%2F/" + q(exchange, safe=""))
        assert status == 200 and x["type"] == "fanout", x
        d.get(base + "/#/exchanges/%2F/" + q(exchange, safe=""))
        by_id(d, "exchange-name", "the exchange's page")
        d.find_element(By.CSS_SELECTOR, "#publish-panel summary").click()
        _submit(d, "publish", {"publish-routing-key": "any", "publish-payload": "nobody hears this",
                               "publish-properties": "content_type=text/plain"})
        flash_text(d, "Message published, but not routed.")
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.queue_bind(queue, exchange)
        d.find_element(By.ID, "publish-submit").click()
        wait(d, lambda drv: drv.find_element(By.ID, "flash-text").text == "Message published.", "'Message published.'")
        assert ch.basic_get(queue, auto_ack=True)[2] == b"nobody hears this"
        wait(d, lambda drv: any(a.text == queue for a in drv.find_elements(By.CSS_SELECTOR, "main table a")),
             "the binding on the exchange's page", 15)
        d.find_element(By.ID, "delete-exchange").click()
        accept_confirm(d, "the exchange's deletion")
        flash_text(d, "deleted.")
        assert api(broker, "GET", "/exchanges/%2F/" + q(exchange, safe=""))[0] == 404

        # Definitions: import a file, then export and find it in the download.
        defs = {"vhosts": [{"name": vhost}],
                "queues": [{"name": imported, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}]}
        path = os.path.join(d.downloads, "..", f"import-{tag}.json")
        with open(path, "w") as f:
            json.dump(defs, f)
        d.get(base + "/#/definitions")
        by_id(d, "import-file").send_keys(os.path.abspath(path))
        d.find_element(By.ID, "import-submit").click()
        flash_text(d, "Your definitions were imported successfully.")
        assert api(broker, "GET", f"/queues/{q(vhost, safe='')}/{q(imported, safe='')}")[0] == 200
        _submit(d, "export", {"export-filename": f"export-{tag}.json"})
        target = os.path.join(d.downloads, f"export-{tag}.json")
        wait(d, lambda _: os.path.exists(target) and os.path.getsize(target) > 0, "the exported file", 15)
        exported = json.load(open(target))
        assert {"name": imported, "vhost": vhost} in [{"name": e["name"], "vhost": e["vhost"]} for e in exported["queues"]]
        assert user in [e["name"] for e in exported["users"]]

        # The monitoring user sees the pages but no Admin tab and no forms that write.
        ensure_login(d, base, user, "secret-" + tag)
        by_id(d, "node-name")
        assert not d.find_elements(By.CSS_SELECTOR, '#tabs a[data-tab="admin"]')
        d.get(base + "/#/queues")
        wait(d, lambda drv: drv.find_element(By.CSS_SELECTOR, "main h1 small").text.startswith("("), "the queue list")
        assert not d.find_elements(By.ID, "add-queue")

        # A user without a management tag: the API's reason on the login page.
        assert api(broker, "PUT", f"/users/{q(user, safe='')}-plain", {"password": "p", "tags": ""})[0] in (201, 204)
        d.execute_script("sessionStorage.clear()")
        d.refresh()
        login(d, user + "-plain", "p")
        err = wait(d, lambda drv: drv.find_element(By.ID, "login-error").is_displayed()
                   and drv.find_element(By.ID, "login-error"), "the login error")
        assert err.text == "Not management user"
        api(broker, "DELETE", f"/users/{q(user, safe='')}-plain")

        # Back as guest: delete the user and the vhost from their rows.
        ensure_login(d, base)
        d.get(base + "/#/users")
        click_in_row(d, "data-user", user)
        accept_confirm(d, "the user's deletion")
        flash_text(d, "deleted.")
        assert api(broker, "GET", "/users/" + q(user, safe=""))[0] == 404
        d.get(base + "/#/vhosts")
        click_in_row(d, "data-vhost", vhost)
        accept_confirm(d, "the vhost's deletion")
        flash_text(d, "deleted.")
        assert api(broker, "GET", "/vhosts/" + q(vhost, safe=""))[0] == 404

        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
        assert not errors, errors
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


def _listed(d, prefix: str = "queues") -> list[str]:
    """The names in a paged list's rows (queues: data-queue)."""
    return [r.get_attribute("data-queue") for r in
            d.find_elements(By.CSS_SELECTOR, f"#{prefix}-list tr[data-queue]")]


def _select(d, id_: str, value: str) -> None:
    """Selects `value` in the <select> `id_` (again if it was redrawn under the call)."""
    def pick(drv):
        Select(drv.find_element(By.ID, id_)).select_by_value(value)
        return True
    wait(d, pick, f"#{id_} = {value}")


def _click(d, css: str) -> None:
    def click(drv):
        drv.find_element(By.CSS_SELECTOR, css).click()
        return True
    wait(d, click, css)


@pytest.mark.timeout(150)
def test_ui_queue_list_pages_sorts_and_filters_on_the_server(driver, broker):
    """25 queues, 20 a page: page 2 holds the other 5; the Name header sorts by name, then in
    reverse (sort, sort_reverse); the regex box filters with use_regex; a bad regex is shown."""
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    tag = uuid.uuid4().hex[:8]
    names = [f"ui-pg-{tag}-{i:02}" for i in range(25)]
    try:
        for n in reversed(names):
            assert api(broker, "PUT", "/queues/%2F/" + n, {"durable": False})[0] == 201
        ensure_login(d, base)
        d.get(base + "/#/queues")
        by_id(d, "queues-filter").send_keys(f"ui-pg-{tag}")
        _select(d, "queues-page-size", "20")
        # The list shown once the filter and the page size are in (the first draw is unfiltered).
        wait(d, lambda drv: _listed(drv) == names[:20]
             and "20 shown, 25 match" in drv.find_element(By.ID, "queues-shown").text,
             "page 1: the first 20 by name, of the 25 that match")
        # The node column names the queue's node.
        node = api(broker, "GET", "/overview")[1]["node"]
        row = _row(d, "data-queue", names[0])
        assert node in row.text, row.text
        _click(d, "#queues-next")
        wait(d, lambda drv: _listed(drv) == names[20:], "page 2: the other 5")
        assert d.find_element(By.ID, "queues-page").get_attribute("value") == "2"

        # Sort by name (back to page 1), then reversed.
        _click(d, '#queues-list button.sort[data-sort="name"]')
        wait(d, lambda drv: _listed(drv) == names[:20] and drv.find_element(
            By.CSS_SELECTOR, '#queues-list button.sort[data-sort="name"]').get_attribute("data-order") == "asc",
            "sorted by name")
        _click(d, '#queues-list button.sort[data-sort="name"]')
        wait(d, lambda drv: _listed(drv) == names[::-1][:20], "sorted by name, reversed")
        _click(d, "#queues-next")
        wait(d, lambda drv: _listed(drv) == names[::-1][20:], "page 2 of the reversed list")

        # A regex filter (use_regex).
        f = d.find_element(By.ID, "queues-filter")
        d.find_element(By.ID, "queues-regex").click()
        f.clear()
        f.send_keys(f"^UI-PG-{tag}-0[0-4]$")
        wait(d, lambda drv: _listed(drv) == names[:5][::-1], "the regex's 5 queues, reversed")
        # An invalid one: the error is shown instead of the list.
        f.send_keys("(")
        err = wait(d, lambda drv: drv.find_element(By.ID, "queues-error").is_displayed()
                   and drv.find_element(By.ID, "queues-error"), "the bad-regex error")
        assert "not a valid regular expression" in err.text, err.text
        assert _listed(d) == []
        f.send_keys(Keys.BACKSPACE)
        wait(d, lambda drv: _listed(drv) == names[:5][::-1], "the list back")
        assert not d.find_element(By.ID, "queues-error").is_displayed()
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        for n in names:
            api(broker, "DELETE", "/queues/%2F/" + n)


@pytest.mark.timeout(150)
def test_ui_bindings_added_and_removed_on_exchange_and_queue_pages(driver, broker):
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    tag = uuid.uuid4().hex[:8]
    x, x2, qn = f"ui-bx-{tag}", f"ui-bx2-{tag}", f"ui-bq-{tag}"
    try:
        assert api(broker, "PUT", f"/exchanges/%2F/{x}", {"type": "topic", "durable": False})[0] == 201
        assert api(broker, "PUT", f"/exchanges/%2F/{x2}", {"type": "fanout", "durable": False})[0] == 201
        assert api(broker, "PUT", f"/queues/%2F/{qn}", {"durable": False})[0] == 201
        ensure_login(d, base)

        # From the exchange's page: to the queue, then to the other exchange.
        d.get(base + f"/#/exchanges/%2F/{x}")
        by_id(d, "add-binding-name", "the add-binding form")
        _select(d, "add-binding-type", "q")
        _submit(d, "add-binding", {"add-binding-name": qn, "add-binding-routing-key": "k.*"})
        flash_text(d, "Binding added.")
        st, bs = api(broker, "GET", f"/bindings/%2F/e/{x}/q/{qn}")
        assert st == 200 and [b["routing_key"] for b in bs] == ["k.*"], bs
        row = wait(d, lambda drv: _row(drv, "data-destination", qn), "the binding to the queue")
        assert row.get_attribute("data-routing-key") == "k.*"
        _select(d, "add-binding-type", "e")
        _submit(d, "add-binding", {"add-binding-name": x2, "add-binding-routing-key": "any"})
        flash_text(d, "Binding added.")
        wait(d, lambda drv: _row(drv, "data-destination", x2), "the binding to the exchange")
        st, bs = api(broker, "GET", f"/exchanges/%2F/{x2}/bindings/destination")
        assert st == 200 and [(b["source"], b["routing_key"]) for b in bs] == [(x, "any")], bs

        # The other exchange's page lists it as a binding to it.
        d.get(base + f"/#/exchanges/%2F/{x2}")
        wait(d, lambda drv: drv.find_elements(By.CSS_SELECTOR, f'#bindings-destination tr[data-source="{x}"]'),
             "the binding on the destination's page")

        # The queue's page: the default exchange's binding and the new one; unbind it there.
        d.get(base + f"/#/queues/%2F/{qn}")
        wait(d, lambda drv: _row(drv, "data-source", x), "the binding on the queue's page")
        assert d.find_elements(By.CSS_SELECTOR, '#bindings-queue tr[data-source=""]')
        click_in_row(d, "data-source", x, "button.unbind")
        flash_text(d, "Binding removed.")
        assert api(broker, "GET", f"/bindings/%2F/e/{x}/q/{qn}") == (200, [])
        wait(d, lambda drv: _row(drv, "data-source", x) is None, "the binding gone from the queue's page")

        # Add one from the queue's page; remove the exchange-to-exchange one from the exchange's.
        _submit(d, "add-binding", {"add-binding-name": x, "add-binding-routing-key": "q.1"})
        flash_text(d, "Binding added.")
        st, bs = api(broker, "GET", f"/bindings/%2F/e/{x}/q/{qn}")
        assert st == 200 and [b["routing_key"] for b in bs] == ["q.1"], bs
        d.get(base + f"/#/exchanges/%2F/{x}")
        wait(d, lambda drv: _row(drv, "data-destination", qn), "the queue's binding on the exchange's page")
        click_in_row(d, "data-destination", x2, "button.unbind")
        flash_text(d, "Binding removed.")
        st, bs = api(broker, "GET", f"/exchanges/%2F/{x}/bindings/source")
        assert st == 200 and [(b["destination"], b["routing_key"]) for b in bs] == [(qn, "q.1")], bs
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
        assert not errors, errors
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        api(broker, "DELETE", f"/exchanges/%2F/{x}")
        api(broker, "DELETE", f"/exchanges/%2F/{x2}")
        api(broker, "DELETE", f"/queues/%2F/{qn}")


def _paths(d, chart: str) -> dict[str, tuple[str | None, str | None]]:
    return {p.get_attribute("data-series"): (p.get_attribute("stroke"), p.get_attribute("stroke-dasharray"))
            for p in d.find_elements(By.CSS_SELECTOR, f'svg[data-chart="{chart}"] path[data-series]')}


@pytest.mark.timeout(120)
def test_ui_chart_series_distinct_toggled_and_time_range(driver, broker):
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    try:
        ensure_login(d, base)
        d.get(base + "/#/")
        rates = wait(d, lambda drv: len(_paths(drv, "overview-rates")) == 5 and _paths(drv, "overview-rates"),
                     "the five rate series plotted")
        # Each series its own color and dash: publish, confirm, deliver and ack stay apart
        # even when their values are the same.
        assert len(set(rates.values())) == 5 and len({dash for _, dash in rates.values()}) == 5, rates
        queued = wait(d, lambda drv: len(_paths(drv, "overview-queued")) == 3 and _paths(drv, "overview-queued"),
                      "the three queued series plotted")
        assert len({dash for _, dash in queued.values()}) == 3, queued
        # Unacked is drawn over Total (the first-listed series is drawn last, on top).
        order = [p.get_attribute("data-series") for p in
                 d.find_elements(By.CSS_SELECTOR, 'svg[data-chart="overview-queued"] path[data-series]')]
        assert order.index("unacked") > order.index("total"), order

        # The legend hides and shows a series.
        svg = d.find_element(By.CSS_SELECTOR, 'svg[data-chart="overview-rates"]')
        legend = 'div.chart:has(svg[data-chart="overview-rates"]) .legend-item[data-series="publish"]'
        before = svg.get_attribute("innerHTML")
        d.find_element(By.CSS_SELECTOR, legend).click()
        wait(d, lambda drv: "publish" not in _paths(drv, "overview-rates"), "publish hidden")
        assert d.find_element(By.CSS_SELECTOR, legend).get_attribute("aria-pressed") == "false"
        assert svg.get_attribute("data-hidden") == "publish"
        assert svg.get_attribute("innerHTML") != before
        assert set(_paths(d, "overview-rates")) == {"confirm", "deliver_get", "ack", "redeliver"}
        d.find_element(By.CSS_SELECTOR, legend).click()
        wait(d, lambda drv: "publish" in _paths(drv, "overview-rates"), "publish shown again")
        assert d.find_element(By.CSS_SELECTOR, legend).get_attribute("aria-pressed") == "true"

        # The time range: every chart on the page, remembered.
        _select(d, "chart-range", str(60 * 1000))
        wait(d, lambda drv: all(s.get_attribute("data-span") == "60000"
                                for s in drv.find_elements(By.CSS_SELECTOR, "svg[data-chart]")), "a 1-minute range")
        d.get(base + "/#/queues")
        d.get(base + "/#/")
        assert Select(by_id(d, "chart-range")).first_selected_option.get_attribute("value") == "60000"
        _select(d, "chart-range", str(60 * 60 * 1000))
        wait(d, lambda drv: drv.find_element(By.CSS_SELECTOR, 'svg[data-chart="overview-rates"]')
             .get_attribute("data-span") == "3600000", "a 1-hour range")
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        d.execute_script("localStorage.removeItem('warren.range')")


@pytest.mark.timeout(90)
def test_ui_nodes_page(driver, broker):
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    try:
        ensure_login(d, base)
        d.find_element(By.CSS_SELECTOR, '#tabs a[data-tab="nodes"]').click()
        st, nodes = api(broker, "GET", "/nodes")
        assert st == 200 and len(nodes) == 1, nodes
        row = wait(d, lambda drv: _row(drv, "data-node", nodes[0]["name"]), "the node's row")
        assert row.get_attribute("data-running") == "true"
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert cells[1] == "running", cells
        assert " / " in cells[4] and " / " in cells[5] and " / " in cells[6], cells  # memory, disk, fds
        assert "1 of 1 running" in d.find_element(By.CSS_SELECTOR, "main h1 small").text
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e


# Wraps the page's fetch: queue objects named NAME lose their counts and are "down", as the
# API lists a queue whose node is down (RabbitMQ leaves the counts out).
_DOWN_QUEUE_SCRIPT = """
(() => {
  const name = %s;
  const strip = (q) => {
    if (q && q.name === name) {
      delete q.messages; delete q.messages_ready; delete q.messages_unacknowledged;
      q.state = 'down';
    }
    return q;
  };
  const real = window.fetch.bind(window);
  window.fetch = async (url, init) => {
    const res = await real(url, init);
    if (!String(url).startsWith('/api/queues') || !res.ok) return res;
    let data = await res.json();
    if (Array.isArray(data)) data.forEach(strip);
    else if (data && Array.isArray(data.items)) data.items.forEach(strip);
    else strip(data);
    return new Response(JSON.stringify(data), { status: res.status, headers: res.headers });
  };
})();
"""


@pytest.mark.timeout(90)
def test_ui_counts_left_out_are_shown_unknown(driver, broker):
    """The UI's side of a queue whose node is down (the API leaves its counts out, as RabbitMQ
    does): "unknown" in the list and on the queue's page, never 0 or blank. The page's fetch is
    wrapped to drop the fields, so this holds whatever this broker reports."""
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    name = f"ui-unknown-{uuid.uuid4().hex[:8]}"
    script = None
    try:
        assert api(broker, "PUT", "/queues/%2F/" + name, {"durable": False})[0] == 201
        ensure_login(d, base)
        script = d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                   {"source": _DOWN_QUEUE_SCRIPT % json.dumps(name)})["identifier"]
        d.get(base + "/#/queues")
        d.refresh()
        by_id(d, "queues-filter").send_keys(name)
        row = wait(d, lambda drv: (r := _row(drv, "data-queue", name)) is not None
                   and r.get_attribute("data-state") == "down" and r, "the queue shown down")
        cells = [row.find_element(By.CLASS_NAME, c).text for c in ("count-ready", "count-unacked", "count-total")]
        assert cells == ["unknown"] * 3, cells
        d.get(base + "/#/queues/%2F/" + name)
        wait(d, lambda drv: drv.find_element(By.ID, "queue-ready").text == "unknown", "Ready unknown on its page")
        assert d.find_element(By.ID, "queue-unacked").text == "unknown"
        assert d.find_element(By.ID, "queue-total").text == "unknown"
        assert d.find_element(By.ID, "queue-state").text == "down"
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        if script is not None:
            d.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script})
            d.get(base + "/#/")
            d.refresh()
        api(broker, "DELETE", "/queues/%2F/" + name)


@pytest.mark.timeout(90)
def test_ui_shovels_page(driver, broker):
    """Admin > Shovels: a shovel added with the form moves a queue's messages, is listed running
    (its row from /api/shovels), restarts and is deleted from its row."""
    d = driver
    base = f"http://127.0.0.1:{broker.http_port}"
    tag = uuid.uuid4().hex[:8]
    name, src, dest = f"ui-shovel-{tag}<b>", f"ui-src-{tag}", f"ui-dest-{tag}"
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(src)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", src, f"m{i}".encode())
        ensure_login(d, base)
        d.get(base + "/#/shovels")
        _submit(d, "add-shovel", {"add-shovel-name": name, "add-shovel-src": src, "add-shovel-dest": dest})
        flash_text(d, "added")
        st, p = api(broker, "GET", "/parameters/shovel/%2F/" + urllib.parse.quote(name, safe=""))
        assert st == 200 and p["value"]["src-queue"] == src and p["value"]["dest-queue"] == dest, p
        row = wait(d, lambda drv: (r := _row(drv, "data-shovel", name)) is not None
                   and r.get_attribute("data-state") == "running" and r, "the shovel running")
        assert name in row.text  # the name as text, not markup
        wait(d, lambda drv: ch.queue_declare(dest, passive=True).method.message_count == 5, "the messages moved")
        click_in_row(d, "data-shovel", name, "button.restart")
        flash_text(d, "restarted")
        click_in_row(d, "data-shovel", name, "button.danger")
        accept_confirm(d, "deleting the shovel")
        flash_text(d, "deleted")
        assert api(broker, "GET", "/parameters/shovel/%2F/" + urllib.parse.quote(name, safe=""))[0] == 404
        wait(d, lambda drv: _row(drv, "data-shovel", name) is None, "the row gone")
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e
    finally:
        conn.close()
