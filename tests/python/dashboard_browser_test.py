#!/usr/bin/env python3
"""The dashboard page in headless Chromium, against live data.

Starts tests/dashboard_demo (a DashboardServer whose cluster state changes: a score every 200 ms)
or uses a dashboard already running (--url, e.g. a coordinator's), checks /healthz, /api/state,
/metrics and a 404 over plain HTTP, then opens the page in headless Chromium through Selenium
and checks that it renders live data: one role-table row per role in the state with every role
name, score-curve points that appear and then GROW while watched, the worker and server tables,
the staleness bars and the status header with the run's id. With the demo, which is then made
to serve another run (SIGUSR1), the page must say that a new run replaced the one it first
showed. Page JavaScript errors fail the test.

Needs Debian's chromium and chromium-driver (scripts/install-deps.sh) and selenium (the test
venv). When either is missing the test FAILS with a message saying what to install: it never
passes without having looked at the page.

usage: dashboard_browser_test.py (--demo PATH | --url URL) [--grow-seconds S] [--timeout S]
"""
import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def http_get(url, timeout=5):
    """(status, content type, body) of a GET, 4xx/5xx included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode(errors="replace")


def start_demo(path, timeout):
    """Starts the demo server; returns (process, its URL from the first line of stdout)."""
    if not os.access(path, os.X_OK):
        fail(f"demo program {path} is missing or not executable")
    proc = subprocess.Popen([path, "--seconds", "120"], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.startswith("http://"):
        proc.kill()
        fail(f"{path} printed no URL within {timeout} s (got {line!r}, exit code {proc.poll()})")
    return proc, line


def stop_demo(proc):
    proc.terminate()
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail("the demo did not stop within 10 s of SIGTERM")
    if code != 0:
        fail(f"the demo exited with code {code}")


def check_http(url):
    status, ctype, body = http_get(url + "healthz")
    if status != 200 or body != "ok":
        fail(f"/healthz: {status} {body!r}, expected 200 'ok'")
    status, ctype, body = http_get(url + "metrics")
    if status != 200 or not ctype.startswith("text/plain; version=0.0.4"):
        fail(f"/metrics: {status} {ctype!r}, expected 200 text/plain; version=0.0.4")
    status, _, _ = http_get(url + "no-such-page")
    if status != 404:
        fail(f"/no-such-page: {status}, expected 404")
    status, ctype, body = http_get(url + "api/state")
    if status != 200 or not ctype.startswith("application/json"):
        fail(f"/api/state: {status} {ctype!r}, expected 200 application/json")
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        fail(f"/api/state is not JSON ({e}): {body[:200]!r}")


def open_browser(chromium, chromedriver):
    for path, package in ((chromium, "chromium"), (chromedriver, "chromium-driver")):
        if not os.access(path, os.X_OK):
            fail(f"{path} not found: the browser test needs Debian's {package} "
                 f"(apt-get install chromium chromium-driver, or scripts/install-deps.sh)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        fail(f"selenium is not importable from {sys.executable} ({e}): pip install selenium "
             "(scripts/test.sh installs it into .venv-test)")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download a driver
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1700"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    except Exception as e:  # WebDriverException and friends: say which browser would not start
        fail(f"cannot start headless {chromium} through {chromedriver}: {e}")


def check_page(driver, url, state, timeout, grow_seconds, screenshot=None):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # The page redraws every second: an element found a moment ago may be gone (stale) when it is
    # read. Conditions are retried on that; one-off reads go through settled().
    def wait_for(what, condition, seconds=timeout):
        try:
            return WebDriverWait(driver, seconds, poll_frequency=0.1,
                                 ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: condition())
        except TimeoutException:
            fail(f"after {seconds} s: {what}")

    def settled(read):
        for _ in range(20):
            try:
                return read()
            except StaleElementReferenceException:
                time.sleep(0.05)
        return read()

    def rows(table):  # roles -> tr[data-role], workers -> tr[data-worker], ...
        return driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-{table[:-1]}]")

    def points():
        return len(driver.find_elements(By.CSS_SELECTOR, "#score-curve circle"))

    driver.set_page_load_timeout(timeout)
    driver.get(url)
    role_names = sorted(r["name"] for r in state.get("roles", []))
    if not role_names:
        fail("/api/state lists no roles, so there is nothing for the role table to show")
    wait_for(f"the role table shows no rows (expected {role_names})", lambda: len(rows("roles")) > 0)
    wait_for(f"score-curve has no points (state has {len(state.get('scores', []))} scores)",
             lambda: points() > 0)

    shown = settled(lambda: sorted(r.get_attribute("data-name") for r in rows("roles")))
    missing = [n for n in role_names if n not in shown]
    if missing:
        fail(f"role table lacks {missing}: shows {shown}")
    table_text = settled(lambda: driver.find_element(By.ID, "roles").text)
    for name in role_names:
        if name not in table_text:
            fail(f"role name {name!r} is not visible in the role table: {table_text!r}")

    # Both read in one script: the page re-renders every second with more scores, and one could
    # land between two separate reads.
    first, declared = driver.execute_script(
        "const s = document.getElementById('score-curve');"
        "return [s.querySelectorAll('circle').length, s.getAttribute('data-points')];")
    if declared != str(first):
        fail(f"score-curve data-points={declared!r} but it draws {first} circles")
    if not driver.find_elements(By.CSS_SELECTOR, "#score-curve polyline.loss"):
        fail("score-curve has points but no loss line")
    target = state.get("cluster", {}).get("target")
    if isinstance(target, (int, float)) and not driver.find_elements(By.CSS_SELECTOR, "#score-curve line.target"):
        fail(f"the target {target} is not drawn on the score curve")
    wait_for(f"the score curve stayed at {first} points for {grow_seconds} s: not live",
             lambda: points() > first, grow_seconds)
    grown = points()

    for table, key in (("workers", "workers"), ("servers", "servers")):
        names = sorted(x["name"] for x in state.get(key, []))
        shown = settled(lambda: [r.get_attribute('data-' + table[:-1]) for r in rows(table)])
        wait_for(f"#{table} shows {shown}, expected {names}",
                 lambda: all(any(r.get_attribute("data-" + table[:-1]) == n for r in rows(table))
                             for n in names))
    if any(sum(s.get("staleness", {}).values()) for s in state.get("servers", [])):
        wait_for("the staleness histogram has no bars",
                 lambda: driver.find_elements(By.CSS_SELECTOR, "#staleness rect.bar"))
        # Drawn to scale, not squashed by a stray style: the tallest bar spans the plot.
        heights = settled(lambda: [r.size["height"] for r in
                                   driver.find_elements(By.CSS_SELECTOR, "#staleness rect.bar")])
        if max(heights) < 40:
            fail(f"staleness bars are rendered {heights} px tall; the tallest should fill the plot")
        # One bar per bucket the servers report ("4-7" is one bar, not 4 and made-up 5 to 7).
        buckets = sorted({k for s in state.get("servers", []) for k in s.get("staleness", {})},
                         key=lambda k: int(k.split("-")[0].rstrip("+")))
        bars = settled(lambda: [r.get_attribute("data-staleness") for r in
                                driver.find_elements(By.CSS_SELECTOR, "#staleness rect.bar")])
        if bars != buckets:
            fail(f"staleness bars {bars}, expected one per bucket {buckets}")
    # Which run: the first 8 characters of its id, and no "new run" while it is the first.
    run = state.get("cluster", {}).get("run")
    if not isinstance(run, str) or len(run) < 8:
        fail(f"/api/state names no run (cluster.run {run!r})")
    wait_for(f"the status header shows run {run[:8]}",
             lambda: driver.find_element(By.ID, "st-run").text == run[:8])
    if settled(lambda: driver.find_element(By.ID, "st-new-run").is_displayed()):
        fail("the page says a new run while the run it first showed is served")
    cluster_state = state.get("cluster", {}).get("state", "")
    status = settled(lambda: driver.find_element(By.ID, "status").text.lower())  # CSS-uppercased labels
    if "step" not in status or "epoch" not in status:
        fail(f"status header lacks step/epoch: {status!r}")
    if cluster_state in ("starting", "training", "stopping", "done", "failed"):
        wait_for(f"status header shows no cluster state: {status!r}",
                 lambda: any(s in driver.find_element(By.ID, "status").text.lower()
                             for s in ("starting", "training", "stopping", "done", "failed")))

    if screenshot:
        driver.save_screenshot(screenshot)
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    if errors:
        fail(f"the page logged errors: {errors}")
    return first, grown, shown


def check_new_run(driver, url, demo, timeout):
    """The demo made to serve another run (SIGUSR1), as a later launch on the same port would:
    the page says so and shows the new run's id."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException

    before = json.loads(http_get(url + "api/state")[2])["cluster"]["run"]
    demo.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while json.loads(http_get(url + "api/state")[2])["cluster"]["run"] == before:
        if time.monotonic() > deadline:
            fail(f"the demo still serves run {before} {timeout} s after SIGUSR1")
        time.sleep(0.05)
    after = json.loads(http_get(url + "api/state")[2])["cluster"]["run"]
    try:
        WebDriverWait(driver, timeout, poll_frequency=0.1,
                      ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: d.find_element(By.ID, "st-new-run").is_displayed()
            and d.find_element(By.ID, "st-run").text == after[:8])
    except TimeoutException:
        fail(f"after {timeout} s the page does not say that run {after[:8]} replaced {before[:8]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--demo", help="path of the dashboard_demo program to start")
    source.add_argument("--url", help="a dashboard already running, e.g. http://127.0.0.1:8787/")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a render")
    parser.add_argument("--grow-seconds", type=float, default=4.0,
                        help="seconds within which the score curve must gain a point")
    parser.add_argument("--screenshot", help="save a PNG of the page here once it has rendered")
    args = parser.parse_args()

    started = time.monotonic()
    demo = None
    url = args.url
    if args.demo:
        demo, url = start_demo(args.demo, args.timeout)
    if not url.endswith("/"):
        url += "/"
    driver = None
    try:
        state = check_http(url)
        driver = open_browser(args.chromium, args.chromedriver)
        first, grown, roles = check_page(driver, url, state, args.timeout, args.grow_seconds,
                                           args.screenshot)
        if demo is not None:
            check_new_run(driver, url, demo, args.timeout)
    finally:
        if driver is not None:
            driver.quit()
        if demo is not None and demo.poll() is None:
            stop_demo(demo)
    print(f"PASS: {url}: roles {roles}; score curve grew from {first} to {grown} points; "
          f"{time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
