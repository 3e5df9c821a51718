#!/usr/bin/env python3
"""The first screen of a report page as a reader sees it: headless Chromium, the network off, 1440 x 900.

    .venv/bin/speedmatrix rederive docs/results/tiny-cpu-decisions --out /tmp/report --captions docs/captions
    .venv/bin/python bench/report_screenshot.py /tmp/report/report.html docs/images/report-first-screen.png

Needs Debian's ``chromium`` and ``chromium-driver`` (selenium drives them; it is one of the test tools). Waits for
every chart on the page to draw, then saves the PNG and prints the headings the first screen shows.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page", type=Path, help="a report.html")
    ap.add_argument("png", type=Path, help="where the screenshot goes")
    ap.add_argument("--size", default="1440,900", help="the window, width,height (default 1440,900)")
    a = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={a.size}",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=opts)
    width, height = (int(x) for x in a.size.split(","))
    # the page's viewport itself at that size (a window's size would include the browser's own bars)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        driver.get(a.page.resolve().as_uri())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and driver.execute_script(
                "return Array.from(document.querySelectorAll('div.vega')).some(d => !d.querySelector('svg, canvas'))"):
            time.sleep(0.2)
        a.png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(a.png))
        height = driver.execute_script("return window.innerHeight")
        seen = driver.execute_script(
            "return Array.from(document.querySelectorAll('h1,h2,h3')).filter(h => h.getBoundingClientRect().top < "
            "arguments[0]).map(h => h.tagName + ' ' + h.innerText)", height)
        print(f"{a.png}: the first {height} px show: " + "; ".join(seen))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
