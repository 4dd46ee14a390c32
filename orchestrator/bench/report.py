"""The scaling report as one self-contained HTML page: tables, two inline SVG charts, the data.

No script runs, no file or address is fetched: the page opens from ``runs/<id>/`` on any machine.
Charts: the speed-up against the number of nodes, with equal and measured shares beside the ideal
(linear in ranks) and the probe's bound (the sum of the ranks' measured speeds); and, for the
largest node set, each rank's step time with equal and with measured shares, split into its own
compute time and the rest (communication, waiting for slower ranks). Every point carries its
figures in ``data-*`` attributes and a ``<title>``, and the whole report is embedded as JSON
(``<script type="application/json" id="bench-data">``, data only, never executed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

from orchestrator.bench.probe import ProbeReport
from orchestrator.bench.scaling import MODES, ScalingReport, ScalingRun

COLORS = {"equal": "#4c72b0", "measured": "#dd8452", "ideal": "#555555", "probe": "#55a868"}
WIDTH, HEIGHT, PAD = 600, 320, 56


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _attr(**data: Any) -> str:
    """``data-*`` attributes, escaped (None written as an empty value)."""
    return " ".join(
        f'data-{name.replace("_", "-")}="{escape("" if v is None else str(v), quote=True)}"'
        for name, v in data.items()
    )


def _x(value: float, x_max: float) -> float:
    """Node counts 1..x_max spread over the plot, half a step of margin on both sides."""
    return PAD + (WIDTH - 2 * PAD) * (value - 0.5) / max(x_max, 1)


def _axes(x_max: float, y_max: float, x_label: str, y_label: str, x_ticks: Sequence[float]) -> list[str]:
    inner_h = HEIGHT - 2 * PAD
    parts = [
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#333"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#333"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="12" y="{HEIGHT / 2}" transform="rotate(-90 12 {HEIGHT / 2})" text-anchor="middle">'
        f"{escape(y_label)}</text>",
    ]
    for tick in x_ticks:
        x = _x(tick, x_max)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{tick:g}</text>')
    for i in range(5):
        value = y_max * i / 4
        y = HEIGHT - PAD - inner_h * i / 4
        parts.append(f'<text x="{PAD - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>')
        parts.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" y2="{y:.1f}" stroke="#eee"/>')
    return parts


def speedup_svg(scaling: ScalingReport) -> str:
    rows = scaling.rows()
    base = scaling.baseline()
    counts = [row.nodes for row in rows]
    x_max = max(counts, default=1)
    series: dict[str, list[tuple[int, int, float, float | None]]] = {m: [] for m in MODES}
    ideal: list[tuple[int, float]] = []
    bound: list[tuple[int, float]] = []
    for row in rows:
        for mode in MODES:
            rate, speedup, _eff = row.figures.get(mode, (None, None, None))
            if speedup is not None:
                series[mode].append((row.nodes, row.ranks, speedup, rate))
        if base is not None and base.ranks:
            ideal.append((row.nodes, row.ranks / base.ranks))
        if row.probe_bound is not None:
            bound.append((row.nodes, row.probe_bound))
    values = [p[2] for s in series.values() for p in s] + [v for _, v in ideal] + [v for _, v in bound]
    if base is not None and base.samples_per_s:
        values += [r.samples_per_s / base.samples_per_s for r in scaling.runs if r.ok and r.samples_per_s]
    y_max = max(values, default=1.0) * 1.1 or 1.0
    inner_h = HEIGHT - 2 * PAD

    def xy(nodes: float, value: float) -> tuple[float, float]:
        return _x(nodes, x_max), HEIGHT - PAD - inner_h * value / y_max

    parts = _axes(x_max, y_max, "nodes", "speed-up", counts)
    for name, line, dash in (("ideal", ideal, "6 4"), ("probe", bound, "2 3")):
        if line:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, v) for n, v in line))
            parts.append(
                f'<polyline class="line" data-series="{name}" points="{path}" fill="none" '
                f'stroke="{COLORS[name]}" stroke-dasharray="{dash}"/>'
            )
    for mode, points in series.items():
        if not points:
            continue
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, s) for n, _r, s, _rate in points))
        parts.append(
            f'<polyline class="line" data-series="{mode}" points="{path}" fill="none" '
            f'stroke="{COLORS[mode]}" stroke-width="2"/>'
        )
        base_rate = base.samples_per_s if base is not None else None
        for nodes, ranks, speedup, rate in points:
            rounds = scaling.round_rates(nodes, mode)
            for other in rounds if len(rounds) > 1 and base_rate else []:  # every round, faint
                ox, oy = xy(nodes, other / (base_rate or 1.0))
                parts.append(
                    f'<circle class="round" {_attr(series=mode, nodes=nodes, samples_per_s=other)} '
                    f'cx="{ox:.1f}" cy="{oy:.1f}" r="2" fill="{COLORS[mode]}" fill-opacity="0.35"/>'
                )
            x, y = xy(nodes, speedup)
            data = _attr(series=mode, nodes=nodes, ranks=ranks, speedup=f"{speedup:.4f}", samples_per_s=rate)
            title = (
                f"{mode} shares, {nodes} node(s), {ranks} rank(s): {speedup:.2f}x, {_fmt(rate, 0)} samples/s"
            )
            parts.append(
                f'<circle class="point" {data} cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{COLORS[mode]}">'
                f"<title>{escape(title)}</title></circle>"
            )
    legend = [("equal shares", "equal"), ("measured shares", "measured"), ("ideal (ranks)", "ideal")]
    if bound:
        legend.append(("probe bound", "probe"))
    for i, (label, key) in enumerate(legend):
        y = PAD + 14 * i
        parts.append(f'<rect x="{PAD + 10}" y="{y - 8}" width="10" height="10" fill="{COLORS[key]}"/>')
        parts.append(f'<text x="{PAD + 26}" y="{y + 1}">{escape(label)}</text>')
    return _svg("speedup", parts)


def step_time_svg(scaling: ScalingReport) -> str:
    """Per rank of the largest node set: step time (light) and compute time (dark), equal vs measured."""
    largest = max((len(r.nodes) for r in scaling.runs), default=0)
    runs = [scaling.run(largest, mode) for mode in MODES]
    present = [r for r in runs if r is not None and r.per_rank]
    ranks = sorted({f.rank for r in present for f in r.per_rank})
    values = [f.step_time or 0.0 for r in present for f in r.per_rank]
    y_max = max(values, default=0.0) * 1.1 or 1.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    group = inner_w / max(len(ranks), 1)
    bar = group / (len(MODES) + 1)
    parts = _axes(0, y_max * 1000, "rank (node)", "ms per step", [])
    for slot, rank in enumerate(ranks):
        node = ""
        for m, run in enumerate(runs):
            if run is None:
                continue
            figures = next((f for f in run.per_rank if f.rank == rank), None)
            if figures is None or figures.step_time is None:
                continue
            node = figures.node
            x = PAD + slot * group + bar * (m + 0.5)
            for kind, value, opacity in (
                ("step", figures.step_time, 0.35),
                ("compute", figures.compute_time, 1),
            ):
                if value is None:
                    continue
                height = inner_h * value / y_max
                data = _attr(
                    mode=run.mode,
                    rank=rank,
                    node=figures.node,
                    kind=kind,
                    seconds=f"{value:.6f}",
                    share=figures.share,
                )
                title = (
                    f"rank {rank} ({figures.node}), {run.mode} shares ({figures.share} samples): "
                    f"{kind} {value * 1000:.1f} ms"
                )
                parts.append(
                    f'<rect class="bar" {data} x="{x:.1f}" y="{HEIGHT - PAD - height:.1f}" width="{bar:.1f}" '
                    f'height="{height:.1f}" fill="{COLORS[run.mode]}" fill-opacity="{opacity}">'
                    f"<title>{escape(title)}</title></rect>"
                )
        label_x = PAD + slot * group + group / 2
        parts.append(
            f'<text x="{label_x:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">'
            f"{rank} ({escape(node)})</text>"
        )
    for i, mode in enumerate(MODES):  # the legend, in the margin above the bars
        x = PAD + 130 * i
        parts.append(f'<rect x="{x}" y="12" width="10" height="10" fill="{COLORS[mode]}"/>')
        parts.append(f'<text x="{x + 16}" y="21">{mode} shares</text>')
    note = "dark: the rank's own compute; light: the whole step"
    parts.append(f'<text x="{PAD}" y="38">{escape(note)}</text>')
    return _svg("step-time", parts)


def _svg(name: str, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<svg id="{name}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">\n{body}\n</svg>'
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], name: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def probe_rows(probe: ProbeReport) -> list[list[str]]:
    fastest = max((r.samples_per_s or 0.0 for r in probe.ranks.values()), default=0.0)
    rows = []
    for rank in sorted(probe.ranks):
        r = probe.ranks[rank]
        relative = r.samples_per_s / fastest if r.samples_per_s and fastest else None
        rows.append(
            [
                str(rank),
                r.node,
                r.device or ", ".join(probe.node_gpus.get(r.node, [])) or "-",
                _fmt(r.samples_per_s, 0),
                _fmt(None if r.spread is None else r.spread * 100, 1, " %"),
                _fmt(relative, 2),
                r.error or "",
            ]
        )
    return rows


PROBE_HEADER = ("rank", "node", "device", "samples/s", "spread", "relative", "error")
SCALING_HEADER = (
    "nodes",
    "ranks",
    "equal samples/s",
    "equal speed-up",
    "equal efficiency",
    "measured samples/s",
    "measured speed-up",
    "measured efficiency",
    "probe bound",
)


def scaling_rows(scaling: ScalingReport) -> list[list[str]]:
    out = []
    for row in scaling.rows():
        cells = [str(row.nodes), str(row.ranks)]
        for mode in MODES:
            rate, speedup, efficiency = row.figures.get(mode, (None, None, None))
            rounds = scaling.round_rates(row.nodes, mode)
            spread = f" ({min(rounds):.0f}-{max(rounds):.0f})" if len(rounds) > 1 else ""
            cells += [
                _fmt(rate, 0) + spread,
                _fmt(speedup, 2, "x"),
                _fmt(None if efficiency is None else efficiency * 100, 0, " %"),
            ]
        cells.append(_fmt(row.probe_bound, 2, "x"))
        out.append(cells)
    return out


def rank_rows(scaling: ScalingReport) -> list[list[str]]:
    """Per rank of the largest node set: share and step/compute time, equal then measured."""
    largest = max((len(r.nodes) for r in scaling.runs), default=0)
    runs: list[ScalingRun | None] = [scaling.run(largest, mode) for mode in MODES]
    ranks = sorted({f.rank for r in runs if r is not None for f in r.per_rank})
    rows = []
    for rank in ranks:
        cells = [str(rank)]
        node = ""
        for run in runs:
            figures = None if run is None else next((f for f in run.per_rank if f.rank == rank), None)
            if figures is None:
                cells += ["-", "-", "-"]
                continue
            node = figures.node
            cells += [
                str(figures.share),
                _fmt(None if figures.step_time is None else figures.step_time * 1000, 1),
                _fmt(None if figures.compute_time is None else figures.compute_time * 1000, 1),
            ]
        rows.append([cells[0], node, *cells[1:]])
    return rows


RANK_HEADER = (
    "rank",
    "node",
    "equal share",
    "equal step ms",
    "equal compute ms",
    "measured share",
    "measured step ms",
    "measured compute ms",
)


def render_html(
    *, title: str, probe: ProbeReport | None, scaling: ScalingReport, data: dict[str, Any], note: str = ""
) -> str:
    """The page (see the module docstring)."""
    sections = [f"<h1>{escape(title)}</h1>"]
    if note:
        sections.append(f"<p>{escape(note)}</p>")
    if probe is not None:
        sections.append(
            f"<h2>Throughput per rank</h2><p>workload {escape(probe.workload)}, batch {probe.batch_size}, "
            f"{probe.repeats} repeats, measured {escape(probe.measured_at)}; "
            "spread = (max - min) / median</p>"
        )
        sections.append(_table(PROBE_HEADER, probe_rows(probe), "probe"))
    sections.append(
        f"<h2>Scaling</h2><p>{scaling.steps} steps per run"
        + (
            f", {scaling.rounds} rounds per node set and mode (the median run; in brackets the range, faint "
            "points in the chart)"
            if scaling.rounds > 1
            else ""
        )
        + "; speed-up against the first node set with equal shares; efficiency = speed-up / (ranks / "
        "its ranks); probe bound = the ranks' summed probe speeds against the first set's</p>"
    )
    sections.append(_table(SCALING_HEADER, scaling_rows(scaling), "scaling"))
    sections.append(speedup_svg(scaling))
    largest = max((len(r.nodes) for r in scaling.runs), default=0)
    sections.append(f"<h2>Step time per rank, {largest} node(s)</h2>")
    sections.append(_table(RANK_HEADER, rank_rows(scaling), "ranks"))
    sections.append(step_time_svg(scaling))
    failed = [r for r in scaling.runs if r.error]
    if failed:
        items = "".join(
            f"<li>{len(r.nodes)} node(s), {escape(r.mode)}: {escape(r.error or '')}</li>" for r in failed
        )
        sections.append(f"<h2>Runs that failed</h2><ul>{items}</ul>")
    payload = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    sections.append(f'<script type="application/json" id="bench-data">{payload}</script>')
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:60em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{style}</style></head><body>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
