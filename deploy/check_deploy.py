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
  one the binary accepts (from its --help, when its path is given);
- the replicated deployment (deploy/ha/): two or more Kubernetes replicas
  on a shared PostgreSQL --db, each naming itself with --replica, the
  Service selecting them, ready only where GET /serving answers (the
  owner); the systemd drop-in reading trainwatchd-ha.flags
  with the host as --replica; every flag one trainwatchd accepts;
- the `twctl follow` sidecar (issue 17): the Kubernetes Job parses, runs
  twctl follow SOURCE --run $(JOB) --server trainwatchd:PORT beside a trainer
  container, both mounting one emptyDir (the trainer read-write, the log
  under it), $(JOB) defined, the port one of trainwatchd's Service; the
  systemd template unit trainwatch-follow@.service runs twctl follow with
  the instance as --run and reads an EnvironmentFile that defines every
  variable ExecStart uses (the example env file). Every flag of both is one
  of twctl follow's: from `twctl follow --help` when a twctl path is given
  and knows the command, else the flags the command is specified with.

  check_deploy.py [PATH_TO_TRAINWATCHD [PATH_TO_TWCTL]]"""

import json
import os
import re
import subprocess
import sys

import yaml

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The exporter's names, and the store backends' own counters it prints.
exporter = "".join(open(os.path.join(root, f)).read() for f in (
    "server/exporter/exporter.cc", "server/store/sqlite_store.cc", "server/store/pg/pg_store.cc"))
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
# ---- the replicated deployment on PostgreSQL (deploy/ha/)
ha_docs = [d for d in yaml.safe_load_all(open(os.path.join(root, "deploy/ha/kubernetes.yaml")))
           if d]
ha_deploy = next((d for d in ha_docs if d["kind"] == "Deployment"), None)
ha_args = []
if ha_deploy is None:
    errors.append("ha kubernetes: no Deployment")
else:
    spec = ha_deploy["spec"]
    if spec.get("replicas", 1) < 2:
        errors.append("ha kubernetes: a standby needs replicas: 2 or more")
    ha_args = [a for a in spec["template"]["spec"]["containers"][0]["args"] if a.startswith("--")]
    ha_flags = dict(a[2:].split("=", 1) for a in ha_args)
    if not ha_flags.get("replica", "").startswith("$("):
        errors.append("ha kubernetes: each pod must name itself (--replica=$(POD_NAME))")
    if not ha_flags.get("db", "").startswith(("$(", "postgres")):
        errors.append("ha kubernetes: --db must be the shared PostgreSQL database")
    # Only the owner may be ready, or the Service sends agents to a standby.
    ready = spec["template"]["spec"]["containers"][0].get("readinessProbe", {})
    if ready.get("httpGet", {}).get("path") != "/serving":
        errors.append("ha kubernetes: the readiness probe must be GET /serving (the owner alone)")
    ha_svc = next((d for d in ha_docs if d["kind"] == "Service"), None)
    if ha_svc is None or ha_svc["spec"]["selector"] != spec["selector"]["matchLabels"]:
        errors.append("ha kubernetes: the Service does not select the replicas")
ha_flags_file = [l.strip() for l in open(os.path.join(root, "deploy/ha/trainwatchd-ha.flags"))
                 if l.strip().startswith("--")]
ha_unit = open(os.path.join(root, "deploy/ha/trainwatchd.service.d/ha.conf")).read()
ha_exec = re.findall(r"^ExecStart=(.+)$", ha_unit, re.M)
if not ha_exec or "--replica=" not in ha_exec[-1] or "trainwatchd-ha.flags" not in ha_exec[-1]:
    errors.append("ha systemd: ExecStart must read trainwatchd-ha.flags and name the replica")
ha_unit_args = ha_flags_file + [a for a in (ha_exec[-1].split() if ha_exec else [])
                                if a.startswith("--")]
if not any(a.startswith("--db=host=") or a.startswith("--db=postgres") for a in ha_flags_file):
    errors.append("ha systemd: --db must be the shared PostgreSQL database")

checked = 0
if len(sys.argv) > 1:
    helptext = subprocess.run([sys.argv[1], "--helpfull"], capture_output=True, text=True)
    known = set(re.findall(r"^\s+--([a-z_]+) ", helptext.stdout + helptext.stderr, re.M))
    if "db" not in known:
        errors.append("cannot read trainwatchd's flags from its --help")
    for where, args in (("kubernetes", k8s_args), ("systemd", unit_args),
                        ("ha kubernetes", ha_args), ("ha systemd", ha_unit_args)):
        for a in args:
            name = a[2:].split("=", 1)[0]
            checked += 1
            if name not in known:
                errors.append(f"{where}: trainwatchd has no flag --{name}")

# ---- twctl follow: the Kubernetes sidecar and the systemd template unit
# The flags of `twctl follow` as issue 17 specifies them (and twctl's own
# connection flags); `twctl follow --help` replaces them when it answers.
follow_flags = {"run", "server", "format", "map", "checkpoint-pattern", "token", "ca-file",
                "cert", "key"}
if len(sys.argv) > 2:
    h = subprocess.run([sys.argv[2], "follow", "--help"], capture_output=True, text=True)
    listed = set(re.findall(r"--([a-z][a-z-]*)", h.stdout + h.stderr))
    if h.returncode == 0 and "run" in listed:
        # twctl's connection flags are taken before or after the command but
        # are listed by `twctl --help` only (its usage line).
        g = subprocess.run([sys.argv[2], "--help"], capture_output=True, text=True)
        usage = (g.stdout + g.stderr).split("\n", 1)[0]
        follow_flags = listed | set(re.findall(r"--([a-z][a-z-]*)", usage))


def check_follow(where, args):
    """args: twctl's arguments; errors for an unknown flag or a missing part."""
    if not args or args[0] != "follow":
        errors.append(f"{where}: does not run twctl follow")
        return {}
    if len(args) < 2 or args[1].startswith("--"):
        errors.append(f"{where}: twctl follow has no SOURCE")
    given = {}
    i = 2
    while i < len(args):
        a = args[i]
        if a.startswith("$"):  # systemd's word-split extra flags
            i += 1
            continue
        if not a.startswith("--"):
            errors.append(f"{where}: {a} is no flag of twctl follow")
            i += 1
            continue
        name, _, value = a[2:].partition("=")
        if name not in follow_flags:
            errors.append(f"{where}: twctl follow has no flag --{name}")
        if not _ and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        given[name] = value
        i += 1
    for needed in ("run", "server"):
        if needed not in given:
            errors.append(f"{where}: twctl follow without --{needed}")
    return given


sidecar_docs = [d for d in yaml.safe_load_all(
    open(os.path.join(root, "deploy/kubernetes/follow-sidecar.yaml"))) if d]
(job,) = [d for d in sidecar_docs if d["kind"] == "Job"] or [None]
if job is None:
    errors.append("follow sidecar: no Job")
else:
    pod = job["spec"]["template"]["spec"]
    every = pod.get("initContainers", []) + pod.get("containers", [])
    followers = [c for c in every if c.get("command", [""])[0] == "twctl"]
    trainers = [c for c in pod.get("containers", []) if c not in followers]
    if len(followers) != 1 or not trainers:
        errors.append("follow sidecar: needs one twctl follow container beside a trainer")
    else:
        (f,) = followers
        given = check_follow("follow sidecar", f["args"])
        empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        mounts = {m["name"]: m for m in f.get("volumeMounts", [])}
        shared = [m for t in trainers for m in t.get("volumeMounts", [])
                  if m["name"] in empty and m["name"] in mounts and not m.get("readOnly")]
        if not shared:
            errors.append("follow sidecar: no emptyDir the trainer writes and twctl reads")
        elif not f["args"][1].startswith(mounts[shared[0]["name"]]["mountPath"] + "/"):
            errors.append(f"follow sidecar: {f['args'][1]} is not on the shared log volume")
        env = {e["name"] for e in f.get("env", [])}
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(f["args"])):
            if ref not in env:
                errors.append(f"follow sidecar: $({ref}) is not defined in its env")
        server = given.get("server", "")
        host, _, port = server.rpartition(":")
        svc = by_kind.get("Service", {})
        if host != svc.get("metadata", {}).get("name") or port not in {
                str(p["port"]) for p in svc.get("spec", {}).get("ports", [])}:
            errors.append(f"follow sidecar: --server {server} is not trainwatchd's Service")
        if f in pod.get("initContainers", []) and f.get("restartPolicy") != "Always":
            errors.append("follow sidecar: an init container that is no native sidecar "
                          "(restartPolicy: Always) would block the trainer")

follow_unit = open(os.path.join(root, "deploy/systemd/trainwatch-follow@.service")).read()
m = re.search(r"^ExecStart=(\S+) (.*)$", follow_unit, re.M)
env_file = re.search(r"^EnvironmentFile=(\S+)$", follow_unit, re.M)
if not m or not m.group(1).endswith("/twctl"):
    errors.append("systemd follow unit: ExecStart does not run twctl")
else:
    words = m.group(2).split()
    given = check_follow("systemd follow unit", words)
    if given.get("run") != "%i":
        errors.append("systemd follow unit: --run is not the instance (%i)")
    used_vars = set(re.findall(r"\$\{?([A-Z_]+)\}?", m.group(2)))
    example = open(os.path.join(root, "deploy/systemd/follow-example.env")).read()
    defined = set(re.findall(r"^([A-Z_]+)=", example, re.M))
    if not env_file or "%i" not in env_file.group(1):
        errors.append("systemd follow unit: no EnvironmentFile per instance")
    for v in sorted(used_vars - defined):
        errors.append(f"systemd follow unit: ${v} is not in follow-example.env")

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"dashboard: {len(dash['panels'])} panels, {len(exprs)} queries; "
      f"{len(used)} trainwatch metrics used, all exported; kubernetes: "
      f"{len(docs)} objects consistent; {checked} trainwatchd flags checked; twctl follow: "
      f"sidecar and systemd unit consistent")
