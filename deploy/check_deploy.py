#!/usr/bin/env python3
"""Checks the dashboard and the alert rules against what trainwatchd exports:
the dashboard is valid Grafana JSON with a datasource variable (not the
${DS_...} import placeholder) and a run variable, and every trainwatch_*
metric that the dashboard or the rules query is one the exporter serves."""

import json
import os
import re
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
exporter = open(os.path.join(root, "server/src/server.cc")).read()
exported = set(re.findall(r'"(trainwatch_[a-z_]+)"', exporter))
errors = []

dash_text = open(os.path.join(root, "dashboards/trainwatch.json")).read()
dash = json.loads(dash_text)
if "${DS_" in dash_text:
    errors.append("dashboard uses a ${DS_...} import placeholder")
names = {v["name"]: v for v in dash["templating"]["list"]}
if names.get("datasource", {}).get("type") != "datasource":
    errors.append("dashboard lacks a datasource variable")
if "run" not in names:
    errors.append("dashboard lacks a run variable")
exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
exprs += [a["expr"] for a in dash["annotations"]["list"]]
for p in dash["panels"]:
    if p["datasource"]["uid"] != "${datasource}":
        errors.append(f"panel {p['title']} does not use $datasource")
rules = open(os.path.join(root, "deploy/prometheus/trainwatch-rules.yml")).read()
used = set()
for text in exprs + [rules]:
    used |= set(re.findall(r"\b(trainwatch_[a-z_]+)", text))
for name in sorted(used - exported):
    errors.append(f"{name} is queried but trainwatchd does not export it")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"dashboard: {len(dash['panels'])} panels, {len(exprs)} queries; "
      f"{len(used)} trainwatch metrics used, all exported")
