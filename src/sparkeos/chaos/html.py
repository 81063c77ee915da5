"""`sparkeos chaos --report chaos.html`: the run on one self-contained page, which opens offline (plotly.js is
inlined). At the top the verdict; then the timeline, its panels sharing the time axis: input fed and processed with
the sink's visible output, the lag, the time between committed batches, each fault a vertical mark named by its
kind and each restart a dotted one; then the audit table with its samples, and the faults with their recovery times.
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .report import ChaosReport, watch_summary

FAULT_COLOURS = {"driver-kill": "#d62728", "driver-kill-mid-commit": "#9467bd", "python-worker-kill": "#e377c2",
                 "executor-kill": "#7f7f7f", "relayout": "#e7ba52", "broker-kill": "#ff7f0e",
                 "postgres-crash": "#8c564b",
                 "network-kafka": "#17becf", "network-postgres": "#bcbd22", "long-downtime": "#393b79"}
TIMELINE_ID = "chaos-timeline"


def batch_intervals(report: ChaosReport) -> tuple[list[float], list[float]]:
    """(when, seconds since the one before) of each committed batch the samples saw, from the second on."""
    at, gaps = [], []
    last_batch, last_at = None, None
    for sample in report.samples:
        if sample.batch is None or sample.batch == last_batch:
            continue
        if last_at is not None:
            at.append(sample.at)
            gaps.append(round(sample.at - last_at, 2))
        last_batch, last_at = sample.batch, sample.at
    return at, gaps


def timeline(report: ChaosReport) -> go.Figure:
    figure = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.5, 0.25, 0.25],
                           specs=[[{"secondary_y": True}], [{}], [{}]],
                           subplot_titles=("input and output", "lag (records)", "seconds between committed batches"))
    times = [s.at for s in report.samples]
    figure.add_trace(go.Scatter(x=times, y=[s.input for s in report.samples], name="input fed"), row=1, col=1)
    figure.add_trace(go.Scatter(x=times, y=[s.processed for s in report.samples], name="input processed"),
                     row=1, col=1)
    figure.add_trace(go.Scatter(x=times, y=[s.output for s in report.samples], line={"dash": "dash"},
                                name=f"output visible ({report.output_unit})"), row=1, col=1, secondary_y=True)
    figure.add_trace(go.Scatter(x=times, y=[s.lag for s in report.samples], name="lag", showlegend=False),
                     row=2, col=1)
    at, gaps = batch_intervals(report)
    figure.add_trace(go.Bar(x=at, y=gaps, name="batch interval", showlegend=False), row=3, col=1)
    for event in report.events:
        if event.kind in FAULT_COLOURS:
            figure.add_vline(x=event.at, line={"color": FAULT_COLOURS[event.kind], "width": 2})
            figure.add_annotation(x=event.at, y=1.0, yref="paper", text=event.kind, showarrow=False, textangle=-90,
                                  xanchor="right", yanchor="top", font={"color": FAULT_COLOURS[event.kind], "size": 10})
        elif event.kind == "restart":
            figure.add_vline(x=event.at, line={"color": "#2ca02c", "dash": "dot", "width": 1})
    figure.update_xaxes(title_text="seconds since the run started", row=3, col=1)
    figure.update_layout(height=760, margin={"t": 40, "r": 40, "l": 60, "b": 50}, legend={"orientation": "h"},
                         template="plotly_white")
    return figure


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(report: ChaosReport) -> str:
    """The page, as one string."""
    audit = report.audit
    comparisons = audit.comparisons() if audit is not None else []
    audit_table = _table(["", "expected", "delivered", "missing", "duplicated", "unexpected"],
                         [[name, c.expected, c.delivered, c.missing, c.duplicated, c.unexpected]
                          for name, c in comparisons])
    samples = "".join(f"<li><b>{html.escape(name)} {html.escape(kind)}</b>: {html.escape(sample)}</li>"
                      for name, c in comparisons for kind, found in c.samples.items() for sample in found)
    faults_table = _table(["fault", "injected", "missed", "recovery, seconds to the next committed batch"],
                          [[kind, report.injected.get(kind, 0), report.missed.get(kind, 0),
                            ", ".join(f"{t:.1f}" for t in report.recovery_s.get(kind, [])) or "-"]
                           for kind in report.faults_chosen])
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in report.problems)
    verdict = "exact" if report.exact else "NOT exact"
    watched = (f"A reader watched the output all along: {html.escape(watch_summary(report.watched))}."
               if report.watched is not None else "")
    sandbox = ", ".join(f"{name} {where}" for name, where in report.sandbox.items())
    chart = timeline(report).to_html(full_html=False, include_plotlyjs=True, div_id=TIMELINE_ID)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>sparkeos chaos: {html.escape(report.job_name)} {verdict}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
.verdict {{ font-size: 28px; font-weight: bold; color: {"#2ca02c" if report.exact else "#d62728"}; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.facts {{ color: #555; }}
</style></head><body>
<h1>sparkeos chaos: {html.escape(report.job_name or report.job)}</h1>
<p class="verdict" id="verdict">{verdict}</p>
<p class="facts">seed {report.seed}; {report.input_records} input records ({report.corrupt_records} not decodable;
{report.aborted_input_records} more in aborted transactions);
{report.restarts} restarts; {report.seconds:.0f} s; sandbox: {html.escape(sandbox)}</p>
<ul id="problems">{problems}</ul>
{chart}
<h2>Audit: the output as an independent reader reads it</h2>
<div id="audit">{audit_table}</div>
<ul id="samples">{samples}</ul>
<p class="facts" id="watched">{watched}</p>
<h2>Faults</h2>
<div id="faults">{faults_table}</div>
</body></html>
"""


def write_report(report: ChaosReport, path: Path) -> None:
    Path(path).write_text(render(report), encoding="utf-8")
