"""The one palette for clusters: a colour per cluster id, the same in the report's figures
(:mod:`rapids_attn.explain.figures`) and in the explorer (:mod:`rapids_attn.explain.explorer`).

A cluster's colour depends on its id alone, never on how many clusters a view shows or in which order, so a
cluster keeps its colour across the report's scatter, its dominant-cluster grid and the explorer's two views.
The colours are qualitative and ordered so that neighbouring ids are far apart: ids 0-8 take matplotlib's
``tab10`` (the Tableau 10 colours), 9-17 the light halves of ``tab20``, 18-53 the four shades of ``tab20b``
and ``tab20c``, one shade of every hue at a time, alternating the two; id 54 starts over. Noise (``-1``:
DBSCAN's and HDBSCAN's unclustered maps) is grey, and no cluster is: Tableau's greys are left out.
"""

from __future__ import annotations

from functools import cache

#: the colour of noise (cluster -1)
NOISE = "#b8b8b8"


@cache
def palette() -> tuple[str, ...]:
    """The cluster colours as ``#rrggbb``, indexed by cluster id (modulo its length)."""
    import matplotlib
    from matplotlib.colors import to_hex

    tab10, tab20 = matplotlib.colormaps["tab10"], matplotlib.colormaps["tab20"]
    # Tableau's grey (tab10's 8th, tab20's 16th; tab20c's fifth hue) is left out: grey is noise's
    out = [tab10(i) for i in range(10) if i != 7] + [tab20(2 * i + 1) for i in range(10) if i != 7]
    b, c = matplotlib.colormaps["tab20b"], matplotlib.colormaps["tab20c"]
    for shade in (0, 2, 1, 3):  # one shade of every hue of both maps before the next shade
        out += [x for hue in range(5) for x in (b(4 * hue + shade), c(4 * hue + shade))][:-1]
    return tuple(to_hex(x) for x in out)


def cluster_colour(cluster_id) -> str:
    """The colour of one cluster id, ``#rrggbb``; noise (-1) grey."""
    cid = int(cluster_id)
    if cid < 0:
        return NOISE
    colours = palette()
    return colours[cid % len(colours)]


def cluster_colours(cluster_ids) -> dict[int, str]:
    """``{id: "#rrggbb"}`` for these ids, in their order."""
    return {int(c): cluster_colour(c) for c in cluster_ids}
