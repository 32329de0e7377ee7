"""The chart's alert rules and dashboard (issue 30, item 5): `promtool check rules` and
`promtool test rules` (Debian's prometheus package) on files/alerts.yaml and on the rule the
chart renders, each alert tested firing and not firing (deploy/helm/railhop/tests/
alerts_test.yaml); every metric the rules and the dashboard name is one the agent exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import CHART, _run

from conftest import require

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks.md"
ALERTS = CHART / "files" / "alerts.yaml"
ALERT_TESTS = CHART / "tests" / "alerts_test.yaml"
DASHBOARD = CHART / "dashboards" / "railhop.json"
METRICS_PY = REPO / "agent" / "railhop" / "metrics.py"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    require(tool is not None, "no promtool: `make setup` installs Debian's prometheus package")
    assert tool is not None
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def _rendered_rule(*sets: str) -> dict[str, Any]:
    args = ["template", "rh", str(CHART), "--set", "prometheusRule.enabled=true"]
    for s in sets:
        args += ["--set", s]
    r = _run(*args)
    assert r.returncode == 0, r.stderr
    (rule,) = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "PrometheusRule"]
    assert isinstance(rule, dict)
    return rule


def test_promtool_checks_the_rules() -> None:
    r = _promtool("check", "rules", str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 6 rules found" in r.stdout
    alerts = {x["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for x in g["rules"]}
    assert alerts == {
        "RailhopNICDown",
        "RailhopRailsBelowMinimum",
        "RailhopFailoversFrequent",
        "RailhopEscalation",
        "RailhopAgentDown",
        "RailhopAgentAbsent",
    }


def test_each_alert_fires_and_stays_quiet_as_tested() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    cases = [c for t in tests["tests"] for c in t["alert_rule_test"]]
    alerts = {x["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for x in g["rules"]}
    for name in alerts:  # every alert has a firing case and a quiet case
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), name
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), name
    r = _promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_catches_a_wrong_expectation(tmp_path: Path) -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = [str(ALERTS)]
    case = tests["tests"][0]["alert_rule_test"][0]  # NIC down at 3m: pending, not firing
    case["eval_time"] = "5m"
    bad = tmp_path / "bad_test.yaml"
    bad.write_text(yaml.safe_dump(tests))
    r = _promtool("test", "rules", str(bad))
    assert r.returncode != 0 and "RailhopNICDown" in r.stdout + r.stderr


def test_the_chart_renders_the_same_rules_and_they_pass(tmp_path: Path) -> None:
    rule = _rendered_rule("prometheusRule.labels.release=kps")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump(rule["spec"]))
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = [str(rendered)]
    t = tmp_path / "rendered_test.yaml"
    t.write_text(yaml.safe_dump(tests))
    assert _promtool("check", "rules", str(rendered)).returncode == 0
    r = _promtool("test", "rules", str(t))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("template", "rh", str(CHART))
    assert "PrometheusRule" not in r.stdout  # off by default (needs the operator's CRDs)


def test_dashboard_configmap(tmp_path: Path) -> None:
    r = _run("template", "rh", str(CHART), "--set", "grafanaDashboard.enabled=true")
    assert r.returncode == 0, r.stderr
    (cm,) = [
        d
        for d in yaml.safe_load_all(r.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["railhop.json"])
    assert dash == json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    r = _run("template", "rh", str(CHART))
    assert "-dashboard" not in r.stdout


def test_the_dashboard_selects_by_node() -> None:
    """The variable is the `node` label (the pod's node name, which the ServiceMonitor and the
    PodMonitor relabel into `node`), not the instance IP: every panel query filters by it."""
    dash = json.loads(DASHBOARD.read_text())
    var = {v["name"]: v for v in dash["templating"]["list"]}
    assert "instance" not in var
    node = var["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"]
    assert node["definition"] == node["query"]["query"] == "label_values(railhop_build_info, node)"
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 16
    for e in exprs:
        selectors = re.findall(r"railhop_[a-z0-9_]+\{([^}]*)\}", e)
        metrics = _METRIC.findall(e)
        assert selectors and len(selectors) == len(metrics), e  # every metric selected...
        assert all('node=~"$node"' in sel for sel in selectors), e  # ...by node
        assert "instance" not in e and "$instance" not in e, e
    legends = [t.get("legendFormat", "") for p in dash["panels"] for t in p["targets"]]
    assert not [x for x in legends if "instance" in x]
    # the rails panel: up and the policy's minimum
    assert any("railhop_rails_up_min" in e for e in exprs)
    # the chart relabels the node name into `node` in both monitors
    r = _run("template", "rh", str(CHART), "--set", "serviceMonitor.enabled=true",
             "--set", "podMonitor.enabled=true")  # fmt: skip
    assert r.returncode == 0, r.stderr
    mons = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"].endswith("Monitor")]
    assert len(mons) == 2
    for m in mons:
        (ep,) = m["spec"].get("endpoints") or m["spec"]["podMetricsEndpoints"]
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
        } in ep["relabelings"]


def _alerts() -> list[dict[str, Any]]:
    return [x for g in yaml.safe_load(ALERTS.read_text())["groups"] for x in g["rules"]]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, spaces to '-', punctuation dropped."""
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", markdown, re.M):
        a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        out.add(a)
    return out


def test_every_alert_has_a_runbook_section() -> None:
    anchors = _anchors(RUNBOOKS.read_text())
    for a in _alerts():
        url = a["annotations"]["runbook_url"]
        assert url == f"docs/runbooks.md#{a['alert'].lower()}", a["alert"]
        assert url.split("#")[1] in anchors, f"docs/runbooks.md has no section {a['alert']}"
    # one section per alert, nothing else at that level
    sections = re.findall(r"^## (\S+)\s*$", RUNBOOKS.read_text(), re.M)
    assert sections == [a["alert"] for a in _alerts()]


def test_the_chart_sets_the_runbook_base() -> None:
    rule = _rendered_rule()
    urls = [x["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for x in g["rules"]]
    assert urls == [a["annotations"]["runbook_url"] for a in _alerts()]  # the default base
    base = "https://git.example.com/railhop/blob/main/docs/runbooks.md"
    rule = _rendered_rule(f"prometheusRule.runbookBaseUrl={base}")
    got = {x["alert"]: x["annotations"]["runbook_url"] for g in rule["spec"]["groups"]
           for x in g["rules"]}  # fmt: skip
    assert got == {a["alert"]: f"{base}#{a['alert'].lower()}" for a in _alerts()}
    r = _run("template", "rh", str(CHART), "--set", "prometheusRule.runbookBaseUrl=a#b")
    assert r.returncode != 0 and "schema" in r.stderr


_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info", "_created")
_METRIC = re.compile(r"\b(railhop_[a-z0-9_]+)")


def exported(name: str, source: str) -> bool:
    """Whether metrics.py exports ``name`` (an exposition name: counters end in _total,
    histograms in _bucket/_sum/_count, Info in _info; the control plane's names are built as
    f"railhop_control_{name}")."""
    for base in {name} | {name.removesuffix(s) for s in _SUFFIXES if name.endswith(s)}:
        if f'"{base}"' in source:
            return True
        if (
            base.startswith("railhop_control_")
            and f'("{base.removeprefix("railhop_control_")}"' in source
        ):
            return True
    return False


def _named_metrics() -> set[str]:
    exprs = [x["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for x in g["rules"]]
    dash = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [dash["templating"]["list"][1]["definition"]]
    return {m for e in exprs for m in _METRIC.findall(e)}


def test_every_metric_the_rules_and_dashboard_name_exists() -> None:
    source = METRICS_PY.read_text()
    names = _named_metrics()
    assert len(names) >= 12
    missing = sorted(n for n in names if not exported(n, source))
    assert not missing, f"not exported by agent/railhop/metrics.py: {missing}"


@pytest.mark.parametrize("name", ["railhop_nic_upp", "railhop_failover_total", "railhop_x_info"])
def test_the_metric_check_catches_a_wrong_name(name: str) -> None:
    assert not exported(name, METRICS_PY.read_text())


_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_TARGET_LABELS = {"instance", "node", "job", "pod", "namespace"}  # added by the scrape, not by us


def _labels_by_metric() -> dict[str, set[str]]:
    """Label names of every metric the agent's registry exposes (static collectors only)."""
    from prometheus_client import CollectorRegistry

    from railhop.metrics import AgentMetrics

    m = AgentMetrics(CollectorRegistry())
    out: dict[str, set[str]] = {}
    for c in vars(m).values():
        names = getattr(c, "_labelnames", None)
        if names is not None:
            out[c._name] = set(names)  # type: ignore[attr-defined]
    return out


def test_the_rules_group_by_labels_the_metrics_have() -> None:
    """An alert grouped by `device` on a metric labelled `nic` never fires with a NIC name:
    every label a rule groups by is on one of the metrics it reads (or comes from the scrape)."""
    labels = _labels_by_metric()
    assert "device" in labels["railhop_nic_up"]
    bad = []
    for g in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in g["rules"]:
            expr = rule["expr"]
            known = set().union(
                *(labels.get(n.removesuffix("_total"), set()) for n in _METRIC.findall(expr))
            )
            for clause in _BY.findall(expr):
                for lab in (x.strip() for x in clause.split(",")):
                    if lab and lab not in known | _TARGET_LABELS:
                        bad.append((rule["alert"], lab))
    assert not bad, f"rules group by labels their metrics do not have: {bad}"
