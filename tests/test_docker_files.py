#!/usr/bin/env python3
"""docker/ (images, compose stack, Prometheus, Grafana) against the code and scripts it deploys.

Usage (ctest): test_docker_files.py [SPILLWAY_BINARY [MODELS_DIR]]   (MODELS_DIR is ignored)
Exit: 0 pass, 1 fail, 77 skip (no PyYAML in any python3 found; Debian: python3-yaml).
Environment: SPILLWAY_METRICS_LIST=FILE: the metric names to check against (one name per line,
optionally followed by its type, or markdown table rows "| name | type | ..."). Default: the
README's metrics reference (table rows starting with "| `spillway:"); only while the README has
no such table, ../notes/metrics.md beside the repository. The summary says which was used.

No Docker engine is needed: nothing is built or started. Checks:
  * docker/compose.yaml: every service has an image or a build (whose context and Dockerfile
    exist); depends_on names services (service_healthy ones with a healthcheck); named volumes are
    declared, bind-mount sources exist; ports and healthchecks are well-formed; stop_grace_period
    covers drain.timeout.ms;
  * the workers: their `-c` config is a file of docker/ mounted there; its keys (and the SPILLWAY_*
    variables of the services) are keys of the binary (`spillway config --keys`) and the binary
    accepts the file (`spillway config -c`); the Kafka brokers, topics (created by the init
    service, prompts with 8 partitions, auto-creation off), Redis host and password (one value,
    from the environment, not in the file), the shared tmpfs arena (mounted by every worker, at
    least cache.arena.mb, one cache.host_id), the model mount and metrics.port agree with the
    compose file, the images' EXPOSE and Prometheus' targets;
  * Prometheus (docker/prometheus.yml, its rule files) and Grafana (provisioned datasource uid and
    timeInterval, dashboard provider path, every dashboard under docker/grafana/dashboards/):
    panels have targets with an expr and the provisioned datasource; every metric name in an
    expr is in the metrics list (histograms only as _bucket/_sum/_count); histogram_quantile
    groups by le; the panels the dashboard must have are there;
  * docker/Dockerfile and docker/Dockerfile.cuda: build and runtime stages on matching bases;
    the build stage's apt packages are a subset of scripts/install-deps.sh's PKGS and hold its
    every lib*-dev; the runtime stage has no build packages, runs as uid 10001, exposes the
    metrics port, has a HEALTHCHECK, ENTRYPOINT ["spillway"] and CMD worker -c <the config it
    installs>; the docker/ files they copy exist and their .dockerignore keeps them;
  * the runtime packages cover what the binary links: `ldd` + `dpkg -S`, each library's package
    must be a runtime package, a dependency of one, or in every Debian base (essential/required);
    done when dpkg is there and this host runs the runtime image's release;
  * docker/healthcheck.sh against a stub HTTP server on loopback: 200 -> 0, 503 -> 1, nothing
    listening -> 1, metrics.port 0 -> 0.
"""
import fnmatch
import glob
import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pycommon

yaml = pycommon.import_or_skip("yaml", "SKIP: python yaml module not available (Debian: python3-yaml)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCKER = os.path.join(ROOT, "docker")
IMAGE_UID = 10001
METRICS_PORT = 9464
CONFIG_PATH = "/etc/spillway/worker.conf"

failures = 0
checks = 0
skipped = []


def check(cond, msg):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: " + msg)
    return bool(cond)


def skip(msg):
    skipped.append(msg)
    print("SKIP: " + msg)


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_yaml(path):
    try:
        return yaml.safe_load(read(path))
    except (OSError, yaml.YAMLError) as e:
        check(False, "%s: %s" % (rel(path), e))
        return None


# ---------------------------------------------------------------------------------------------
# small parsers

def parse_conf(path):
    """worker.conf: {key: value} (later lines win) or None; bad lines are failures."""
    out = {}
    try:
        lines = read(path).split("\n")
    except OSError as e:
        check(False, "%s: %s" % (rel(path), e))
        return None
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if not check("=" in s and s.split("=", 1)[0].strip(),
                     "%s:%d: expected key = value: %r" % (rel(path), n, line)):
            continue
        k, v = s.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def env_name(key):
    return "SPILLWAY_" + key.upper().replace(".", "_")


INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?]([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value):
    """Compose's ${VAR:-default} with VAR unset (what a bare `docker compose up` sees)."""
    if not isinstance(value, str):
        return value
    value = value.replace("$$", "\0")
    value = INTERP.sub(lambda m: m.group(2) or "", value)
    return value.replace("\0", "$")


def as_env(env):
    """A service's environment (mapping or KEY=VALUE list) as {str: str} (interpolated)."""
    if env is None:
        return {}
    if isinstance(env, list):
        out = {}
        for item in env:
            k, _, v = str(item).partition("=")
            out[k] = interpolate(v)
        return out
    return {str(k): interpolate("" if v is None else str(v).lower() if isinstance(v, bool)
                                else str(v)) for k, v in env.items()}


def as_cmd(cmd):
    if cmd is None:
        return []
    if isinstance(cmd, str):
        return shlex.split(cmd)
    return [str(c) for c in cmd]


def duration_s(text):
    """Compose durations: 1m30s, 45s, 500ms, 2h."""
    m = re.fullmatch(r"((?:\d+(?:\.\d+)?(?:us|ms|s|m|h))+)", str(text).strip())
    if not m:
        return None
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text))


def size_mib(text):
    m = re.fullmatch(r"(\d+)([kmg]?)", str(text).strip().lower())
    if not m:
        return None
    return int(m.group(1)) * {"": 1 / 1048576, "k": 1 / 1024, "m": 1, "g": 1024}[m.group(2)]


def install_deps_pkgs():
    """PKGS=( ... ) of scripts/install-deps.sh (comments dropped)."""
    text = read(os.path.join(ROOT, "scripts", "install-deps.sh"))
    m = re.search(r"^PKGS=\((.*?)^\)", text, re.S | re.M)
    if not check(m, "scripts/install-deps.sh: no PKGS=( ... ) array"):
        return set()
    words = []
    for line in m.group(1).split("\n"):
        words += line.split("#", 1)[0].split()
    return set(words)


# ---------------------------------------------------------------------------------------------
# Dockerfiles

class Stage:
    def __init__(self, image, name):
        self.image, self.name = image, name
        self.instr = []        # (INSTRUCTION, args text)
        self.apt = []          # packages of apt-get install
        self.user = None


def parse_dockerfile(path):
    text = read(path)
    logical, cur = [], ""
    for line in text.split("\n"):
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue  # comment lines inside a continued instruction
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        logical.append(cur + s)
        cur = ""
    if cur:
        logical.append(cur)
    args, stages = {}, []
    for line in logical:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip().strip('"')
            continue
        if word == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(image, name))
            continue
        if not stages:
            continue
        st = stages[-1]
        st.instr.append((word, rest))
        if word == "USER":
            st.user = rest
        if word == "RUN":
            for m in re.finditer(r"apt-get\s+install\b(.*?)(?:&&|;|\||$)", rest):
                st.apt += [w for w in m.group(1).split()
                           if not w.startswith("-") and "$" not in w and "=" not in w]
    return stages


def json_args(rest):
    try:
        v = json.loads(rest)
        return v if isinstance(v, list) else None
    except ValueError:
        return None


def dockerignore_excludes(patterns, path):
    """Whether .dockerignore patterns (later ones win, ! re-includes) leave `path` out; a
    pattern matches a path or any of its parent folders."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.strip("/")
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(pre.split("/")[-1], pat[3:]) or fnmatch.fnmatch(pre, pat[3:])
                      for pre in prefixes)
        else:
            hit = any(fnmatch.fnmatch(pre, pat) for pre in prefixes)
        if hit:
            excluded = not neg
    return excluded


def check_dockerfile(path, kind, pkgs):
    """kind: 'cpu' or 'cuda'. Returns (runtime Stage, (distro, codename)), or (None, None)."""
    name = rel(path)
    if not check(os.path.isfile(path), name + " is missing"):
        return None, None
    stages = parse_dockerfile(path)
    if not check(len(stages) >= 2, name + ": expected a build stage and a runtime stage"):
        return None, None
    build, runtime = stages[0], stages[-1]
    text = read(path)
    if kind == "cpu":
        check(build.image == "debian:bookworm", "%s: build stage FROM %s, expected debian:bookworm"
              % (name, build.image))
        check(runtime.image == "debian:bookworm-slim",
              "%s: runtime stage FROM %s, expected debian:bookworm-slim" % (name, runtime.image))
        platform = ("debian", "bookworm")
    else:
        mb = re.fullmatch(r"nvidia/cuda:([\d.]+)-devel-(ubuntu[\d.]+)", build.image)
        mr = re.fullmatch(r"nvidia/cuda:([\d.]+)-runtime-(ubuntu[\d.]+)", runtime.image)
        check(mb, "%s: build stage FROM %s, expected nvidia/cuda:<ver>-devel-ubuntu<ver>"
              % (name, build.image))
        check(mr, "%s: runtime stage FROM %s, expected nvidia/cuda:<ver>-runtime-ubuntu<ver> "
              "(cuBLAS is in runtime, not base)" % (name, runtime.image))
        check(mb and mr and mb.groups() == mr.groups(),
              "%s: devel and runtime images differ in CUDA or Ubuntu version" % name)
        check("-DSPILLWAY_CUDA=ON" in text, name + ": cmake without -DSPILLWAY_CUDA=ON")
        codename = {"ubuntu24.04": "noble", "ubuntu22.04": "jammy"}.get(mr.group(2) if mr else "")
        platform = ("ubuntu", codename)

    # build packages: from install-deps.sh, and all of its lib*-dev
    bset = set(build.apt)
    check(bset, name + ": build stage installs no apt packages")
    extra = sorted(bset - pkgs)
    check(not extra, "%s: build packages not in scripts/install-deps.sh PKGS (CI would not build "
          "with them): %s" % (name, " ".join(extra)))
    needed = {p for p in pkgs if re.fullmatch(r"lib.*-dev", p)} | {"build-essential", "cmake",
                                                                  "pkg-config"}
    missing = sorted(needed - bset)
    check(not missing, "%s: build stage lacks packages of install-deps.sh PKGS: %s"
          % (name, " ".join(missing)))
    check(re.search(r"cmake\s+-S\s+\.\s+-B\s+\S+\s+-DCMAKE_BUILD_TYPE=Release", text),
          name + ": no cmake Release configure")

    # runtime stage
    rset = set(runtime.apt)
    check(rset, name + ": runtime stage installs no apt packages")
    dev = sorted(p for p in rset if p.endswith("-dev") or p in ("build-essential", "cmake",
                                                                  "pkg-config", "gcc", "clang"))
    check(not dev, "%s: runtime stage installs build packages: %s" % (name, " ".join(dev)))
    instr = {}
    for w, rest in runtime.instr:
        instr.setdefault(w, []).append(rest)
    user = (runtime.user or "").split(":")[0]
    uid_ok = user == str(IMAGE_UID) or (
        user and re.search(r"useradd\b[^&;]*--uid\s+%d\b[^&;]*\b%s\b"
                           % (IMAGE_UID, re.escape(user)), text))
    check(uid_ok, "%s: runtime stage does not run as uid %d (USER %s)" % (name, IMAGE_UID, user))
    check(re.search(r"useradd\b[^&;]*--uid\s+%d\b" % IMAGE_UID, text),
          "%s: no user with uid %d is created" % (name, IMAGE_UID))
    ep = json_args((instr.get("ENTRYPOINT") or [""])[-1])
    check(ep == ["spillway"], '%s: ENTRYPOINT is %r, expected ["spillway"]' % (name, ep))
    cmd = json_args((instr.get("CMD") or [""])[-1])
    check(cmd == ["worker", "-c", CONFIG_PATH], "%s: CMD is %r, expected [\"worker\", \"-c\", "
          "\"%s\"]" % (name, cmd, CONFIG_PATH))
    check(re.search(r"\S*docker/worker\.conf\s+/out%s\b" % re.escape(CONFIG_PATH), text),
          "%s: the image does not install docker/worker.conf at %s (CMD's config)"
          % (name, CONFIG_PATH))
    exposed = set()
    for e in instr.get("EXPOSE", []):
        exposed |= {int(p.split("/")[0]) for p in e.split() if p.split("/")[0].isdigit()}
    check(METRICS_PORT in exposed, "%s: EXPOSE %s lacks the metrics port %d"
          % (name, sorted(exposed), METRICS_PORT))
    hc = instr.get("HEALTHCHECK", [])
    check(hc and "NONE" not in hc[-1], name + ": runtime stage has no HEALTHCHECK")
    if hc and "spillway-healthcheck" in hc[-1]:
        check(re.search(r"docker/healthcheck\.sh\s+\S*/spillway-healthcheck", text),
              name + ": HEALTHCHECK runs spillway-healthcheck, which is not installed from "
              "docker/healthcheck.sh")
    check(any("--from=" in r for r in instr.get("COPY", [])),
          name + ": runtime stage copies nothing from the build stage")
    # docker/ files named in it exist, and the context filter keeps them
    body = re.sub(r"^#\s*syntax=.*$", "", text, flags=re.M)   # "docker/dockerfile:1" is no file
    refs = sorted(set(re.findall(r"(?<![\w/])docker/[\w./-]+", body)))
    for r in refs:
        r = r.rstrip(".")
        check(os.path.exists(os.path.join(ROOT, r)), "%s names %s, which does not exist"
              % (name, r))
    ignore = path + ".dockerignore"
    if os.path.exists(ignore):
        pats = [l.strip() for l in read(ignore).split("\n") if l.strip()
                and not l.strip().startswith("#")]
        for need in sorted({"CMakeLists.txt", "cli/main.c", "engine", "worker", "cache",
                            "docker/healthcheck.sh", "docker/worker.conf"} | set(refs)):
            check(not dockerignore_excludes(pats, need), "%s leaves %s out of the build context"
                  % (rel(ignore), need))
    return runtime, platform


# ---------------------------------------------------------------------------------------------
# runtime libraries: ldd + dpkg

def host_release():
    try:
        kv = dict(l.split("=", 1) for l in read("/etc/os-release").split("\n") if "=" in l)
    except OSError:
        return None, None
    return kv.get("ID", "").strip('"'), kv.get("VERSION_CODENAME", "").strip('"')


def dpkg_db():
    """{package: (essential_or_required, [[alternatives] of Depends + Pre-Depends])}."""
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${Essential}\t${Priority}\t${Depends}\t${Pre-Depends}\t"
                          "${db:Status-Abbrev}\n"],
                         capture_output=True, text=True).stdout
    db = {}
    for line in out.split("\n"):
        f = line.split("\t")
        if len(f) < 6 or not f[5].startswith("ii"):
            continue
        deps = []
        for d in (f[3] + "," + f[4]).split(","):
            alts = [re.sub(r"\(.*?\)|:any|:\w+$", "", a).strip() for a in d.split("|")]
            alts = [a.split(":")[0] for a in alts if a]
            if alts:
                deps.append(alts)
        db[f[0]] = (f[1] == "yes" or f[2] == "required", deps)
    return db


def lib_package(path):
    cands = [path]
    if path.startswith("/lib"):
        cands.append("/usr" + path)
    elif path.startswith("/usr/lib"):
        cands.append(path[4:])
    cands.append(os.path.realpath(path))
    for c in cands:
        r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if r.returncode == 0:
            for line in r.stdout.split("\n"):
                if line.endswith(": " + c) and "diversion" not in line:
                    return line.split(":")[0].split(",")[0].strip()
    return None


def check_runtime_libs(binary, dockerfile, runtime, platform):
    name = rel(dockerfile)
    if not binary:
        return skip("%s: runtime libraries: no spillway binary given" % name)
    if not shutil.which("ldd") or not shutil.which("dpkg") or not shutil.which("dpkg-query"):
        return skip("%s: runtime libraries: ldd / dpkg not available" % name)
    host = host_release()
    if host != platform:
        return skip("%s: runtime libraries: this host is %s %s, the image %s %s (package names "
                    "differ)" % (name, host[0], host[1], platform[0], platform[1]))
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if not check(r.returncode == 0, "ldd %s failed: %s" % (binary, r.stderr.strip())):
        return
    libs = []
    for line in r.stdout.split("\n"):
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if not m:
            continue
        # a sanitizer build (the ASan+UBSan or TSan stage of scripts/test.sh) links the
        # sanitizer runtimes, which the images' Release build does not
        if re.match(r"lib(asan|ubsan|tsan|lsan)\.so", os.path.basename(m.group(1))):
            continue
        if len(m.groups()) == 2:
            if m.group(2) == "not":
                check(False, "ldd %s: %s not found" % (binary, m.group(1)))
                continue
            libs.append((m.group(1), m.group(2)))
        else:
            libs.append((os.path.basename(m.group(1)), m.group(1)))
    db = dpkg_db()
    runtime_pkgs = set(runtime.apt)
    for p in sorted(runtime_pkgs):
        known = p in db or subprocess.run(["apt-cache", "show", "--no-all-versions", p],
                                          capture_output=True).returncode == 0
        check(known, "%s: runtime package %s is not a package of this %s host"
              % (name, p, platform[1]))
    covered, todo = set(), list(runtime_pkgs)
    while todo:
        p = todo.pop()
        if p in covered:
            continue
        covered.add(p)
        for alts in db.get(p, (False, []))[1]:
            todo += alts
    # what every Debian/Ubuntu base image has: essential and required packages, with their
    # dependencies
    base, todo = set(), [p for p, (req, _) in db.items() if req]
    while todo:
        p = todo.pop()
        if p not in base:
            base.add(p)
            todo += [a for alts in db.get(p, (False, []))[1] for a in alts[:1]]
    used = set()
    for soname, path in libs:
        pkg = lib_package(path)
        if not check(pkg, "%s: %s (%s) belongs to no installed package" % (name, soname, path)):
            continue
        used.add(pkg)
        check(pkg in covered or pkg in base, "%s: the binary links %s (package %s), which the "
              "runtime stage does not install (nor any of its packages' dependencies)"
              % (name, soname, pkg))
    def pulled(p):  # a metapackage (libopenblas0) whose implementation the binary links
        return any(a in used and a.startswith(p) for alts in db.get(p, (False, []))[1]
                   for a in alts)
    unused = sorted(p for p in runtime_pkgs if p.startswith("lib") and p not in used
                    and not pulled(p))
    print("runtime libraries (%s): %d linked, from %s%s" % (
        name, len(libs), " ".join(sorted(used)),
        "; installed but not linked by this binary: " + " ".join(unused) if unused else ""))


# ---------------------------------------------------------------------------------------------
# metric names

def metrics_list():
    """{name: type or None}, and where it came from."""
    def parse(text):
        out = {}
        for line in text.split("\n"):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            if s.startswith("|"):
                cells = [c.strip().strip("`").strip() for c in s.strip("|").split("|")]
                if not cells or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", cells[0]):
                    continue
                typ = cells[1].strip("`") if len(cells) > 1 else ""
            else:
                w = s.split()
                cells, typ = w, w[1] if len(w) > 1 else ""
                if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", cells[0]):
                    continue
            out[cells[0]] = typ if typ in ("counter", "gauge", "histogram", "summary") else None
        return out

    env = os.environ.get("SPILLWAY_METRICS_LIST")
    if env:
        return parse(read(env)), "SPILLWAY_METRICS_LIST=" + env
    readme = read(os.path.join(ROOT, "README.md"))
    rows = [l for l in readme.split("\n") if l.startswith("| `spillway:")]
    if rows:
        return parse("\n".join(rows)), "README.md metrics reference (%d rows)" % len(rows)
    notes = os.path.normpath(os.path.join(ROOT, "..", "notes", "metrics.md"))
    if os.path.exists(notes):
        rows = [l for l in read(notes).split("\n") if l.startswith("| spillway:")]
        return parse("\n".join(rows)), ("%s (README.md has no metrics table yet: rows "
                                        "starting with \"| `spillway:\")" % notes)
    return None, "none: README.md has no metrics table and %s does not exist" % notes


PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                   "group_right", "offset", "bool", "inf", "nan", "atan2"}


def promql_metrics(expr):
    """Metric names of a PromQL expression (Grafana variables allowed)."""
    s = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)                # Grafana variables
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', s)  # strings
    s = re.sub(r"\{[^}]*\}", "", s)                           # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)                          # ranges / subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = []
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_KEYWORDS:
            continue
        names.append(word)
    return names


def template_exprs(query):
    """PromQL inside a Grafana Prometheus variable query."""
    if isinstance(query, dict):
        query = query.get("query", "")
    query = str(query or "").strip()
    m = re.fullmatch(r"label_values\((.*),\s*\w+\s*\)", query, re.S)
    if m:
        return [m.group(1)]
    m = re.fullmatch(r"(?:query_result|label_values)\((.*)\)", query, re.S)
    if m:
        return [m.group(1)] if "(" in m.group(1) or re.fullmatch(r"[\w:]+.*", m.group(1)) else []
    if query.startswith(("label_names(", "metrics(")):
        return []
    return [query] if query else []


HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def check_metric_names(where, expr, known):
    """Every name in expr is a listed metric (histograms only through their series)."""
    used = set()
    for n in promql_metrics(expr):
        base = next((n[:-len(s)] for s in HIST_SUFFIXES if n.endswith(s)), None)
        if n in known:
            check(known[n] != "histogram", "%s: histogram %s used without _bucket/_sum/_count: %s"
                  % (where, n, expr))
            used.add(n)
        elif base and base in known and known[base] in ("histogram", "summary", None):
            check(not (n.endswith("_bucket") and known[base] == "summary"),
                  "%s: summary %s has no _bucket series" % (where, base))
            used.add(n)
        else:
            check(False, "%s: metric %s is not in the metrics list: %s" % (where, n, expr))
    if "histogram_quantile" in expr:
        check("_bucket" in expr and re.search(r"\bby\s*\([^)]*\ble\b", expr),
              "%s: histogram_quantile needs rate(..._bucket) summed by (le): %s" % (where, expr))
    return used


# ---------------------------------------------------------------------------------------------
# compose

PORT_RE = re.compile(r"^(?:(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]):)?"
                     r"(?:(\d+(?:-\d+)?):)?(\d+(?:-\d+)?)(?:/(?:tcp|udp|sctp))?$")


def port_ok(p):
    if isinstance(p, int):
        return 0 < p < 65536
    if isinstance(p, dict):
        t = p.get("target")
        return isinstance(t, int) and 0 < t < 65536 and (
            "published" not in p or re.fullmatch(r"\d+(-\d+)?", str(p["published"])))
    m = PORT_RE.match(str(p))
    if not m:
        return False
    nums = [int(x) for g in m.groups() if g for x in g.split("-")]
    return all(0 < n < 65536 for n in nums)


def parse_mount(v):
    """A service volume entry: (type, source, target, read_only)."""
    if isinstance(v, dict):
        return v.get("type", "volume"), v.get("source"), v.get("target"), bool(v.get("read_only"))
    parts = str(v).split(":")
    if len(parts) == 1:
        return "volume", None, parts[0], False
    src, tgt = parts[0], parts[1]
    ro = len(parts) > 2 and "ro" in parts[2].split(",")
    kind = "bind" if src.startswith((".", "/", "~", "$")) else "volume"
    return kind, src, tgt, ro


def check_compose(binary, known, dash_uid_holder):
    path = os.path.join(DOCKER, "compose.yaml")
    c = load_yaml(path)
    if not check(isinstance(c, dict) and isinstance(c.get("services"), dict) and c["services"],
                 "docker/compose.yaml: no services"):
        return
    services = c["services"]
    volumes = c.get("volumes") or {}
    hc_services = set()
    for name, s in services.items():
        where = "compose service %s" % name
        if not check(isinstance(s, dict), where + ": not a mapping"):
            continue
        check("image" in s or "build" in s, where + ": neither image nor build")
        b = s.get("build")
        if b is not None:
            ctx = b if isinstance(b, str) else b.get("context", ".")
            ctxp = os.path.normpath(os.path.join(DOCKER, ctx))
            check(os.path.isdir(ctxp), "%s: build context %s does not exist" % (where, ctx))
            df = "Dockerfile" if isinstance(b, str) else b.get("dockerfile", "Dockerfile")
            check(os.path.isfile(os.path.join(ctxp, df)), "%s: dockerfile %s not found in %s"
                  % (where, df, ctx))
        dep = s.get("depends_on") or {}
        items = dep.items() if isinstance(dep, dict) else [(d, {}) for d in dep]
        for d, opts in items:
            check(d in services, "%s: depends_on %s, no such service" % (where, d))
            cond = (opts or {}).get("condition", "service_started")
            check(cond in ("service_started", "service_healthy", "service_completed_successfully"),
                  "%s: depends_on %s: bad condition %s" % (where, d, cond))
            if cond == "service_healthy" and d in services:
                ds = services[d]
                # a spillway image has a HEALTHCHECK of its own (checked with the Dockerfile)
                check("healthcheck" in ds or "build" in ds, "%s: waits for %s to be healthy, "
                      "which has no healthcheck" % (where, d))
        for v in s.get("volumes") or []:
            kind, src, tgt, _ = parse_mount(v)
            check(tgt and tgt.startswith("/"), "%s: volume %r: bad target" % (where, v))
            if kind == "volume" and src:
                check(src in volumes, "%s: volume %s is not declared under volumes:" % (where, src))
            elif kind == "bind":
                srcp = os.path.normpath(os.path.join(DOCKER, os.path.expanduser(interpolate(src))))
                check(os.path.exists(srcp), "%s: bind source %s does not exist (%s)"
                      % (where, src, rel(srcp)))
        for p in s.get("ports") or []:
            check(port_ok(p), "%s: bad port %r" % (where, p))
        hc = s.get("healthcheck")
        if hc:
            hc_services.add(name)
            t = hc.get("test")
            check((isinstance(t, list) and t and t[0] in ("CMD", "CMD-SHELL", "NONE") and
                   (len(t) > 1 or t[0] == "NONE")) or (isinstance(t, str) and t),
                  "%s: healthcheck test %r is not [CMD|CMD-SHELL, ...]" % (where, t))
            for k in ("interval", "timeout", "start_period"):
                if k in hc:
                    check(duration_s(hc[k]) is not None, "%s: healthcheck %s %r is not a duration"
                          % (where, k, hc[k]))
        if "stop_grace_period" in s:
            check(duration_s(s["stop_grace_period"]) is not None,
                  "%s: stop_grace_period %r is not a duration" % (where, s["stop_grace_period"]))
    for v, spec in volumes.items():
        used = any(parse_mount(m)[1] == v for s in services.values() if isinstance(s, dict)
                   for m in s.get("volumes") or [])
        check(used, "compose volume %s is declared but not used" % v)

    # ---- the workers ----
    workers = {n: s for n, s in services.items() if isinstance(s, dict)
               and as_cmd(s.get("command"))[:1] == ["worker"]}
    check(len(workers) >= 2, "compose: expected two spillway workers, found %s" % sorted(workers))
    if not workers:
        return
    confs, conf_files, conf_files_checked = {}, set(), set()
    for n, s in workers.items():
        where = "compose service %s" % n
        b = s.get("build") or {}
        check(isinstance(b, dict) and b.get("dockerfile") == "docker/Dockerfile",
              where + ": not built from docker/Dockerfile")
        cmd = as_cmd(s.get("command"))
        cpath = cmd[cmd.index("-c") + 1] if "-c" in cmd and cmd.index("-c") + 1 < len(cmd) else None
        if not check(cpath, where + ": worker command without -c CONFIG"):
            continue
        src = None
        for v in s.get("volumes") or []:
            kind, vs, vt, _ = parse_mount(v)
            if vt == cpath and kind == "bind":
                src = os.path.normpath(os.path.join(DOCKER, vs))
        if not check(src and os.path.isfile(src) and os.path.dirname(src) == DOCKER,
                     "%s: -c %s is not a file of docker/ mounted there" % (where, cpath)):
            continue
        conf_files.add(src)
        conf = parse_conf(src)
        if conf is None:
            continue
        env = as_env(s.get("environment"))
        eff = dict(conf)
        for k in list(known or conf):
            if env_name(k) in env:
                eff[k] = env[env_name(k)]
        confs[n] = (conf, env, eff, src)
        # keys and variables the binary knows
        if known is not None:
            bad = sorted(k for k in conf if not k.startswith("kafka.") and k not in known)
            if src not in conf_files_checked:
                conf_files_checked.add(src)
                check(not bad, "%s: keys the binary does not know (a stale build, or renamed "
                      "keys?): %s" % (rel(src), " ".join(bad)))
            envs = {env_name(k) for k in known}
            badenv = sorted(k for k in env if k.startswith("SPILLWAY_") and k not in envs)
            check(not badenv, "%s: SPILLWAY_* variables that are no key (the worker ignores "
                  "them): %s" % (where, " ".join(badenv)))
            if not bad and binary:
                e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
                e.update(env)
                r = subprocess.run([binary, "config", "-c", src], env=e, capture_output=True,
                                   text=True, timeout=30)
                check(r.returncode == 0, "%s: `spillway config -c %s` with its environment "
                      "fails: %s" % (where, rel(src), r.stderr.strip()))
        check(not conf.get("cache.redis.password"), "%s sets cache.redis.password: a secret, "
              "give it as SPILLWAY_CACHE_REDIS_PASSWORD" % rel(src))
        # model
        mounts = [parse_mount(v) for v in s.get("volumes") or []]
        model = eff.get("model", "")
        mdir = [m for m in mounts if m[0] == "bind" and model.startswith(m[2].rstrip("/") + "/")]
        check(mdir and mdir[0][3], "%s: model %s is not under a read-only bind mount"
              % (where, model))
        # stop grace >= drain
        drain = int(eff.get("drain.timeout.ms", "30000")) / 1000.0
        grace = duration_s(s.get("stop_grace_period", "10s")) or 0
        check(grace > drain, "%s: stop_grace_period %ss <= drain.timeout.ms %ss: SIGKILL "
              "mid-drain" % (where, grace, drain))
    check(len(conf_files) == 1, "compose: the workers mount different configs: %s"
          % sorted(rel(f) for f in conf_files))
    if not confs:
        return

    # ---- Kafka ----
    any_eff = next(iter(confs.values()))[2]
    brokers = any_eff.get("brokers", "localhost:9092")
    kafka_host, kafka_port = None, None
    for b in brokers.split(","):
        h, _, p = b.strip().rpartition(":")
        kafka_host, kafka_port = h, p
        check(h in services, "brokers %s: %s is not a compose service" % (brokers, h))
        if h in services:
            kenv = as_env(services[h].get("environment"))
            adv = kenv.get("KAFKA_ADVERTISED_LISTENERS", "")
            check(re.search(r"//%s:%s\b" % (re.escape(h), p), adv),
                  "brokers %s: %s:%s is not an advertised listener of %s (%s)" % (b, h, p, h, adv))
            check(kenv.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE") == "false",
                  "service %s: KAFKA_AUTO_CREATE_TOPICS_ENABLE is not false" % h)
            check(kenv.get("KAFKA_PROCESS_ROLES", "").replace(" ", "") in
                  ("broker,controller", "controller,broker"),
                  "service %s: not a combined KRaft broker+controller" % h)
            img = str(services[h].get("image", ""))
            check(re.fullmatch(r"apache/kafka:4\.\d+\.\d+", img),
                  "service %s: image %s is not apache/kafka:4.x" % (h, img))
    def script(s):
        return " ".join(as_cmd(s.get("entrypoint")) + as_cmd(s.get("command")))
    inits = {n: s for n, s in services.items() if isinstance(s, dict)
             and "kafka-topics.sh" in script(s)}
    check(len(inits) == 1, "compose: expected one service running kafka-topics.sh, found %s"
          % sorted(inits))
    created = {}
    for n, s in inits.items():
        for line in script(s).split("\n"):
            m = re.search(r"--create\b.*--topic\s+(\S+)", line)
            if m:
                p = re.search(r"--partitions\s+(\d+)", line)
                created[m.group(1)] = int(p.group(1)) if p else None
                check("--if-not-exists" in line, "%s: creates %s without --if-not-exists (a "
                      "second `up` fails)" % (n, m.group(1)))
        for w in workers:
            dep = workers[w].get("depends_on") or {}
            cond = dep.get(n, {}).get("condition") if isinstance(dep, dict) else None
            check(cond == "service_completed_successfully", "worker %s does not wait for %s to "
                  "complete" % (w, n))
        dep = s.get("depends_on") or {}
        check(isinstance(dep, dict) and (dep.get(kafka_host) or {}).get("condition") ==
              "service_healthy", "%s does not wait for %s to be healthy" % (n, kafka_host))
    topics = [t.strip() for t in any_eff.get("input.topics", "prompts").split(",")]
    topics += [any_eff.get("output.topic", "results"), any_eff.get("dlq.topic", "prompts.dlq")]
    for t in topics:
        check(t in created, "topic %s (worker config) is not created by the init service" % t)
    check(created.get("prompts") == 8, "topic prompts: %s partitions, expected 8"
          % created.get("prompts"))

    # ---- Redis ----
    rhost = any_eff.get("cache.redis.host", "")
    pw_values = set()
    if check(rhost in services, "cache.redis.host %r is not a compose service" % rhost):
        rs = services[rhost]
        rcmd = as_cmd(rs.get("command"))
        pw = interpolate(rcmd[rcmd.index("--requirepass") + 1]) if "--requirepass" in rcmd else None
        check(pw, "service %s: redis-server without --requirepass" % rhost)
        check("healthcheck" in rs, "service %s has no healthcheck" % rhost)
        rport = rcmd[rcmd.index("--port") + 1] if "--port" in rcmd else "6379"
        check(any_eff.get("cache.redis.port", "6379") == rport, "cache.redis.port %s, Redis "
              "listens on %s" % (any_eff.get("cache.redis.port"), rport))
        for w, (conf, env, eff, _) in confs.items():
            v = env.get("SPILLWAY_CACHE_REDIS_PASSWORD")
            pw_values.add(v)
            check(v and v == pw, "worker %s: SPILLWAY_CACHE_REDIS_PASSWORD is not Redis' "
                  "--requirepass value" % w)
            dep = workers[w].get("depends_on") or {}
            check(isinstance(dep, dict) and (dep.get(rhost) or {}).get("condition") ==
                  "service_healthy", "worker %s does not wait for %s to be healthy" % (w, rhost))
        raw = read(path)
        check(not (pw and re.search(r"^(?!\s*#).*%s" % re.escape(pw), raw, re.M)
                   and "${" not in raw), "compose.yaml: the Redis password is not taken from "
              "the environment")

    # ---- the shared arena ----
    arena_vols = set()
    for w, (conf, env, eff, _) in confs.items():
        apath = eff.get("cache.arena.path", "/dev/shm/spillway.arena")
        mounts = [parse_mount(v) for v in workers[w].get("volumes") or []]
        m = [x for x in mounts if x[0] == "volume" and apath.startswith(x[2].rstrip("/") + "/")]
        if not check(m, "worker %s: cache.arena.path %s is not on a named volume" % (w, apath)):
            continue
        vol = m[0][1]
        if vol in arena_vols:
            continue
        arena_vols.add(vol)
        spec = volumes.get(vol) or {}
        opts = spec.get("driver_opts") or {}
        check(opts.get("type") == "tmpfs", "volume %s (the arena) is not a tmpfs" % vol)
        o = dict(x.split("=", 1) if "=" in x else (x, "")
                 for x in str(opts.get("o", "")).split(","))
        size = size_mib(o.get("size", ""))
        mb = int(eff.get("cache.arena.mb", "1024"))
        check(size is not None and size >= mb, "volume %s: tmpfs size %s < cache.arena.mb %d MiB "
              "(writes past a full tmpfs are a SIGBUS)" % (vol, o.get("size"), mb))
        check(o.get("uid") in (None, str(IMAGE_UID)), "volume %s: uid=%s, the image runs as %d"
              % (vol, o.get("uid"), IMAGE_UID))
        check(eff.get("cache.host_id"), "worker %s shares the arena but cache.host_id is empty "
              "(= the container's hostname: one index per worker over one arena)" % w)
    check(len(arena_vols) == 1, "workers do not share one arena volume: %s" % sorted(arena_vols))
    hosts = {eff.get("cache.host_id") for (_, _, eff, _) in confs.values()}
    check(len(hosts) == 1, "workers sharing an arena have different cache.host_id: %s" % hosts)

    # ---- metrics: port, Prometheus targets ----
    ports = {w: eff.get("metrics.port", "0") for w, (_, _, eff, _) in confs.items()}
    for w, p in ports.items():
        check(p == str(METRICS_PORT), "worker %s: metrics.port %s, expected %d (the images' "
              "EXPOSE, Prometheus' targets)" % (w, p, METRICS_PORT))
    proms = {n: s for n, s in services.items() if isinstance(s, dict)
             and str(s.get("image", "")).startswith("prom/prometheus")}
    check(len(proms) == 1, "compose: expected one prom/prometheus service")
    for n, s in proms.items():
        args = as_cmd(s.get("command"))
        cfile = next((a.split("=", 1)[1] for a in args if a.startswith("--config.file=")),
                     "/etc/prometheus/prometheus.yml")
        mounts = {parse_mount(v)[2]: parse_mount(v) for v in s.get("volumes") or []}
        m = mounts.get(cfile)
        if not check(m and m[0] == "bind", "service %s: %s is not mounted from docker/"
                     % (n, cfile)):
            continue
        ppath = os.path.normpath(os.path.join(DOCKER, m[1]))
        pc = load_yaml(ppath)
        if not check(isinstance(pc, dict), rel(ppath) + ": not a mapping"):
            continue
        targets = set()
        for sc in pc.get("scrape_configs") or []:
            for st in sc.get("static_configs") or []:
                targets |= set(st.get("targets") or [])
            check(sc.get("metrics_path", "/metrics") == "/metrics",
                  "%s: job %s scrapes %s" % (rel(ppath), sc.get("job_name"),
                                             sc.get("metrics_path")))
        for w, p in ports.items():
            names = {w, workers[w].get("hostname", w)}
            check(any("%s:%s" % (h, p) in targets for h in names),
                  "%s does not scrape worker %s on %s" % (rel(ppath), w, p))
        for t in targets:
            check(t.rpartition(":")[0] in workers or t.rpartition(":")[0] in
                  {s.get("hostname") for s in workers.values()},
                  "%s: target %s is not a worker" % (rel(ppath), t))
        for rf in pc.get("rule_files") or []:
            target = os.path.normpath(os.path.join(os.path.dirname(cfile), rf))
            rm = mounts.get(target)
            if not check(rm and rm[0] == "bind", "%s: rule file %s is not mounted at %s"
                         % (rel(ppath), rf, target)):
                continue
            rpath = os.path.normpath(os.path.join(DOCKER, rm[1]))
            rules = load_yaml(rpath)
            for g in (rules or {}).get("groups") or []:
                for r in g.get("rules") or []:
                    where = "%s: %s" % (rel(rpath), r.get("alert") or r.get("record"))
                    if check(r.get("expr"), where + ": no expr") and METRICS is not None:
                        check_metric_names(where, str(r["expr"]), METRICS)
                    check(not r.get("record"), where + ": recording rules would add series "
                          "that are not in the metrics list")
        dash_uid_holder["scrape_interval"] = (pc.get("global") or {}).get("scrape_interval")
        dash_uid_holder["prometheus"] = n

    # ---- Grafana ----
    grafs = {n: s for n, s in services.items() if isinstance(s, dict)
             and str(s.get("image", "")).startswith("grafana/grafana")}
    check(len(grafs) == 1, "compose: expected one grafana/grafana service")
    for n, s in grafs.items():
        mounts = [parse_mount(v) for v in s.get("volumes") or []]
        prov = [m for m in mounts if m[2] == "/etc/grafana/provisioning" and m[0] == "bind"]
        if not check(prov, "service %s: no bind mount at /etc/grafana/provisioning" % n):
            continue
        pdir = os.path.normpath(os.path.join(DOCKER, prov[0][1]))
        uids = {}
        for f in sorted(glob.glob(os.path.join(pdir, "datasources", "*.y*ml"))):
            d = load_yaml(f) or {}
            for ds in d.get("datasources") or []:
                check(ds.get("uid"), "%s: datasource %s without uid" % (rel(f), ds.get("name")))
                uids[ds.get("uid")] = ds
        prom_ds = [ds for ds in uids.values() if ds.get("type") == "prometheus"]
        if check(len(prom_ds) == 1, "%s/datasources: expected one prometheus datasource"
                 % rel(pdir)):
            ds = prom_ds[0]
            dash_uid_holder["uid"] = ds["uid"]
            host = re.sub(r"^https?://", "", str(ds.get("url", ""))).split(":")[0].split("/")[0]
            check(host == dash_uid_holder.get("prometheus"), "datasource url %s is not the "
                  "prometheus service" % ds.get("url"))
            ti = (ds.get("jsonData") or {}).get("timeInterval")
            si = dash_uid_holder.get("scrape_interval")
            check(not si or ti == si, "datasource timeInterval %s != Prometheus scrape_interval "
                  "%s ($__rate_interval assumes they match)" % (ti, si))
        dpaths = set()
        for f in sorted(glob.glob(os.path.join(pdir, "dashboards", "*.y*ml"))):
            d = load_yaml(f) or {}
            for p in d.get("providers") or []:
                dp = (p.get("options") or {}).get("path")
                m = [x for x in mounts if x[2] == dp and x[0] == "bind"]
                if check(m, "%s: provider path %s is not a bind mount of service %s"
                         % (rel(f), dp, n)):
                    dpaths.add(os.path.normpath(os.path.join(DOCKER, m[0][1])))
        check(dpaths, "%s/dashboards: no dashboard provider" % rel(pdir))
        dash_uid_holder["dashboards"] = sorted(dpaths)
        home = as_env(s.get("environment")).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
        if home:
            m = [x for x in mounts if x[0] == "bind" and home.startswith(x[2].rstrip("/") + "/")]
            check(m and os.path.isfile(os.path.join(DOCKER, m[0][1], home[len(m[0][2]):]
                                                    .lstrip("/"))),
                  "grafana home dashboard %s is not a mounted file" % home)


# ---------------------------------------------------------------------------------------------
# dashboards

REQUIRED = {
    "throughput": ["spillway:request_success_total", "spillway:generation_tokens_total"],
    "consumer lag": ["spillway:consumer_lag"],
    "running/waiting": ["spillway:num_requests_running", "spillway:num_requests_waiting"],
    "KV usage": ["spillway:kv_cache_usage_perc"],
    "prefix cache hit rate": ["spillway:prefix_cache_hits_total",
                              "spillway:prefix_cache_queries_total"],
    "TTFT": ["spillway:time_to_first_token_seconds_bucket"],
    "ITL": ["spillway:inter_token_latency_seconds_bucket"],
    "e2e latency": ["spillway:e2e_request_latency_seconds_bucket"],
    "DLQ": ["spillway:dlq_records_total"],
    "commit latency": ["spillway:commit_latency_seconds_bucket"],
    "transaction aborts": ["spillway:transaction_aborts_total"],
    "redis_up": ["spillway:redis_up"],
}


def check_dashboard(path, uid):
    name = rel(path)
    try:
        d = json.loads(read(path))
    except (OSError, ValueError) as e:
        check(False, "%s: %s" % (name, e))
        return set()
    check(d.get("uid") and d.get("title"), name + ": dashboard without uid or title")
    panels = list(d.get("panels") or [])
    for p in list(panels):
        panels += p.get("panels") or []          # panels of collapsed rows
    check(panels, name + ": no panels")
    ids = [p.get("id") for p in panels]
    check(len(ids) == len(set(ids)) and None not in ids, name + ": panel ids missing or repeated")
    used = set()

    def ds_ok(ds, where):
        if uid is None:
            return
        check(isinstance(ds, dict) and ds.get("uid") == uid and ds.get("type") == "prometheus",
              "%s: datasource %r, expected the provisioned {type: prometheus, uid: %s}"
              % (where, ds, uid))

    n_targets = 0
    for p in panels:
        where = "%s: panel %r" % (name, p.get("title"))
        g = p.get("gridPos") or {}
        check(all(isinstance(g.get(k), int) for k in "hwxy") and g["x"] + g["w"] <= 24,
              where + ": bad gridPos %r" % g)
        if p.get("type") in ("row", "text"):
            continue
        ds_ok(p.get("datasource"), where)
        targets = p.get("targets") or []
        if not check(targets, where + ": no targets"):
            continue
        refs = [t.get("refId") for t in targets]
        check(len(refs) == len(set(refs)), where + ": refIds repeated")
        for t in targets:
            n_targets += 1
            if "datasource" in t:
                ds_ok(t["datasource"], where + " target " + str(t.get("refId")))
            e = t.get("expr")
            if check(isinstance(e, str) and e.strip(), where + ": target without expr"):
                if METRICS is not None:
                    used |= check_metric_names(where, e, METRICS)
    for v in (d.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            ds_ok(v.get("datasource"), "%s: variable %s" % (name, v.get("name")))
            for e in template_exprs(v.get("query") or v.get("definition")):
                if METRICS is not None:
                    used |= check_metric_names("%s: variable %s" % (name, v.get("name")), e,
                                               METRICS)
    print("%s: %d panels, %d queries, %d metric series" % (name, len(panels), n_targets,
                                                              len(used)))
    return used


# ---------------------------------------------------------------------------------------------
# healthcheck.sh

def check_healthcheck_script():
    script = os.path.join(DOCKER, "healthcheck.sh")
    if not check(os.path.isfile(script), "docker/healthcheck.sh is missing"):
        return
    check(os.access(script, os.X_OK), "docker/healthcheck.sh is not executable")
    bash = shutil.which("bash")
    if not bash:
        return skip("docker/healthcheck.sh: no bash here")
    state = {"code": 200}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = state["code"] if self.path == "/healthz" else 404
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok\n" if code == 200 else b"no\n")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed_port = s.getsockname()[1]
    s.close()
    env = {"PATH": "/usr/bin:/bin", "SPILLWAY_HEALTHCHECK_CONF": "/nonexistent"}

    def run(args, extra=None):
        e = dict(env)
        e.update(extra or {})
        try:
            r = subprocess.run([bash, script] + args, env=e, capture_output=True, text=True,
                               timeout=20)
            return r.returncode, (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            return None, "timed out"
    try:
        rc, out = run([str(port)])
        check(rc == 0, "healthcheck.sh vs /healthz 200: rc %s (%s)" % (rc, out))
        state["code"] = 503
        rc, out = run([str(port)])
        check(rc == 1, "healthcheck.sh vs /healthz 503: rc %s (%s)" % (rc, out))
        state["code"] = 200
        rc, out = run([], {"SPILLWAY_METRICS_PORT": str(port)})
        check(rc == 0, "healthcheck.sh, port from SPILLWAY_METRICS_PORT: rc %s (%s)" % (rc, out))
        rc, out = run([str(closed_port)])
        check(rc == 1, "healthcheck.sh, nothing listening: rc %s (%s)" % (rc, out))
        rc, out = run([], {"SPILLWAY_METRICS_PORT": "0"})
        check(rc == 0, "healthcheck.sh, metrics.port 0: rc %s (%s)" % (rc, out))
    finally:
        srv.shutdown()
        srv.server_close()


# ---------------------------------------------------------------------------------------------

METRICS = None


def main():
    global METRICS
    binary = sys.argv[1] if len(sys.argv) > 1 else None
    if binary and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        check(False, "spillway binary %s is not an executable file" % binary)
        binary = None

    METRICS, source = metrics_list()
    print("metrics list: " + source)
    check(METRICS, "no metrics list: %s" % source)
    if not METRICS:
        METRICS = None

    known = None
    if binary:
        r = subprocess.run([binary, "config", "--keys"], capture_output=True, text=True, timeout=30)
        if check(r.returncode == 0, "`spillway config --keys` failed: " + r.stderr.strip()):
            known = {l.split()[0] for l in r.stdout.split("\n") if l.strip()}
    else:
        skip("config keys: no spillway binary given")

    pkgs = install_deps_pkgs()
    images = {}
    for f, kind in (("Dockerfile", "cpu"), ("Dockerfile.cuda", "cuda")):
        path = os.path.join(DOCKER, f)
        images[f] = (path,) + check_dockerfile(path, kind, pkgs)

    info = {}
    check_compose(binary, known, info)

    used = set()
    dash_dirs = info.get("dashboards") or [os.path.join(DOCKER, "grafana", "dashboards")]
    dashboards = sorted(f for d in dash_dirs for f in glob.glob(os.path.join(d, "*.json")))
    check(dashboards, "no dashboard JSON under %s" % " ".join(rel(d) for d in dash_dirs))
    for f in dashboards:
        used |= check_dashboard(f, info.get("uid"))
    if METRICS is not None:
        for what, names in REQUIRED.items():
            check(all(n in used for n in names), "dashboards: no panel for %s (%s)"
                  % (what, " ".join(n for n in names if n not in used)))

    for f in ("Dockerfile", "Dockerfile.cuda"):
        path, runtime, platform = images[f]
        if runtime and platform:
            check_runtime_libs(binary, path, runtime, platform)

    check_healthcheck_script()


if __name__ == "__main__":
    main()
    print("%d checks, %d failed%s" % (checks, failures,
                                      ", %d parts skipped" % len(skipped) if skipped else ""))
    sys.exit(1 if failures else 0)
