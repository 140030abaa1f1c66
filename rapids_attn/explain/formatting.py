"""The report's HTML formatting helpers: escaping, numbers, percentages, p-values, durations, names.

Small pure functions that turn one value into safe HTML text, shared by the page assembly
(:mod:`rapids_attn.explain.report`), the section renderers (:mod:`rapids_attn.explain.sections`) and the
stages' report sections (:mod:`rapids_attn.explain.heads`, :mod:`rapids_attn.explain.relevance`); kept
apart so that all of them format a number, a p-value or a cluster's name the same way. Everything that
comes from the data goes through :func:`esc` (HTML-escape).
"""

from __future__ import annotations

import html
import math
from urllib.parse import quote


def esc(x) -> str:
    """HTML-escape anything (None -> empty)."""
    return html.escape("" if x is None else str(x), quote=True)


def is_nan(x) -> bool:
    """Whether x is a float NaN or infinity (what the report writes as n/a)."""
    return isinstance(x, float) and not math.isfinite(x)


def num(x, digits: int = 3) -> str:
    """A readable number: ints with thousands separators, floats to ``digits`` significant figures."""
    if x is None or is_nan(x):
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if hasattr(x, "item") and not isinstance(x, (list, tuple, dict)):
        try:
            x = x.item()  # numpy scalar
        except (AttributeError, ValueError):
            pass
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 10**digits:
            return f"{x:,.0f}"
        if abs(x) >= 1e-3:
            return f"{x:.{digits}g}"
        return f"{x:.2e}"
    return str(x)


def pct(x) -> str:
    """A share as a percentage to one decimal (0.123 -> 12.3%)."""
    if x is None or is_nan(x):
        return "n/a"
    return f"{100 * float(x):.1f}%"


def pval(p) -> str:
    """A p-value to three significant figures, in scientific notation below 1e-4."""
    if p is None or is_nan(p):
        return "n/a"
    p = float(p)
    if p == 0:
        return "< 1e-300"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def seconds(s) -> str:
    """A duration in seconds as seconds, minutes or hours."""
    if s is None or is_nan(s):
        return "n/a"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(s, 60)
    if m < 120:
        return f"{int(m)} min {sec:.0f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m)} min"


def words(key: str) -> str:
    """A key with its underscores as spaces."""
    return str(key).replace("_", " ")


def cluster_name(cid) -> str:
    """A cluster's name in the text ("cluster 3", or "noise" for -1)."""
    return "noise" if cid == -1 else f"cluster {cid}"


def anchor(cid) -> str:
    """The id of a cluster's section on the page, for links to it."""
    return "cluster-noise" if cid == -1 else f"cluster-{int(cid)}"


def value_text(v) -> str:
    """A setting's value as text: lists comma-separated, booleans yes/no, numbers by :func:`num`."""
    if isinstance(v, (list, tuple)):
        return ", ".join(value_text(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        return num(v)
    return "" if v is None else str(v)


def _flatten(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def kv_rows(mapping: dict, skip=lambda key: False) -> str:
    """Table rows of a nested mapping's dotted keys and values, less the keys ``skip`` accepts."""
    rows = []
    for key, v in _flatten(mapping):
        if skip(key):
            continue
        rows.append(f"<tr><th>{esc(words(key))}</th><td>{esc(value_text(v))}</td></tr>")
    return "\n".join(rows)


def img(name: str | None, alt: str, cls: str = "") -> str:
    """An ``<img>`` of a figure file in the report folder; empty without one."""
    if not name:
        return ""
    c = f' class="{cls}"' if cls else ""
    return f'<img src="{esc(quote(name))}" alt="{esc(alt)}"{c}>'


def swatch(cid: int, colors: dict) -> str:
    """A small square in a cluster's colour."""
    rgb = "".join(f"{round(255 * v):02x}" for v in colors[cid][:3])
    return f'<span class="swatch" style="background:#{rgb}"></span>'
