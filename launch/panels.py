"""The shipped Grafana dashboard as data: its panels and their PromQL, Grafana variables filled in.

Used by the live view and by the test that evaluates every query against a
real Prometheus, so both read the same file Grafana imports.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# Shipped inside the package (package data), so an installed streamrl finds it wherever it lives.
DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "streamrl.json"
# Grafana's $__rate_interval is max(4 x scrape interval, step + scrape interval); 4 x 2 s scrape = 8 s,
# widened so a rate over a short or just-started run still spans several scrapes.
DEFAULT_RATE_INTERVAL = "30s"


@dataclass(frozen=True)
class Query:
    panel: str
    legend: str
    expr: str


def load_dashboard(path: str | os.PathLike = DASHBOARD) -> dict:
    with open(path) as f:
        return json.load(f)


def iter_panels(dashboard: dict) -> list[dict]:
    """Every non-row panel, including panels nested in collapsed rows."""
    out = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def render(
    expr: str, rate_interval: str = DEFAULT_RATE_INTERVAL, run: str = ".*", host: str = ".*"
) -> str:
    """Replace the Grafana variables the dashboard uses so plain Prometheus can evaluate ``expr``:
    ``$run`` and ``$host`` (regexes over the scrape targets' labels; every run and host by
    default, as Grafana's "All")."""
    return (
        expr.replace("$__rate_interval", rate_interval).replace("$run", run).replace("$host", host)
    )


def queries(dashboard: dict | None = None) -> list[Query]:
    """(panel title, legend, raw expr) of every target of every panel, in dashboard order."""
    dashboard = load_dashboard() if dashboard is None else dashboard
    return [
        Query(panel["title"], target.get("legendFormat", ""), target.get("expr", ""))
        for panel in iter_panels(dashboard)
        for target in panel.get("targets", [])
    ]
