"""Check report/explorer.html in headless Chromium: it loads with the network blocked, a scripted hover shows
a map's tooltip, and choosing a cluster, then a head, filters both views. Where the compare stage ran (the page
offers more than one model), choosing a model keeps that model's maps, and colouring by model shows the points
coloured that way.

    python -m tools.check_explorer RUN_DIR [--screenshots DIR] [--chromium /usr/bin/chromium]

Needs Playwright's Python package (``pip install playwright``; its bundled driver, no browser download)
and a Chromium (Debian: ``apt-get install chromium``). Prints what it saw, one line per check, and exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

STATE_JS = """() => {
  const doc = Bokeh.documents[0];
  const get = (n) => doc.get_model_by_name(n);
  return {maps: get('maps_filter').indices.length, heads: get('heads_filter').indices.length,
          status: get('status').text, cluster: get('cluster_select').value, head: get('head_select').value};
}"""

POINT_JS = """(i) => {
  // the screen position of map i in the map view: the renderer's view maps data to canvas pixels
  const doc = Bokeh.documents[0];
  const v = Bokeh.index.find_one(doc.get_model_by_name('maps_points'));
  if (!v) return null;
  const src = doc.get_model_by_name('maps');
  const fx = v.coordinates.x_scale.compute(src.data.x[i]);
  const fy = v.coordinates.y_scale.compute(src.data.y[i]);
  const box = v.plot_view.canvas_view.el.getBoundingClientRect();
  return [box.left + fx, box.top + fy];
}"""


def check(page_path: Path, chromium: str = "/usr/bin/chromium", screenshots: Path | None = None) -> dict:
    """Open one explorer page in headless Chromium with every non-file request blocked, and check it.

    Returns {"failures": [...], "lines": [...], "load_s", "hover_s", "filter_s"}: the seconds from navigation
    to the first rendered document, from the mouse move to a visible tooltip, and from a menu choice to the
    filtered status line."""
    import time

    from playwright.sync_api import sync_playwright

    out: dict = {"failures": [], "lines": []}

    def ok(passed: bool, what: str) -> None:
        out["lines"].append(("ok   " if passed else "FAIL ") + what)
        if not passed:
            out["failures"].append(what)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        requests = []
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file:")
                else (requests.append(route.request.url), route.abort())
            ),
        )
        t0 = time.perf_counter()
        page.goto(Path(page_path).resolve().as_uri(), timeout=180_000)
        page.wait_for_function(
            "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.index.find_one("
            "Bokeh.documents[0].get_model_by_name('maps_points'))",
            timeout=180_000,
        )
        out["load_s"] = time.perf_counter() - t0
        page.wait_for_timeout(1000)
        ok(not requests, f"loads with no network request ({len(requests)} blocked)")
        s0 = page.evaluate(STATE_JS)
        ok(s0["maps"] > 0 and s0["heads"] > 0, f"renders {s0['maps']} maps and {s0['heads']} heads")
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshots / "explorer.png"))
        xy = page.evaluate(POINT_JS, 0)
        if xy:
            t0 = time.perf_counter()
            page.mouse.move(xy[0], xy[1])
            # the tooltip's own text (our template's "pattern:" line), inside Bokeh's shadow DOM
            tip = page.get_by_text("pattern:")
            try:
                tip.first.wait_for(state="visible", timeout=30_000)
                out["hover_s"] = time.perf_counter() - t0
                text = " ".join(tip.first.locator("xpath=..").inner_text().split())
            except Exception:  # noqa: BLE001 - a tooltip that never shows is the failure reported below
                text = ""
            ok("cluster" in text, f"hovering a map shows its tooltip ({text[:80] or 'none'})")
            if screenshots:
                page.screenshot(path=str(screenshots / "explorer-hover.png"))
        else:
            ok(False, "found the map view's first point on screen")
        page.mouse.move(5, 5)
        # a scripted selection: the first cluster, then one of its heads
        clusters = page.evaluate("() => Bokeh.documents[0].get_model_by_name('cluster_select').options")
        target = clusters[1]
        t0 = time.perf_counter()
        page.evaluate(f"() => {{ Bokeh.documents[0].get_model_by_name('cluster_select').value = '{target}'; }}")
        page.wait_for_function(f"() => Bokeh.documents[0].get_model_by_name('status').text !== {s0['status']!r}")
        out["filter_s"] = time.perf_counter() - t0
        s1 = page.evaluate(STATE_JS)
        ok(0 < s1["maps"] < s0["maps"] and s1["heads"] <= s0["heads"], f"cluster {target}: {s1['status']}")
        head = page.evaluate(
            "() => { const d = Bokeh.documents[0]; const m = d.get_model_by_name('maps').data;"
            " const k = d.get_model_by_name('maps_filter').indices[0]; return m.lh[k]; }"
        )
        page.evaluate(f"() => {{ Bokeh.documents[0].get_model_by_name('head_select').value = '{head}'; }}")
        page.wait_for_timeout(500)
        s2 = page.evaluate(STATE_JS)
        ok(0 < s2["maps"] <= s1["maps"] and s2["heads"] <= 1, f"cluster {target} and head {head}: {s2['status']}")
        if screenshots:
            page.screenshot(path=str(screenshots / "explorer-filtered.png"))
        # a click on a head in the atlas chooses it in the head menu (and so filters both views)
        page.evaluate(
            "() => { Bokeh.documents[0].get_model_by_name('head_select').value = 'all';"
            " Bokeh.documents[0].get_model_by_name('cluster_select').value = 'all'; }"
        )
        page.evaluate("() => { Bokeh.documents[0].get_model_by_name('heads').selected.indices = [1]; }")
        page.wait_for_timeout(500)
        s3 = page.evaluate(STATE_JS)
        ok(s3["head"] != "all" and s3["heads"] == 1, f"choosing a head in the atlas: {s3['head']}, {s3['status']}")
        models = page.evaluate("() => Bokeh.documents[0].get_model_by_name('model_select').options")
        if len(models) > 2:  # "all" and two or more models: the compare stage's explorer
            page.evaluate(
                "() => { const d = Bokeh.documents[0]; d.get_model_by_name('head_select').value = 'all';"
                " d.get_model_by_name('heads').selected.indices = []; }"
            )
            page.wait_for_timeout(500)
            every = page.evaluate(STATE_JS)["maps"]
            page.evaluate(f"() => {{ Bokeh.documents[0].get_model_by_name('model_select').value = '{models[2]}'; }}")
            page.wait_for_timeout(500)
            one = page.evaluate(
                "() => { const d = Bokeh.documents[0]; const m = d.get_model_by_name('maps').data;"
                " const k = d.get_model_by_name('maps_filter').indices; return [k.length, k.filter((i) => m.model[i]"
                f" !== '{models[2]}').length]; }}"
            )
            ok(0 < one[0] < every and one[1] == 0, f"model {models[2]}: {one[0]} of {every} maps, all of it")
            page.evaluate("() => { Bokeh.documents[0].get_model_by_name('colour_select').value = 'model'; }")
            page.wait_for_timeout(500)
            shown = page.evaluate(
                "() => { const d = Bokeh.documents[0];"
                " return [d.get_model_by_name('maps_by_model').visible, d.get_model_by_name('maps_points').visible]; }"
            )
            ok(shown == [True, False], f"colour by model: the by-model points shown, the by-cluster hidden ({shown})")
            if screenshots:
                page.screenshot(path=str(screenshots / "explorer-models.png"))
        browser.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.check_explorer", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--screenshots", type=Path, default=None)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args(argv)
    out = check(args.run_dir / "report" / "explorer.html", args.chromium, args.screenshots)
    print("\n".join(out["lines"]))
    print(f"{len(out['failures'])} failed")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
