"""The relevance stage's results in the report: where relevance goes, how the methods disagree, and the
head atlas (a figure of the heads placed by their distances, coloured by atlas cluster, each labelled
with its dominant map cluster)."""

from __future__ import annotations

import numpy as np

from rapids_attn.explain.formatting import esc, img, num

#: figure file names (the report's clean-up keeps only the names it wrote)
FIGURES = ("relevance_shares.png", "head_atlas.png")
ROLES = ("question", "context", "answer", "special", "punct")


def stored_result(g) -> dict | None:
    """The relevance stage's result from the store; None when the stage has not completed."""
    from rapids_attn.store.schema import Attr, complete_attr

    return dict(g.attrs.get(Attr.RELEVANCE)) if g.attrs.get(complete_attr("relevance")) else None


def figures(out_dir, info: dict) -> list[str]:
    """The share of relevance per role and method (with the tokens' own share), and the head atlas."""
    from rapids_attn.explain import figures as F

    names = []
    shares = info.get("shares") or {}
    methods = [m for m in info.get("methods", []) if shares.get(m)]
    roles = [r for r in ROLES if any(r in shares[m] for m in methods)]
    if methods and roles:
        fig = F.new_figure(1.2 + 1.3 * len(roles), 3.6)
        ax = fig.add_subplot(1, 1, 1)
        width = 0.8 / (len(methods) + 1)
        x = np.arange(len(roles))
        for k, m in enumerate(methods):
            v = [shares[m].get(r, {}).get("share", np.nan) for r in roles]
            ax.bar(x + k * width, v, width, label=m)
        tok = [next((shares[m][r]["token_share"] for m in methods if r in shares[m]), np.nan) for r in roles]
        ax.bar(x + len(methods) * width, tok, width, label="share of tokens", color="lightgrey", hatch="//")
        ax.set_xticks(x + 0.4 - width / 2, roles)
        ax.set_ylabel("share of relevance")
        ax.legend(fontsize=7, ncol=2)
        names.append(F.save(fig, out_dir, FIGURES[0]))
    atlas = info.get("atlas")
    if atlas and atlas.get("heads"):
        heads = atlas["heads"]
        xy = np.array([[h["x"], h["y"]] for h in heads])
        lab = np.array([h["atlas_cluster"] for h in heads])
        fig = F.new_figure(6.5, 5.5)
        ax = fig.add_subplot(1, 1, 1)
        ax.scatter(xy[:, 0], xy[:, 1], c=lab, cmap="tab10", s=60, alpha=0.8)
        for h in heads:
            mc = f" c{h['map_cluster']}" if h.get("map_cluster", -1) >= 0 else ""
            ax.annotate(
                f"L{h['layer']}H{h['head']}{mc}",
                (h["x"], h["y"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set_xlabel("MDS 1")
        ax.set_ylabel("MDS 2")
        ax.set_title(
            "heads placed by Jensen-Shannon distance (colour: atlas cluster; cN: dominant map cluster)", fontsize=8
        )
        names.append(F.save(fig, out_dir, FIGURES[1]))
    return names


def section(info: dict | None, figs: list[str]) -> str:
    """The report's "Where relevance goes" section (empty when the relevance stage has not run)."""
    if not info:
        return ""
    head = f"""
<section id="relevance"><h2>Where relevance goes, and how heads relate</h2>
<p class="note">From the relevance stage: {num(info.get("examples"))} examples, relevance of every token for
the {esc(info.get("query"))} token's row. "share" is the mean over examples of the relevance on the role's
tokens divided by all relevance, with a 95% t interval; "lift" divides it by the share of the tokens the role
holds (1: as much as uniform relevance would give).</p>"""
    shares = info.get("shares") or {}
    rows = []
    for m, per in shares.items():
        cells = "".join(
            f"<td class=n>{num(per[r]['share'])} [{num(per[r]['lo'])}, {num(per[r]['hi'])}] x{num(per[r]['lift'])}</td>"
            if r in per
            else "<td class=n>n/a</td>"
            for r in ROLES
        )
        rows.append(f"<tr><td>{esc(m)}</td>{cells}</tr>")
    table = (
        "<table><thead><tr><th>method</th>"
        + "".join(f"<th class=n>{esc(r)}: share [CI] x lift</th>" for r in ROLES)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    dis = info.get("disagreement") or {}
    drows = "".join(
        f"<tr><td>{esc(k)}</td><td class=n>{num(v['mean'])}</td><td class=n>{num(v['q25'])}</td>"
        f"<td class=n>{num(v['median'])}</td><td class=n>{num(v['q75'])}</td><td class=n>{num(v['examples'])}</td></tr>"
        for k, v in dis.items()
    )
    dtable = (
        "<p>How the methods agree: Spearman's rho between two methods' relevance over an example's tokens.</p>"
        "<table><thead><tr><th>methods</th><th class=n>mean</th><th class=n>25%</th><th class=n>median</th>"
        f"<th class=n>75%</th><th class=n>examples</th></tr></thead><tbody>{drows}</tbody></table>"
        if drows
        else ""
    )
    skipped = info.get("flow_skipped") or 0
    note = (
        f"<p>Attention flow was skipped on {num(skipped)} examples longer than {num(info.get('flow_max_tokens'))} "
        "tokens (relevance.flow_max_tokens).</p>"
        if skipped
        else ""
    )
    atlas = info.get("atlas")
    atlas_html = ""
    if atlas:
        groups = "".join(
            f"<tr><td>{esc(c)}</td><td>{esc(', '.join(f'L{a}H{b}' for a, b in g['heads']))}</td>"
            f"<td class=n>{num(g['mean_distance'])}</td></tr>"
            for c, g in atlas.get("clusters", {}).items()
        )
        atlas_html = (
            f"<p>The head atlas: Clark et al.'s distance between heads (the mean Jensen-Shannon divergence of their "
            f"rows on the same token; mean over all pairs {num(atlas.get('mean_distance'))} nats), embedded by metric "
            "MDS and clustered by average linkage. summary.json lists every head's related heads.</p>"
            "<table><thead><tr><th>atlas cluster</th><th>heads</th><th class=n>mean distance inside</th></tr></thead>"
            f"<tbody>{groups}</tbody></table>"
        )
    imgs = "".join(img(f, "relevance and the head atlas") for f in figs)
    return head + table + note + dtable + atlas_html + imgs + "</section>"


def place_heads(info: dict | None, findings, head_detectors: np.ndarray, heads_info: dict | None) -> None:
    """Join each atlas head (model layer and head) to what the other stages measured of it, in place:
    ``detectors`` (each detector's mean over the examples, from the explain stage), ``consistency`` (how
    steadily its maps fall in one cluster) and, where the heads stage ran, ``importance`` and ``ablation_cost``.
    A head the store did not keep (extract.layers / extract.heads) gets none of the store's measures."""
    atlas = (info or {}).get("atlas")
    if not atlas:
        return
    li = {int(layer): i for i, layer in enumerate(findings.layers)}
    hi = {int(head): j for j, head in enumerate(findings.heads)}
    names = list(findings.detectors.names)
    consistency = np.asarray(findings.heads_table.consistency, np.float64)
    imp = cost = None
    if heads_info:
        if heads_info.get("importance") is not None:
            imp = np.asarray(heads_info["importance"], np.float64)
        if heads_info.get("cost") is not None:
            cost = np.asarray(heads_info["cost"], np.float64)

    def _f(v) -> float | None:
        return None if not np.isfinite(v) else round(float(v), 4)

    for h in atlas.get("heads", []):
        a, b = int(h["layer"]), int(h["head"])
        if a in li and b in hi:
            i, j = li[a], hi[b]
            h["detectors"] = {n: _f(head_detectors[i, j, k]) for k, n in enumerate(names)}
            h["consistency"] = _f(consistency[i, j])
        for key, arr in (("importance", imp), ("ablation_cost", cost)):
            if arr is not None and a < arr.shape[0] and b < arr.shape[1]:
                h[key] = _f(arr[a, b])
