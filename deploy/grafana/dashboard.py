"""Writes deploy/grafana/dashboards/kvledger.json, the provisioned kvledger dashboard.

The panels are in deploy/grafana/panels.py; this lays them out (grid positions, thresholds, the
model and datasource variables) and writes the JSON. Edit the panels there, then run
`python deploy/grafana/dashboard.py` (`--check` exits 1 when the JSON is stale; CI runs it).
Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from panels import ROWS, Panel  # deploy/grafana/panels.py: the script's own directory

OUT = Path(__file__).resolve().parent / "dashboards" / "kvledger.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _thresholds(red_at: float | None) -> dict:
    steps: list[dict] = [{"color": "green", "value": None}]
    if red_at is not None:
        steps.append({"color": "red", "value": red_at})
    return {"mode": "absolute", "steps": steps}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    defaults: dict = {
        "unit": panel.unit,
        "min": 0,
        "thresholds": _thresholds(panel.red_at),
        **panel.extra,
    }
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
        }
        options: dict = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    targets = [
        {
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "refId": chr(ord("A") + i),
            "range": True,
        }
        for i, (expr, legend) in enumerate(panel.targets)
    ]
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def panels() -> list[dict]:
    out: list[dict] = []
    y, panel_id = 0, 1
    for row in ROWS:
        out.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            out.append(_panel(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    return out


def templating() -> dict:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "regex": "",
                "includeAll": False,
                "multi": False,
            },
            {
                "name": "model",
                "label": "Model",
                "type": "query",
                "datasource": DATASOURCE,
                "query": {
                    "query": "label_values(kvledger_num_requests_running, model)",
                    "refId": "PrometheusVariableQueryEditor-VariableQuery",
                },
                "definition": "label_values(kvledger_num_requests_running, model)",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "refresh": 2,
                "sort": 1,
                "hide": 0,
                "regex": "",
                "options": [],
            },
        ]
    }


def dashboard() -> dict:
    return {
        "uid": "kvledger",
        "title": "kvledger",
        "tags": ["kvledger"],
        "description": "Prefix cache, ledger and serving health of kvledger (docs/operations.md)",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "templating": templating(),
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
