"""The code shape of the product packages, measured: sizes, stage imports, test files named after
modules, and how many modules one request runs through (measured only: no longer a target).

    python -m bench.code_shape [--static-only] [--bootstrap HOST:PORT] [--profile kafka|tansu]
                               [--out bench/results/code_shape]

Static (no broker): every class over 250 lines and every function over 60 lines (``ast``:
``end_lineno - lineno + 1``, nested definitions counted on their own too) in streams, services,
schemas, infra, ledger and features; modules and lines per package; imports from one stream stage
(``streams/<stage>/``) of another stage, anywhere in a module (function-level imports too).

Dynamic (a real broker: ``--bootstrap``, default ``KAFKA_BOOTSTRAP``, else the shared
127.0.0.1:39092; topics under a fresh prefix): a profiler (``threading.setprofile`` and
``sys.setprofile``) is installed first, then the real pipeline starts in this process, each part
on its own thread as its command runs it: the featurizer (``FeaturizerService.run``), the ledger
worker (``LedgerWorker.run``) and serving (``ServingServer``: HTTP app and heads follower), with
default settings. One warm-up add, served, and one warm-up delete, receipted, run first, so
start-up paths (group joins, first-use caches, lazy imports) are not counted. Then, with the
profiler recording:
- add: ``UnlearnClient.add`` of one features sample, then POST ``/v1/heads/<head>/predict`` every
  20 ms until the served prediction's ``n_retained`` counts the add;
- delete: ``UnlearnClient.delete`` of that sample, then ``wait_receipt``;
- idle: once the delete is served too, a window as long as the longer of the two, no request.
A module counts when a Python function defined in it was called (or a generator or coroutine of
it resumed) on any thread while recording, and its name is under ``unlearn.``. The poll loops of
every thread run meanwhile, so a module that runs on a timer (checkpoints, resets) counts when
its timer fires inside the window: the call counts per module say which ones ran once.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("streams", "services", "runtime", "common", "schemas", "infra", "ledger", "features")
CLASS_LIMIT = 250
FUNCTION_LIMIT = 60


# ---------------------------------------------------------------------------------------- static
def oversized(root: Path = ROOT) -> list[dict[str, Any]]:
    """Every class over CLASS_LIMIT and function over FUNCTION_LIMIT lines in the product
    packages: path, qualified name, kind, lines, limit."""
    found: list[dict[str, Any]] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found += _oversized_in(ast.parse(path.read_text()), rel)
    return found


MODULE_LIMIT = 500
MIRROR_FOLDERS = (*PACKAGES, "bench", "research", "clients")


def long_modules(root: Path = ROOT) -> dict[str, int]:
    """Product modules over MODULE_LIMIT lines: path -> lines (one concept a newcomer reads in
    one sitting, issue 30)."""
    found: dict[str, int] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MODULE_LIMIT:
                found[path.relative_to(root).as_posix()] = lines
    return found


def unmirrored_tests(root: Path = ROOT) -> tuple[list[str], int]:
    """Test files ``test_<name>.py`` with no module ``<name>.py`` (or folder of modules ``<name>/``)
    in the product, bench, research or clients folders, and how many test files there are: tests
    mirror modules, so a test file's name says where the code it tests lives."""
    modules = {p.stem for f in MIRROR_FOLDERS for p in (root / f).rglob("*.py")}
    modules |= {p.parent.name for f in MIRROR_FOLDERS for p in (root / f).rglob("*.py")}  # a package, a script folder
    tests = sorted((root / "tests").rglob("test_*.py"))
    return [t.relative_to(root).as_posix() for t in tests if t.stem.removeprefix("test_") not in modules], len(tests)


def _oversized_in(tree: ast.AST, rel: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                limit = CLASS_LIMIT if kind == "class" else FUNCTION_LIMIT
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > limit:
                    out.append({"path": rel, "name": prefix + child.name, "kind": kind, "lines": lines,
                                "limit": limit, "line": child.lineno})
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def package_sizes(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Modules and lines per product package (subfolders included)."""
    sizes = {}
    for pkg in PACKAGES:
        files = sorted((root / pkg).rglob("*.py"))
        sizes[pkg] = {"modules": len(files), "lines": sum(len(f.read_text().splitlines()) for f in files)}
    return sizes


def stage_imports(root: Path = ROOT) -> list[dict[str, str]]:
    """Imports of one stream stage's modules by another stage (``streams/<stage>/``)."""
    stages = sorted(p.name for p in (root / "streams").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    found = []
    for stage in stages:
        for path in sorted((root / "streams" / stage).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for name in names:
                    parts = name.split(".")
                    if parts[:2] == ["unlearn", "streams"] and len(parts) > 2 and parts[2] in stages \
                            and parts[2] != stage:
                        found.append({"path": path.relative_to(root).as_posix(), "imports": name,
                                      "line": str(node.lineno)})
    return found


# --------------------------------------------------------------------------------------- dynamic
class ModuleTrace:
    """A profile function counting calls per ``unlearn.*`` module while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.calls: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if self.recording and event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("unlearn."):
                self.calls[name] += 1

    def window(self) -> Counter[str]:
        """Start a fresh recording; the returned counter fills until ``stop``."""
        self.calls = Counter()
        self.recording = True
        return self.calls

    def stop(self) -> None:
        self.recording = False


def by_folder(modules: Counter[str]) -> dict[str, dict[str, int]]:
    """{"streams/featurizer": {"router": calls, ...}, ...} from ``unlearn.*`` module names."""
    folders: dict[str, dict[str, int]] = {}
    for name, calls in sorted(modules.items()):
        parts = name.split(".")[1:]
        folder, leaf = "/".join(parts[:-1]) or parts[0], parts[-1]
        folders.setdefault(folder, {})[leaf] = calls
    return folders


def _predict(url: str, head: str, features: list[float]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/v1/heads/{head}/predict", data=json.dumps({"features": features}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:  # 404 until the head's first update is served
        return {"status": exc.code}


def _served(url: str, head: str, features: list[float], n: int, timeout: float) -> dict[str, Any]:
    """Predict every 20 ms until the served head retains ``n`` samples."""
    deadline = time.monotonic() + timeout
    while True:
        out = _predict(url, head, features)
        if out.get("n_retained") == n:
            return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"served head {head!r} did not reach n_retained={n} in {timeout:g}s: {out}")
        time.sleep(0.02)


def dynamic(bootstrap: str, profile: str, timeout: float = 180.0) -> dict[str, Any]:
    """Modules run by one add (SDK -> served prediction) and one delete (SDK -> receipt)."""
    trace = ModuleTrace()
    threading.setprofile(trace)
    sys.setprofile(trace)
    from unlearn.infra.settings import Settings
    from unlearn.runtime.topics import create_topics, delete_topics, prefixed_topics
    from unlearn.services.client.sdk import UnlearnClient
    from unlearn.services.serving.http import ServingServer
    from unlearn.streams.featurizer.service import FeaturizerService
    from unlearn.streams.ledger.worker import LedgerWorker

    with tempfile.TemporaryDirectory(prefix="code-shape-") as tmp:
        s = Settings.from_env(bootstrap=bootstrap, profile=profile, data_dir=tmp,
                              topic_prefix=f"shape.{uuid.uuid4().hex[:8]}.")
        create_topics(s)
        stop = threading.Event()
        featurizer = FeaturizerService(s)
        ledger = LedgerWorker(s)
        threads = [threading.Thread(target=featurizer.run, args=(stop,), name="featurizer", daemon=True),
                   threading.Thread(target=ledger.run, name="ledger", daemon=True)]
        for t in threads:
            t.start()
        server = ServingServer(s).start()
        client = UnlearnClient(s, "shape-app", listen_receipts=True)
        head, f = "shape", [0.5, -0.25, 1.0, 0.75]
        try:
            client.add(head, "u0", "warm-add", 1, features=f).wait_delivered(timeout)
            _served(server.url, head, f, 1, timeout)
            client.add(head, "u0", "warm-del", 2, features=f).wait_delivered(timeout)
            _served(server.url, head, f, 2, timeout)
            client.delete(head, "warm-del", "u0").wait_receipt(timeout)
            _served(server.url, head, f, 1, timeout)

            add_calls = trace.window()
            t0 = time.monotonic()
            client.add(head, "u1", "s1", 0, features=f)
            _served(server.url, head, f, 2, timeout)
            trace.stop()
            add_s = time.monotonic() - t0

            delete_calls = trace.window()
            t0 = time.monotonic()
            client.delete(head, "s1", "u1").wait_receipt(timeout)
            trace.stop()
            delete_s = time.monotonic() - t0

            _served(server.url, head, f, 1, timeout)  # the delete's head update too: then idle
            time.sleep(1.0)
            idle_calls = trace.window()
            time.sleep(max(add_s, delete_s))
            trace.stop()
        finally:
            trace.stop()
            threading.setprofile(None)  # type: ignore[arg-type]
            sys.setprofile(None)
            client.close()
            server.stop()
            stop.set()
            ledger.stop()
            for t in threads:
                t.join(60)
            delete_topics(s, prefixed_topics(s))

    def window(calls: Counter[str], seconds: float) -> dict[str, Any]:
        return {"modules": len(calls), "folders": len(by_folder(calls)), "seconds": round(seconds, 3),
                "also_idle": sorted(set(calls) & set(idle_calls)), "by_folder": by_folder(calls)}

    return {"broker": {"bootstrap": bootstrap, "profile": profile},
            "add_to_served_prediction": window(add_calls, add_s),
            "delete_to_receipt": window(delete_calls, delete_s),
            "idle": {"modules": len(idle_calls), "seconds": round(max(add_s, delete_s), 3),
                     "by_folder": by_folder(idle_calls)}}


# ---------------------------------------------------------------------------------------- report
def markdown(result: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The report as markdown (what bench/results/code_shape.md holds), with the baseline's numbers
    beside this run's when ``before`` (an earlier run's JSON) is given."""
    st = result["static"]
    lines = [f"# Code shape ({result['when']}, commit {result['commit']})", "",
             "`python -m bench.code_shape` (method: its docstring). Targets: no class over "
             f"{CLASS_LIMIT} lines, no function over {FUNCTION_LIMIT}, no module over {MODULE_LIMIT} "
             "(issues 21, 30), no stage importing another. The modules one add runs through are "
             "measured, not targeted (issue 30 retired that target).", ""]
    if before is not None:
        lines += _comparison(before, result)
    lines += [f"## Over the limits: {len(st['oversized'])}", ""]
    lines += [f"- `{o['path']}:{o['line']}` {o['kind']} `{o['name']}`: {o['lines']} lines (limit {o['limit']})"
              for o in st["oversized"]] or ["- none"]
    lines += ["", "## Packages", "", "| package | modules | lines |", "|---|---:|---:|"]
    lines += [f"| {p} | {v['modules']} | {v['lines']} |" for p, v in st["packages"].items()]
    total_m = sum(v["modules"] for v in st["packages"].values())
    total_l = sum(v["lines"] for v in st["packages"].values())
    lines += [f"| total | {total_m} | {total_l} |", "", f"## Stage-to-stage imports: {len(st['stage_imports'])}", ""]
    lines += [f"- `{i['path']}:{i['line']}` imports `{i['imports']}`" for i in st["stage_imports"]] or ["- none"]
    dyn = result.get("dynamic")
    if dyn:
        lines += ["", f"## Modules run (broker {dyn['broker']['profile']} at {dyn['broker']['bootstrap']})"]
        for key, title in (("add_to_served_prediction", "One add, SDK to served prediction"),
                           ("delete_to_receipt", "One delete, SDK to receipt")):
            d = dyn[key]
            lines += ["", f"### {title}: {d['modules']} modules in {d['folders']} folders ({d['seconds']} s)", "",
                      f"{len(d['also_idle'])} of them also run in an idle window as long (the threads' poll "
                      "loops and timers). Calls per module in parentheses.", ""]
            for folder, mods in d["by_folder"].items():
                lines.append(f"- {folder} ({len(mods)}): " + ", ".join(f"{m} ({c})" for m, c in mods.items()))
        idle = dyn["idle"]
        lines += ["", f"### Idle, no request ({idle['seconds']} s): {idle['modules']} modules", ""]
        for folder, mods in idle["by_folder"].items():
            lines.append(f"- {folder} ({len(mods)}): " + ", ".join(f"{m} ({c})" for m, c in mods.items()))
    return "\n".join(lines) + "\n"


def _summary(r: dict[str, Any]) -> list[str]:
    st, dyn = r["static"], r.get("dynamic") or {}
    pk = st["packages"].values()
    return [str(len(st["oversized"])), str(len(st["stage_imports"])), str(sum(v["modules"] for v in pk)),
            str(sum(v["lines"] for v in pk)),
            *(f"{dyn[k]['modules']} in {dyn[k]['folders']} folders" if k in dyn else "-"
              for k in ("add_to_served_prediction", "delete_to_receipt"))]


def _comparison(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    rows = ("classes/functions over the limits", "stage-to-stage imports", "modules", "lines",
            "modules run by one add", "modules run by one delete")
    lines = [f"| | baseline ({before['when']}, {before['commit']}) | this run |", "|---|---:|---:|"]
    lines += [f"| {name} | {b} | {a} |" for name, b, a in zip(rows, _summary(before), _summary(after), strict=True)]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--static-only", action="store_true", help="sizes and imports only (no broker)")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:39092"))
    ap.add_argument("--profile", default=os.environ.get("UNLEARN_PROFILE", "kafka"), choices=("kafka", "tansu"))
    ap.add_argument("--commit", help="what the tree is (default: git describe --always --dirty)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "code_shape",
                    help="writes OUT.md and OUT.json")
    args = ap.parse_args(argv)
    import subprocess

    commit = args.commit or subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                           capture_output=True, text=True).stdout.strip()
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                              "static": {"oversized": oversized(), "packages": package_sizes(),
                                         "stage_imports": stage_imports()}}
    if not args.static_only:
        result["dynamic"] = dynamic(args.bootstrap, args.profile)
    before = args.out.with_name(args.out.name + "_before.json")
    text = markdown(result, json.loads(before.read_text()) if before.exists() else None)
    print(text)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
