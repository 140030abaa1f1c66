"""The report sections of the stages the explain stage reports (:class:`rapids_attn.stage.ReportSection`): the
heads stage's ("Which heads matter", ``head_importance`` in ``summary.json``) and the relevance stage's ("Where
relevance goes", ``relevance``). Each stage names its own, through :meth:`rapids_attn.stage.Stage.report_section`;
what each section reads, draws and writes is :mod:`rapids_attn.explain.heads` and
:mod:`rapids_attn.explain.relevance`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapids_attn.explain import heads as heads_report
from rapids_attn.explain import relevance as relevance_report
from rapids_attn.stage import ReportSection


def pattern_of(files: tuple[str, ...]) -> str:
    """A section's :attr:`~rapids_attn.stage.ReportSection.figure_pattern` from the figure files it writes."""
    return "|".join(re.escape(Path(f).stem) for f in files)


@dataclass
class HeadsReport:
    """What the heads section read: the join to the clusters (None: no heads result, or one of another
    clustering), the warning that says why it was not joined, and the heads stage's stored result."""

    joined: dict | None = None
    warning: str | None = None
    info: dict | None = field(default=None)


class HeadsSection(ReportSection):
    anchor = "importance"
    title = "Which heads matter"
    figure_pattern = pattern_of(heads_report.FIGURES)

    def read(self, g, summary: dict, findings, arrays, earlier: dict[str, Any]) -> HeadsReport:
        from rapids_attn.explain.heads import join, stored_result

        info = stored_result(g)
        joined, warning = join(
            g,
            info,
            findings.heads_table.dominant_cluster,
            findings.layers,
            findings.heads,
            [c.id for c in findings.clusters],
        )
        if joined is not None:
            summary["head_importance"] = joined
        if warning:
            findings.warnings.append(warning)
        return HeadsReport(joined, warning, info)

    def figures(self, out_dir, state: HeadsReport | None) -> list[str]:
        if state is None or state.joined is None or state.warning:
            return []
        from rapids_attn.explain.heads import figures

        return figures(out_dir, state.info or {})

    def html(self, state: HeadsReport | None, figures: list[str]) -> str:
        from rapids_attn.explain.heads import section

        return section(None, None, figures) if state is None else section(state.joined, state.warning, figures)


class RelevanceSection(ReportSection):
    anchor = "relevance"
    title = "Relevance and the head atlas"
    figure_pattern = pattern_of(relevance_report.FIGURES)

    def read(self, g, summary: dict, findings, arrays, earlier: dict[str, Any]) -> dict | None:
        """The relevance stage's stored result, each atlas head joined to the detectors and, where the heads
        section read a heads result, to its importance and ablation cost."""
        from rapids_attn.explain.relevance import place_heads, stored_result

        info = stored_result(g)
        if info is not None:
            heads = earlier.get("heads")
            place_heads(info, findings, arrays.head_detectors, heads.info if isinstance(heads, HeadsReport) else None)
            summary["relevance"] = info
        return info

    def figures(self, out_dir, state: dict | None) -> list[str]:
        if not state:
            return []
        from rapids_attn.explain.relevance import figures

        return figures(out_dir, state)

    def html(self, state: dict | None, figures: list[str]) -> str:
        from rapids_attn.explain.relevance import section

        return section(state, figures)
