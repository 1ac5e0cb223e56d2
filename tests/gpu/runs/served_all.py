"""served-all's jobs (``remote.sh served-all``): which served runs start, on which release, port and GPU, side by side, and what comes back.

``--jobs`` (SERVED_JOBS: ``RECIPE:PHASES[:exact|default]``, space-separated) times ``--versions``
(SERVED_VERSIONS: ``0.21.0``, ``0.33.0``, or ``V-without-ID``, V's series less patch ID, whose tree
remote.sh builds before) make the jobs. Each runs ``--command SITE PATCHED NAME`` (remote.sh's
``served-run``: served.py's phases in ``$WORK/NAME``) with its recipe, phases and numerics, a port
base of its own (``--port-base``, SERVED_ALL_PORT_BASE, 8000 by default, + 100 i: wider than a
job's phase ports) and, with ``--gpus``, the i-th GPU round-robin. They start ``--stagger-s`` apart (engine start-up is mostly CPU), each logging to
``$WORK/served-all-I-V-RECIPE-PHASES.log``; while any runs, the GPUs' memory is sampled every 30 s.
Once all have ended: each log's tail, the logs in ``$OUT/served-all-logs.tar.gz``, and past 8 files
in ``$OUT`` (what a GPU host hands back at most) all but the record and its page as
``served-out.tar.gz``.

``check`` refuses, with exit 2 and before anything starts: a recipe named twice (its folder is
per recipe and version), a speed phase that would share a GPU with another job, a
conformance phase without z-lab's record (``--zlab``), which it reads when it starts, and a
job port another process holds (a second served-all on the host: its servers would fail to
bind, or a readiness probe would find the other's server).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import socket
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import side_by_side  # noqa: E402

PORT_BASE, PORT_STEP = 8000, 100
PHASE_PORTS = 8  # served.py's PORT_OFFSETS span 0..6 of a job's base (a unit test keeps them in step)
OUT_LIMIT = 8  # files a GPU host's $OUT brings back
KEEP_APART = ("served.json", "served.md", "served-out.tar.gz")


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class Sites:
    """Where each release's stock and patched vLLM are (remote.sh's SITE*, REVERTED_SITES)."""

    site: str
    site_patched: str
    site33: str
    site33_patched: str
    reverted: str

    def of(self, version: str) -> tuple[str, str, str, str | None]:
        """(stock site, patched site, run name, variant) of a version."""
        if version == "0.21.0":
            return self.site, self.site_patched, "served", None
        if "-without-" in version:
            base, patch = version.split("-without-", 1)
            stock = self.site if base == "0.21.0" else self.site33
            return stock, f"{self.reverted}/{base}/{patch}", f"served-{version}", f"without {patch}"
        return self.site33, self.site33_patched, "served-v33", None


@dataclass(frozen=True)
class Job:
    index: int
    recipe: str
    phases: str
    numerics: str  # "exact", "default", or "" (served.py's default)
    version: str
    gpu: str | None
    port_base: int = PORT_BASE

    @property
    def log_name(self) -> str:
        return (f"served-all-{self.index}-{self.version}-{self.recipe.removeprefix('gemma4-moe-')}-"
                f"{self.phases.replace(',', '+')}.log")

    def env(self, sites: Sites) -> dict[str, str]:
        out = {"SERVED_RECIPE": self.recipe, "SERVED_PHASES": self.phases,
               "SERVED_PORT_BASE": str(self.port_base + PORT_STEP * self.index)}
        if self.numerics:
            out["SERVED_EXACT"] = "1" if self.numerics == "exact" else "0"
        if self.gpu is not None:
            out["CUDA_VISIBLE_DEVICES"] = self.gpu
        variant = sites.of(self.version)[3]
        if variant:
            out["SERVED_VARIANT"] = variant
        return out

    def argv(self, command: list[str], sites: Sites) -> list[str]:
        return [*command, *sites.of(self.version)[:3]]


def plan(jobs: str, versions: str, gpus: list[str], port_base: int = PORT_BASE) -> list[Job]:
    """The jobs, in start order (each job on each version); a PlanError says why none may start."""
    specs = [job.split(":") for job in jobs.split()]
    if not specs or any(len(s) not in (2, 3) or not all(s[:2]) for s in specs):
        raise PlanError(f"SERVED_JOBS: space-separated RECIPE:PHASES[:exact|default], not {jobs!r}")
    recipes = [s[0] for s in specs]
    if len(set(recipes)) != len(recipes):
        raise PlanError(f"SERVED_JOBS names a recipe twice (one folder per recipe and version): {jobs}")
    numerics = [s[2] if len(s) == 3 else "" for s in specs]
    if any(n not in ("", "exact", "default") for n in numerics):
        raise PlanError(f"SERVED_JOBS: numerics are exact or default: {jobs}")
    vs = versions.split()
    if any("speed" in s[1].split(",") for s in specs) and len(specs) * len(vs) > max(len(gpus), 1):
        raise PlanError("the speed phase runs alone: one job and version per GPU (SERVED_VERSIONS=0.21.0, "
                        "or SERVED_GPUS)")
    top = port_base + PORT_STEP * (len(specs) * len(vs) - 1) + PHASE_PORTS - 1
    if port_base < 1024 or top > 65535:
        raise PlanError(f"SERVED_ALL_PORT_BASE {port_base}: the jobs' ports run from it to {top}, "
                        "which must lie within 1024-65535")
    out = []
    for (recipe, phases, *_), num in zip(specs, numerics):
        for v in vs:
            i = len(out)
            out.append(Job(i, recipe, phases, num, v, gpus[i % len(gpus)] if gpus else None, port_base))
    return out


def unused_path(folder: Path, stem: str, suffix: str) -> Path:
    """``folder/stem+suffix``, or ``stem-N+suffix`` with the first N free: an archive is written
    beside an earlier one, never over it."""
    return next(path for i in range(1, 1 << 16)
                if not (path := folder / f"{stem}{'' if i == 1 else f'-{i}'}{suffix}").exists())


def pack_out(out: Path, limit: int = OUT_LIMIT, keep: tuple[str, ...] = KEEP_APART) -> bool:
    """Past ``limit`` files under ``out``: every top-level entry but ``keep`` and earlier packs into
    ``served-out.tar.gz`` (raw folders, logs, benchmark files; ``served-out-N.tar.gz`` where an
    earlier command of the same $OUT packed one: never over it), then removed. True if packed."""
    if sum(1 for p in out.rglob("*") if p.is_file()) <= limit:
        return False
    entries = sorted(p for p in out.iterdir() if p.name not in keep and not p.name.startswith("served-out"))
    dest = unused_path(out, "served-out", ".tar.gz")
    with tarfile.open(out / "served-out.tar.gz.partial", "w:gz") as tar:
        for p in entries:
            tar.add(p, arcname=p.name)
    (out / "served-out.tar.gz.partial").replace(dest)
    for p in entries:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return True


def run(jobs: list[Job], command: list[str], sites: Sites, work: Path, out: Path, stagger_s: float) -> int:
    """Start every job, wait for all, report, pack; 1 if one failed."""
    memory = work / "served-all-memory.log"
    runs = [side_by_side.Job(job.argv(command, sites), work / job.log_name, job.env(sites)) for job in jobs]
    rc = 0 if all(code == 0 for code in side_by_side.run(runs, stagger_s, memory)) else 1
    print(f"== GPU memory used, every {side_by_side.MEMORY_EVERY_S} s: {' '.join(memory.read_text().split())}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "served-all-logs.tar.gz", "w:gz") as tar:
        for path in (*(r.log for r in runs), memory):
            tar.add(path, arcname=path.name)
    pack_out(out)
    return rc


def ports_in_use(jobs: list[Job]) -> list[int]:
    """The jobs' server ports that another process holds on 127.0.0.1 now. Bound as vLLM binds
    them (SO_REUSEADDR): a port an earlier run's server left in TIME_WAIT, after its readiness
    probes, is free to vLLM and must not be refused."""
    busy = []
    for job in jobs:
        for port in range(job.port_base + PORT_STEP * job.index, job.port_base + PORT_STEP * job.index + PHASE_PORTS):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    busy.append(port)
    return busy


def zlab_missing(jobs: list[Job], zlab: str) -> str:
    """Why the jobs may not start without z-lab's record, or "". The conformance phase reads the
    record once, at its start, to stop each prompt again at its common prefix with z-lab's loop;
    started without it, the phase serves every prompt whole and its prefix acceptance is simply
    absent, which no later step can make up."""
    if not any("conformance" in job.phases.split(",") for job in jobs) or (zlab and Path(zlab).is_file()):
        return ""
    return (f"the conformance phase needs z-lab's record before it starts ({zlab or 'none given'} is missing): "
            "run `remote.sh zlab-reference` first, or set SERVED_ZLAB to a committed record")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("check", "run"))
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--versions", default="0.21.0 0.33.0")
    parser.add_argument("--gpus", default="", help="comma-separated: job i on the i-th, round-robin")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--command", default="bash tests/gpu/remote.sh served-run",
                        help="what runs one job, given SITE PATCHED NAME")
    parser.add_argument("--stagger-s", type=float, default=20.0)
    parser.add_argument("--port-base", type=int, default=PORT_BASE, help="job i's servers from PORT_BASE + 100 i")
    parser.add_argument("--zlab", default="", help="z-lab's record, which the conformance phase reads when it starts")
    for name in ("site", "site-patched", "site33", "site33-patched", "reverted"):
        parser.add_argument(f"--{name}", default="")
    args = parser.parse_args(argv)
    try:
        jobs = plan(args.jobs, args.versions, [g for g in args.gpus.split(",") if g], args.port_base)
    except PlanError as exc:
        print(exc, file=sys.stderr)
        return 2
    missing = zlab_missing(jobs, args.zlab)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    busy = ports_in_use(jobs)
    if busy:
        print(f"ports {', '.join(map(str, busy))} are in use on 127.0.0.1 (another served-all on this host?): "
              "set SERVED_ALL_PORT_BASE to a free range, e.g. 9000", file=sys.stderr)
        return 2
    if args.action == "check":
        return 0
    if args.work is None or args.out is None:
        parser.error("run needs --work and --out")
    sites = Sites(args.site, args.site_patched, args.site33, args.site33_patched, args.reverted)
    args.work.mkdir(parents=True, exist_ok=True)
    return run(jobs, shlex.split(args.command), sites, args.work, args.out, args.stagger_s)


if __name__ == "__main__":
    sys.exit(main())
