"""Real projects' setup and test suites on the host and in warren, side by side.

    python bench/real_projects.py [--only NAME ...] [--rounds N] [--workdir DIR] [--smoke]

Each project comes from PyPI or npm only (an sdist, or a package.json naming npm
packages; nothing from GitHub), is unpacked once, then copied into a fresh directory per
side and run there: setup (installing what it needs, with the caches and network of a
preset) then its tests. The host side runs plain ``sh -c``; the warren side the same
script through ``warren run --preset python --preset node --network allow``, with the
same environment. Per project it compares

  - the outcome of every test (passed/failed/skipped by name): identical or not;
  - the files left in the project (relative paths): what either side has that the other
    lacks (``IGNORED`` names those known to differ run to run on one machine too);
  - setup and test times, warren's over the host's (median of the rounds).

A first host round warms the caches and is not counted; then host and warren alternate.
The projects:

  attrs       a uv project (its sdist's uv.lock): uv sync of its tests group, pytest
  django      pip install -e of Django's sdist, then a small app of its own: manage.py test
  typescript  npm install of typescript, vitest and @types/node (a large node_modules),
              tsc --noEmit, vitest run
  vite        npm install of vite, vite build (its output files are the "tests")

``--smoke`` runs a small offline project through the same harness (the CI checks the
harness with it: tests/test_real_projects.py). Not part of CI otherwise: it needs the
network and takes minutes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The `warren` a user runs (the native front end, where it was built), beside this Python.
_FRONT = Path(sys.executable).parent / "warren"
WARREN = [str(_FRONT)] if _FRONT.exists() else [sys.executable, "-m", "warren"]
PRESETS = ["--preset", "python", "--preset", "node", "--network", "allow"]
# Where the machine's certificate authorities are (a TLS-intercepting network needs them):
# given to both sides.
TLS = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
)
# Names that differ between two runs on the host as well: not warren's doing.
IGNORED = (".hypothesis/",)


@dataclass
class Project:
    name: str
    fetch: Callable[[Path], None] | None  # fills the directory with the source, once
    setup: str
    test: str
    outcomes: Callable[[str, Path], dict[str, str]]  # from the test step's output (and tree)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # written over the source each run


# --- sources -----------------------------------------------------------------------------


def pypi_sdist(name: str, version: str) -> Callable[[Path], None]:
    def fetch(dest: Path) -> None:
        index = f"https://pypi.org/pypi/{name}/json"
        with urllib.request.urlopen(index, timeout=60) as r:
            meta = json.load(r)
        url = next(u["url"] for u in meta["releases"][version] if u["packagetype"] == "sdist")
        url = urllib.parse.urljoin(index, url)  # a mirror may answer with relative ones
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            top = tar.getnames()[0].split("/")[0]
            # Files and directories only, none outside (3.11.2 has no extraction filter).
            safe = [
                m
                for m in tar.getmembers()
                if (m.isfile() or m.isdir()) and not m.name.startswith("/") and ".." not in m.name.split("/")
            ]
            tar.extractall(dest.parent / "unpack", members=safe)
        shutil.move(dest.parent / "unpack" / top, dest)
        shutil.rmtree(dest.parent / "unpack")

    return fetch


# --- outcomes ----------------------------------------------------------------------------

_PYTEST = re.compile(r"^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)", re.M)
_UNITTEST = re.compile(r"^(test\w*) \(([\w.]+)\)[^\n]*? \.\.\. (ok|FAIL|ERROR|skipped)", re.M)
_VITEST = re.compile("^\\s*([\u2713\u00d7\u2193]) (.+?)(?: \\d+ms)?$", re.M)  # check, cross, arrow


def pytest_outcomes(out: str, _: Path) -> dict[str, str]:
    return {name: kind.lower() for kind, name in _PYTEST.findall(out)}


def unittest_outcomes(out: str, _: Path) -> dict[str, str]:
    return {f"{where}.{name}": kind.lower() for name, where, kind in _UNITTEST.findall(out)}


def vitest_outcomes(out: str, _: Path) -> dict[str, str]:
    word = {"\u2713": "passed", "\u00d7": "failed", "\u2193": "skipped"}
    return {name.strip(): word[mark] for mark, name in _VITEST.findall(out)}


def built_files(_: str, project: Path) -> dict[str, str]:
    dist = project / "dist"
    return {str(p.relative_to(dist)): "built" for p in sorted(dist.rglob("*")) if p.is_file()}


# --- the projects --------------------------------------------------------------------------

DJANGO_APP = {
    "app/manage.py": """import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_conf.settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
""",
    "app/site_conf/__init__.py": "",
    "app/site_conf/settings.py": """SECRET_KEY = "bench"
DEBUG = True
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "notes"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
ROOT_URLCONF = "site_conf.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
""",
    "app/site_conf/urls.py": """from django.urls import path
from notes import views
urlpatterns = [path("notes/", views.index)]
""",
    "app/notes/__init__.py": "",
    "app/notes/models.py": """from django.db import models
class Note(models.Model):
    text = models.CharField(max_length=100)
    def __str__(self):
        return self.text
""",
    "app/notes/views.py": """from django.http import JsonResponse
from .models import Note
def index(request):
    return JsonResponse({"notes": [str(n) for n in Note.objects.order_by("id")]})
""",
    "app/notes/tests.py": """from django.test import TestCase
from .models import Note
class NoteTests(TestCase):
    def test_str(self):
        self.assertEqual(str(Note(text="a")), "a")
    def test_saved_and_listed(self):
        Note.objects.create(text="x")
        Note.objects.create(text="y")
        self.assertEqual(self.client.get("/notes/").json(), {"notes": ["x", "y"]})
    def test_empty(self):
        self.assertEqual(self.client.get("/notes/").json(), {"notes": []})
""",
}

TYPESCRIPT = {
    "package.json": json.dumps(
        {
            "name": "bench-ts",
            "version": "1.0.0",
            "private": True,
            "type": "module",
            "devDependencies": {"typescript": "5.9.3", "vitest": "3.2.7", "@types/node": "22.20.5"},
        },
        indent=2,
    ),
    "tsconfig.json": json.dumps(
        {
            "compilerOptions": {
                "target": "ES2022",
                "module": "ESNext",
                "moduleResolution": "Bundler",
                "strict": True,
                "types": ["node"],
                "skipLibCheck": False,
            },
            "include": ["src", "test"],
        }
    ),
    "src/text.ts": """export function words(s: string): string[] {
  return s.split(/\\s+/).filter((w) => w.length > 0);
}
export function title(s: string): string {
  return words(s).map((w) => w[0].toUpperCase() + w.slice(1)).join(" ");
}
""",
    "test/text.test.ts": """import { describe, expect, it } from "vitest";
import { mkdtempSync, writeFileSync, readFileSync, renameSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { title, words } from "../src/text";
describe("text", () => {
  it("splits words", () => expect(words(" a  b ")).toEqual(["a", "b"]));
  it("titles", () => expect(title("hello world")).toBe("Hello World"));
  it("renames from the temporary directory", () => {
    const d = mkdtempSync(join(tmpdir(), "t-"));
    writeFileSync(join(d, "f"), "x");
    renameSync(join(d, "f"), join(d, "g"));
    expect(readFileSync(join(d, "g"), "utf8")).toBe("x");
  });
});
""",
}

VITE = {
    "package.json": json.dumps(
        {
            "name": "bench-vite",
            "version": "1.0.0",
            "private": True,
            "type": "module",
            "devDependencies": {"vite": "6.4.6"},
        },
        indent=2,
    ),
    "index.html": '<!doctype html><html><body><div id="app"></div>\n'
    '<script type="module" src="/src/main.js"></script></body></html>\n',
    "src/main.js": 'import "./style.css";\nimport { greet } from "./greet.js";\n'
    'document.querySelector("#app").textContent = greet("vite");\n',
    "src/greet.js": "export const greet = (who) => `hello ${who}`;\n",
    "src/style.css": "#app { font-family: sans-serif; color: #123456; }\n",
}

SMOKE = {
    "setup.sh": "mkdir -p build && python3 -c 'import sys; print(sys.version)' > build/out\n",
    "test_smoke.py": """import os, tempfile, unittest
class Smoke(unittest.TestCase):
    def test_rename_from_tmpdir(self):
        fd, p = tempfile.mkstemp()
        os.close(fd)
        os.rename(p, "renamed")
        os.unlink("renamed")
    def test_setup_ran(self):
        self.assertTrue(os.path.getsize("build/out") > 0)
    @unittest.skip("skipped on both sides")
    def test_skipped(self):
        pass
""",
}

PROJECTS = {
    "attrs": Project(
        "attrs",
        pypi_sdist("attrs", "26.1.0"),
        setup="uv sync -q --locked --no-default-groups --group tests",
        test=".venv/bin/python -m pytest -q -rA -p no:randomly tests",
        outcomes=pytest_outcomes,
        env={"UV_PYTHON": "/usr/bin/python3"},
    ),
    "django": Project(
        "django",
        pypi_sdist("Django", "5.2.19"),
        setup="python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check -e .",
        test="cd app && ../.venv/bin/python manage.py test -v 2",
        outcomes=unittest_outcomes,
        files=DJANGO_APP,
    ),
    "typescript": Project(
        "typescript",
        None,
        setup="npm install --no-audit --no-fund --loglevel=error",
        test="npx tsc --noEmit -p . && npx vitest run --reporter=verbose",
        outcomes=vitest_outcomes,
        files=TYPESCRIPT,
    ),
    "vite": Project(
        "vite",
        None,
        setup="npm install --no-audit --no-fund --loglevel=error",
        test="npx vite build",
        outcomes=built_files,
        files=VITE,
    ),
}
SMOKE_PROJECT = Project(
    "smoke",
    None,
    setup="sh setup.sh",
    test="python3 -m unittest -v test_smoke",
    outcomes=unittest_outcomes,
    files=SMOKE,
)


# --- running -------------------------------------------------------------------------------


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "USER", "LOGNAME", "TERM", *TLS)
    # XDG_*: which warren (its state directory) and which caches, the same for both sides.
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("XDG_")}
    env.setdefault("LANG", "C.UTF-8")
    # The same tools on both sides: uv beside this Python, if it is there.
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    return env


@dataclass
class Side:
    setup_s: float
    test_s: float
    outcomes: dict[str, str]
    files: set[str]
    log: str


def run_side(project: Project, src: Path, where: Path, warren: bool) -> Side:
    if where.exists():
        shutil.rmtree(where)
    shutil.copytree(src, where, symlinks=True)
    env = {**base_env(), **project.env}
    log = []
    times = []
    out = ""
    for step in (project.setup, project.test):
        if warren:
            given = {**{k: env[k] for k in TLS if k in env}, **project.env}
            argv = [*WARREN, "run", *PRESETS, *(a for k, v in given.items() for a in ("--env", f"{k}={v}"))]
            argv += ["--", "sh", "-c", step]
        else:
            argv = ["sh", "-c", step]
        start = time.monotonic()
        r = subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True, timeout=1800)
        times.append(time.monotonic() - start)
        out = r.stdout + r.stderr
        log.append(f"$ {step}\n(exit {r.returncode})\n{out}")
        if r.returncode != 0 and step is project.setup:
            raise SystemExit(
                f"{project.name}: setup failed ({'warren' if warren else 'host'}):\n{out[-3000:]}"
            )
    return Side(times[0], times[1], project.outcomes(out, where), _tree(where), "\n".join(log))


def _tree(root: Path) -> set[str]:
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            out.add(os.path.normpath(os.path.join(rel, name)) + "/")
        for name in filenames:
            out.add(os.path.normpath(os.path.join(rel, name)))
    return {p for p in out if not any(p.startswith(i) for i in IGNORED)}


def compare(project: Project, workdir: Path, rounds: int) -> dict[str, object]:
    src = workdir / "src" / project.name
    if not src.exists():
        src.parent.mkdir(parents=True, exist_ok=True)
        if project.fetch is not None:
            project.fetch(src)
    for rel, text in project.files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    run_side(project, src, workdir / "warm" / project.name, warren=False)  # caches warmed
    host: list[Side] = []
    inside: list[Side] = []
    for _ in range(rounds):
        host.append(run_side(project, src, workdir / "host" / project.name, warren=False))
        inside.append(run_side(project, src, workdir / "warren" / project.name, warren=True))
    h, w = host[-1], inside[-1]
    (workdir / f"{project.name}-host.log").write_text(h.log)
    (workdir / f"{project.name}-warren.log").write_text(w.log)
    differ = sorted(
        k for k in h.outcomes.keys() | w.outcomes.keys() if h.outcomes.get(k) != w.outcomes.get(k)
    )
    counts = {side: _counts(s.outcomes) for side, s in (("host", h), ("warren", w))}
    setup = (statistics.median(s.setup_s for s in host), statistics.median(s.setup_s for s in inside))
    test = (statistics.median(s.test_s for s in host), statistics.median(s.test_s for s in inside))
    return {
        "project": project.name,
        "outcomes": counts,
        "identical": not differ and bool(h.outcomes),
        "differ": differ[:20],
        "only_in_warren": sorted(w.files - h.files)[:20],
        "only_on_host": sorted(h.files - w.files)[:20],
        "setup_s": setup,
        "test_s": test,
        "setup_ratio": setup[1] / setup[0],
        "test_ratio": test[1] / test[0],
    }


def _counts(outcomes: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind in outcomes.values():
        out[kind] = out.get(kind, 0) + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(PROJECTS), help="these projects only")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workdir", type=Path, help="kept between runs (sources are fetched once)")
    ap.add_argument("--smoke", action="store_true", help="the offline smoke project only")
    ap.add_argument("--json", action="store_true", help="results as JSON lines")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="warren-real-projects-", dir=Path.home()))
    workdir.mkdir(parents=True, exist_ok=True)
    chosen = [SMOKE_PROJECT] if args.smoke else [PROJECTS[n] for n in (args.only or PROJECTS)]
    ok = True
    for project in chosen:
        res = compare(project, workdir, args.rounds)
        ok &= bool(res["identical"]) and not res["only_in_warren"] and not res["only_on_host"]
        if args.json:
            print(json.dumps(res), flush=True)
            continue
        hs, ws = res["setup_s"]
        ht, wt = res["test_s"]
        print(
            f"{project.name:11} setup {hs:6.1f}s host {ws:6.1f}s warren ({res['setup_ratio']:.2f}x)  "
            f"tests {ht:6.1f}s host {wt:6.1f}s warren ({res['test_ratio']:.2f}x)  "
            f"outcomes {'identical' if res['identical'] else 'DIFFER'} {res['outcomes']['host']}",
            flush=True,
        )
        for key in ("differ", "only_in_warren", "only_on_host"):
            if res[key]:
                print(f"  {key}: {res[key]}", flush=True)
    print(f"logs in {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
