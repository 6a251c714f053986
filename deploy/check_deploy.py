#!/usr/bin/env python3
"""Checks the deploy files against trainwatchd itself:
- the dashboard is valid Grafana JSON with a datasource variable (not the
  ${DS_...} import placeholder) and a run variable, and every trainwatch_*
  metric that the dashboard or the rules query is one the exporter serves;
- the Kubernetes manifests hang together (the claim the Deployment mounts,
  the database on it, container ports = the listen flags = the Service's
  target ports, the ServiceMonitor's port and selector, one replica with the
  Recreate strategy, no gRPC probe on a TLS port);
- every trainwatchd flag in the Kubernetes manifests and the systemd unit is
  one the binary accepts (from its --help, when its path is given).

  check_deploy.py [PATH_TO_TRAINWATCHD]"""

import json
import os
import re
import subprocess
import sys

import yaml

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
exporter = open(os.path.join(root, "server/src/exporter.cc")).read()
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
# Layout as Grafana 10/11 reads it: known panel types, unique ids, panels
# inside the 24-column grid and not on top of one another.
if dash.get("schemaVersion", 0) < 36:
    errors.append("dashboard schemaVersion is older than Grafana 9/10/11's (36+)")
ids = [p["id"] for p in dash["panels"]]
if len(set(ids)) != len(ids):
    errors.append("dashboard panel ids are not unique")
cells = {}
for p in dash["panels"]:
    if p["type"] not in ("timeseries", "stat", "gauge", "table", "state-timeline", "bargauge",
                         "text", "row", "logs", "heatmap"):
        errors.append(f"panel {p['title']}: unknown type {p['type']}")
    g = p["gridPos"]
    if g["x"] < 0 or g["w"] <= 0 or g["h"] <= 0 or g["x"] + g["w"] > 24:
        errors.append(f"panel {p['title']} lies outside the 24-column grid")
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            if (x, y) in cells:
                errors.append(f"panel {p['title']} overlaps {cells[(x, y)]}")
                break
            cells[(x, y)] = p["title"]
        else:
            continue
        break
rules = open(os.path.join(root, "deploy/prometheus/trainwatch-rules.yml")).read()
used = set()
for text in exprs + [rules]:
    used |= set(re.findall(r"\b(trainwatch_[a-z_]+)", text))
for name in sorted(used - exported):
    errors.append(f"{name} is queried but trainwatchd does not export it")

# ---- Kubernetes
docs = [d for d in yaml.safe_load_all(open(os.path.join(root, "deploy/kubernetes/trainwatchd.yaml")))
        if d]
by_kind = {d["kind"]: d for d in docs}
for kind in ("PersistentVolumeClaim", "Deployment", "Service", "ServiceMonitor"):
    if kind not in by_kind:
        errors.append(f"kubernetes: no {kind}")
k8s_args = []
if not errors:
    dep, svc, mon = by_kind["Deployment"], by_kind["Service"], by_kind["ServiceMonitor"]
    pvc = by_kind["PersistentVolumeClaim"]["metadata"]["name"]
    spec = dep["spec"]
    if spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        errors.append("kubernetes: one database needs replicas: 1 and strategy Recreate")
    pod = spec["template"]
    if spec["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items():
        errors.append("kubernetes: the Deployment's selector does not match its pods")
    if svc["spec"]["selector"].items() - pod["metadata"]["labels"].items():
        errors.append("kubernetes: the Service's selector does not match the pods")
    (c,) = pod["spec"]["containers"]
    k8s_args = c["args"]
    flags = dict(a[2:].split("=", 1) for a in c["args"])
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    db_dir = os.path.dirname(flags.get("db", ""))
    claim = volumes.get(mounts.get(db_dir, ""), {}).get("persistentVolumeClaim", {})
    if claim.get("claimName") != pvc:
        errors.append(f"kubernetes: --db {flags.get('db')} is not on the claim {pvc}")
    for path in mounts:
        if any(path.startswith(other + "/") for other in mounts if other != path):
            errors.append(f"kubernetes: {path} is mounted inside another volume")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for flag, name in (("listen", "grpc"), ("metrics_listen", "metrics")):
        if flags.get(flag, ":").rsplit(":", 1)[1] != str(ports.get(name)):
            errors.append(f"kubernetes: --{flag} does not match container port {name}")
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for p in svc_ports.values():
        if p["targetPort"] not in ports:
            errors.append(f"kubernetes: Service targetPort {p['targetPort']} is no container port")
    if mon["spec"]["selector"]["matchLabels"].items() - svc["metadata"]["labels"].items():
        errors.append("kubernetes: the ServiceMonitor does not select the Service")
    for ep in mon["spec"]["endpoints"]:
        if ep["port"] not in svc_ports:
            errors.append(f"kubernetes: ServiceMonitor port {ep['port']} is not a Service port")
    tls = "tls_cert" in flags
    for probe in ("readinessProbe", "livenessProbe"):
        if tls and "grpc" in c.get(probe, {}):
            errors.append(f"kubernetes: {probe} is a gRPC probe, which cannot speak TLS")

# ---- trainwatchd flags in the deploy files
unit = open(os.path.join(root, "deploy/systemd/trainwatchd.service")).read()
exec_start = re.search(r"ExecStart=(.*?)\n(?!\s)", unit.replace("\\\n", " "), re.S).group(1)
unit_args = [a for a in exec_start.split() if a.startswith("--")]
# The unit reads its flags from /etc/trainwatch/trainwatchd.flags, which the
# Debian package installs from deploy/systemd/; every file under
# /etc/trainwatch that they name must be one the package ships (rules.json is
# printed by twctl at build time).
shipped = set(os.listdir(os.path.join(root, "deploy/systemd"))) | {"rules.json"}
for a in list(unit_args):
    if a.startswith("--flagfile="):
        path = a.split("=", 1)[1]
        if not path.startswith("/etc/trainwatch/") or os.path.basename(path) not in shipped:
            errors.append(f"systemd: --flagfile {path} is not a file the package ships")
            continue
        lines = open(os.path.join(root, "deploy/systemd", os.path.basename(path))).read()
        unit_args += [l.strip() for l in lines.splitlines() if l.strip().startswith("--")]
for a in unit_args:
    value = a.split("=", 1)[1] if "=" in a else ""
    if value.startswith("/etc/trainwatch/") and os.path.basename(value) not in shipped:
        errors.append(f"systemd: {a} names a file the package does not ship")
if len(unit_args) < 2:
    errors.append("systemd: ExecStart passes no flags")
checked = 0
if len(sys.argv) > 1:
    helptext = subprocess.run([sys.argv[1], "--helpfull"], capture_output=True, text=True)
    known = set(re.findall(r"^\s+--([a-z_]+) ", helptext.stdout + helptext.stderr, re.M))
    if "db" not in known:
        errors.append("cannot read trainwatchd's flags from its --help")
    for where, args in (("kubernetes", k8s_args), ("systemd", unit_args)):
        for a in args:
            name = a[2:].split("=", 1)[0]
            checked += 1
            if name not in known:
                errors.append(f"{where}: trainwatchd has no flag --{name}")

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"dashboard: {len(dash['panels'])} panels, {len(exprs)} queries; "
      f"{len(used)} trainwatch metrics used, all exported; kubernetes: "
      f"{len(docs)} objects consistent; {checked} trainwatchd flags checked")
