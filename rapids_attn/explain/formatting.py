"""The report's HTML formatting helpers: escaping, numbers, percentages, p-values, durations, names.

Small pure functions that turn one value into safe HTML text, shared by the page assembly
(:mod:`rapids_attn.explain.report`) and the section renderers (:mod:`rapids_attn.explain.sections`);
kept apart so that both format a number, a p-value or a cluster's name the same way. Everything that
comes from the data goes through :func:`_e` (HTML-escape). The names keep their leading underscore:
they are the explain package's own, not an API.
"""

from __future__ import annotations

import html
import math
from urllib.parse import quote


def _e(x) -> str:
    """HTML-escape anything (None -> empty)."""
    return html.escape("" if x is None else str(x), quote=True)


def _is_nan(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _num(x, digits: int = 3) -> str:
    """A readable number: ints with thousands separators, floats to ``digits`` significant figures."""
    if x is None or _is_nan(x):
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


def _pct(x) -> str:
    if x is None or _is_nan(x):
        return "n/a"
    return f"{100 * float(x):.1f}%"


def _pval(p) -> str:
    if p is None or _is_nan(p):
        return "n/a"
    p = float(p)
    if p == 0:
        return "< 1e-300"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def _seconds(s) -> str:
    if s is None or _is_nan(s):
        return "n/a"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(s, 60)
    if m < 120:
        return f"{int(m)} min {sec:.0f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m)} min"


def _words(key: str) -> str:
    return str(key).replace("_", " ")


def _cluster_name(cid) -> str:
    return "noise" if cid == -1 else f"cluster {cid}"


def _anchor(cid) -> str:
    return "cluster-noise" if cid == -1 else f"cluster-{int(cid)}"


def _value_text(v) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_value_text(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        return _num(v)
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


def _kv_rows(mapping: dict, skip=lambda key: False) -> str:
    rows = []
    for key, v in _flatten(mapping):
        if skip(key):
            continue
        rows.append(f"<tr><th>{_e(_words(key))}</th><td>{_e(_value_text(v))}</td></tr>")
    return "\n".join(rows)


def _img(name: str | None, alt: str, cls: str = "") -> str:
    if not name:
        return ""
    c = f' class="{cls}"' if cls else ""
    return f'<img src="{_e(quote(name))}" alt="{_e(alt)}"{c}>'


def _swatch(cid: int, colors: dict) -> str:
    rgb = "".join(f"{int(255 * v):02x}" for v in colors[cid][:3])
    return f'<span class="swatch" style="background:#{rgb}"></span>'
