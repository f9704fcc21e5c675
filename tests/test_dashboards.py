"""The shipped Grafana dashboard: well-formed, documented metrics only, PromQL that parses, and data from a real run."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from streamrl.launch.panels import iter_panels, load_dashboard, queries, render

ROOT = Path(__file__).resolve().parent.parent
METRIC = re.compile(r"\bstreamrl_[a-z0-9_]+")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
PROMETHEUS_BUILTINS = {"up"}


def documented_metrics() -> tuple[set[str], set[str]]:
    """(all metric names, histogram and summary names) from the Metrics section of
    docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Metrics", 1)[1]
    names, histograms = set(), set()
    pattern = r"`(streamrl_[a-z0-9_]+)(?:\{[^}`]*\})?`(\s*\((?:histogram|summary))?"
    for name, kind in re.findall(pattern, text):
        names.add(name)
        if kind:
            histograms.add(name)
    return names, histograms


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr)) | {
        w for w in re.findall(r"\b[a-z_]+\b(?=\s*[{\[])", expr) if w in PROMETHEUS_BUILTINS
    }


def promql_errors(exprs: list[str], tmp_path: Path) -> str:
    """promtool's parse errors for ``exprs`` (each checked as a recording rule); empty if all parse."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if check.returncode == 0 else check.stdout + check.stderr


def test_dashboard_is_importable_grafana_json_bound_to_the_prometheus_datasource_variable():
    dashboard = load_dashboard()
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    panels = iter_panels(dashboard)
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for p in panels if p not in dashboard["panels"]
    ]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel[
            "title"
        ]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]


def test_every_panel_has_a_promql_target():
    for panel in iter_panels(load_dashboard()):
        assert panel["targets"], f"panel {panel['title']!r} has no targets"
        for target in panel["targets"]:
            assert target["expr"].strip(), (
                f"panel {panel['title']!r} target {target['refId']} has no expression"
            )


def test_every_metric_the_dashboard_reads_is_documented_in_architecture_md():
    names, histograms = documented_metrics()
    assert len(names) > 40 and "streamrl_learner_staleness_versions" in histograms
    unknown = []
    for q in queries():
        for name in metric_names(q.expr):
            base = next((name[: -len(s)] for s in HISTOGRAM_SERIES if name.endswith(s)), None)
            if name not in names and name not in PROMETHEUS_BUILTINS and base not in histograms:
                unknown.append(f"{q.panel}: {name}")
    assert not unknown, "metrics not in docs/architecture.md: " + ", ".join(unknown)


def test_dashboard_covers_throughput_staleness_reward_loss_weights_versions_and_step_phases():
    exprs = " ".join(q.expr for q in queries())
    required = [
        "sum by (actor) (rate(streamrl_actor_tokens_generated_total",
        "sum(rate(streamrl_actor_tokens_generated_total",
        "streamrl_learner_tokens_trained_total",
        "streamrl_stream_produced_total",
        "streamrl_stream_consumed_total",
        "streamrl_stream_length",
        "streamrl_stream_pending",
        "histogram_quantile(0.9, sum by (le) (rate(streamrl_learner_staleness_versions_bucket",
        "histogram_quantile(0.5, sum by (le) (rate(streamrl_learner_reward_bucket",
        "sum(rate(streamrl_learner_loss_sum",
        "sum(rate(streamrl_learner_kl_sum",
        "sum(rate(streamrl_learner_grad_norm_sum",
        "streamrl_learner_clip_ratio",
        "streamrl_learner_is_weight_mean",
        "streamrl_learner_is_ess",
        "streamrl_learner_behaviour_kl",
        "streamrl_learner_stale_token_fraction",
        "streamrl_learner_idle_fraction",
        "streamrl_weights_publish_seconds_bucket",
        "streamrl_actor_policy_version",
        "streamrl_actor_version_lag",
        "streamrl_actors_alive",
        "sum by (phase) (rate(streamrl_learner_step_phase_seconds_sum",
    ]
    missing = [r for r in required if r not in exprs]
    assert not missing, missing


def test_every_selector_is_scoped_by_the_run_and_host_variables_and_every_panel_has_a_unit():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"run", "host"}
    for v in variables.values():
        assert v["type"] == "query" and v["includeAll"] and v["allValue"] == ".*"
        assert v["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    assert "$run" in variables["host"]["query"]["query"]
    for q in queries():
        # each metric name (not a function) is followed by a selector naming both variables
        for m in re.finditer(r"\b(streamrl_[a-z0-9_]+|up)\b(?!\s*\()", q.expr):
            assert q.expr[m.end() :].startswith('{run=~"$run", host=~"$host"'), (q.panel, q.expr)
    for panel in iter_panels(dashboard):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit and unit != "short", panel["title"]
    one_run = render(queries()[0].expr, run="demo", host="h1")
    assert 'run=~"demo", host=~"h1"' in one_run and "$" not in one_run


def test_every_dashboard_expression_parses_with_promtool(tmp_path):
    exprs = [render(q.expr) for q in queries()]
    assert not any("$" in e for e in exprs), (
        "a Grafana variable is left that render() does not fill in"
    )
    assert promql_errors(exprs, tmp_path) == ""
    # The check itself must catch a broken expression.
    assert "parse error" in promql_errors(["sum(rate(streamrl_learner_steps_total[30s])"], tmp_path)


# ---- the real thing ---------------------------------------------------------------------------

RUN_OVERRIDES = [
    "run.max_time_s=150",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "learner.groups_per_step=2",
    "learner.ack_policy=step",
    "algo.max_staleness=1",
]


@pytest.fixture(scope="module")
def short_run(redis_server, demo_policy, demo_dataset, tmp_path_factory):
    """A real streamrl run (Redis, learner, one actor via launch.Supervisor) trained for a few steps,
    and a real Prometheus that scraped it; shared by the tests below (starting a run is the cost)."""
    from streamrl.configs import load_config
    from streamrl.launch import supervisor as supervisor_mod
    from streamrl.launch.prometheus import PrometheusServer
    from streamrl.launch.scrape import prometheus_dir, sync_targets, write_prometheus_config

    overrides = RUN_OVERRIDES + [
        f"run.name=dash-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path_factory.mktemp('dash') / 'run'}",
        f"broker.redis_url={redis_server.url}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
    ]
    config_path = str(ROOT / "configs" / "demo_cpu.yaml")
    cfg = load_config(config_path, overrides)
    supervisor = supervisor_mod.Supervisor(cfg, actors=1).start()
    prom = None
    try:
        out = prometheus_dir(cfg.run.dir)
        prom = PrometheusServer(write_prometheus_config(out), out).start()

        def exercised() -> bool:
            sync_targets(supervisor.keys, supervisor.redis, out)
            # Several steps trained and weights reached the actor.
            return (
                _value(prom, "max(streamrl_learner_steps_total)") >= 3
                and _value(prom, 'count(up{role="actor"} == 1)') == 1
                and _value(prom, "min(streamrl_actor_policy_version)") >= 1
                and _value(prom, "sum(streamrl_weights_receive_seconds_count)") >= 1
            )

        def logs() -> str:
            return "\n".join(
                f"--- {p.name}\n{p.read_text()[-1500:]}"
                for p in sorted(supervisor.log_dir.glob("*.log"))
            )

        assert supervisor.wait_until(exercised, timeout=180), (
            f"run never trained and synced weights; targets {prom.targets()}\n{logs()}"
        )
        # Rates need two scrapes that saw a change; give every query a bounded chance to get there.
        supervisor.wait_until(lambda: not queries_without_data(prom), timeout=30, interval=1.0)
        yield prom, logs
    finally:
        if prom is not None:
            prom.stop()
        supervisor.stop()


def _value(prom, expr: str) -> float:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else float("nan")


def queries_without_data(prom) -> list[str]:
    """Dashboard queries whose result has no finite sample right now."""
    empty = []
    for q in queries():
        result = prom.query(render(q.expr))
        if not any(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result):
            empty.append(f"{q.panel} [{q.legend}]: {render(q.expr)} -> {result}")
    return empty


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_dashboard_query_returns_data(short_run):
    prom, logs = short_run
    empty = queries_without_data(prom)
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty) + f"\n{logs()}"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="headless Chromium (Debian `chromium`) renders the live view",
)
def test_live_view_draws_every_panel_with_data_from_a_real_run(short_run, tmp_path):
    from streamrl.broker.server import free_port
    from streamrl.launch.dashboard import serve_live_view

    prom, _logs = short_run
    port = free_port()
    view = serve_live_view(port)
    try:
        url = f"http://127.0.0.1:{port}/live.html?prom={prom.url}&range=5m"
        dom = subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={tmp_path / 'chrome'}",
                "--virtual-time-budget=15000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
        ).stdout
    finally:
        view.shutdown()
        view.server_close()
    body = re.search(r'<body[^>]*data-panels-with-data="(\d+)"[^>]*data-panels="(\d+)"', dom)
    assert body, f"live view never finished a refresh: {dom[:2000]}"
    with_data, panels = map(int, body.groups())
    assert panels == len(iter_panels(load_dashboard()))
    missing = re.findall(
        r'data-title="([^"]+)"><h3[^>]*>[^<]*</h3>(?:(?!class="panel").)*?class="error">([^<]*)<',
        dom,
        re.S,
    )
    assert with_data == panels, f"panels without data in the live view: {missing}"
