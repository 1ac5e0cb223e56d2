"""``launcher install``: a released vLLM the recipe supports, patched, in one command.

Four steps, each the one the user would otherwise type:

1. the Python to install into: ``--vllm-python`` (an existing interpreter),
   ``--venv DIR`` (made with ``python -m venv`` when it is not there yet), or
   the launcher's own venv, which is where ``serve``, ``doctor`` and ``patch``
   look first (:mod:`launcher.vllm_env`);
2. ``pip install`` of the newest release the recipe supports (or
   ``--version``): from PyPI on Linux and WSL; from a wheel file or a folder of
   wheels (``--wheel``) on Windows, where PyPI has no vLLM wheel (e.g.
   SystemPanic/vllm-windows's ``vllm-0.29.0+cu132-cp312-cp312-win_amd64.whl``),
   and on hosts without the internet (``--offline``: that folder only);
3. the series applied with the patch engine (:mod:`launcher.patching.engine`);
4. ``patch status`` read back: every patch applied, else exit 1.

Paths are handled as the target OS writes them (``Scripts\\python.exe`` in a
Windows venv), so the plan of an install can be tested on Linux.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePath, PureWindowsPath

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from launcher import interrupts, redact
from launcher.errors import EXIT_PROBLEMS, LauncherError
from launcher.vllm_compat import nearest_release, newest, parse_version

DEFAULT_RECIPE = "gemma4-moe-dflash"
#: what an example names when PyPI has no wheel for the OS
WINDOWS_WHEEL_EXAMPLE = "vllm-0.29.0+cu132-cp312-cp312-win_amd64.whl (SystemPanic/vllm-windows releases)"


def venv_python(venv: PurePath) -> PurePath:
    """The interpreter of the venv at ``venv``: ``Scripts\\python.exe`` on Windows, ``bin/python`` elsewhere."""
    if isinstance(venv, PureWindowsPath):
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def shell_join(words: list[str], *, windows: bool) -> str:
    """A command line as the user's shell reads it back (cmd.exe / PowerShell quoting on Windows)."""
    if windows:
        return subprocess.list2cmdline(words)
    import shlex

    return shlex.join(words)


def wheel_version(path: PurePath) -> str:
    """The vLLM version a wheel's file name states (``0.29.0+cu132``); LauncherError when it is no vLLM wheel."""
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise LauncherError(f"--wheel {path}: not a wheel file name ({exc})",
                            hint=f"a vLLM wheel is named like {WINDOWS_WHEEL_EXAMPLE}") from None
    if name != "vllm":
        raise LauncherError(f"--wheel {path}: a wheel of {name}, not of vllm")
    return str(version)


# The machine names platform.machine() gives, and the endings of wheel platform tags built for them
_ARCH_TAGS = {"x86_64": ("x86_64", "amd64"), "amd64": ("x86_64", "amd64"),
              "aarch64": ("aarch64", "arm64"), "arm64": ("aarch64", "arm64")}


def wheel_platform_problem(name: str, *, windows: bool, machine: str | None) -> str | None:
    """Why a wheel (by its file name's platform tags) cannot install on this host, or None: pip
    would refuse it only after the plan had made the venv. ``machine``: platform.machine(), or
    None to leave the architecture unchecked."""
    platforms = {t.platform for t in parse_wheel_filename(name)[3]}
    if "any" in platforms:
        return None
    system = [p for p in platforms if (p.startswith("win") if windows else "linux" in p)]
    if not system:
        return f"built for {', '.join(sorted(platforms))}, not for {'Windows' if windows else 'Linux'}"
    arch = _ARCH_TAGS.get((machine or "").lower())
    if arch and not any(p.endswith(a) for p in system for a in arch):
        return f"built for {', '.join(sorted(system))}, not for this {machine} machine"
    return None


def supported_versions(recipe) -> list[str]:
    """The releases the recipe supports, newest first."""
    return sorted(recipe.vllm_versions, key=parse_version, reverse=True)


def choose_version(recipe, asked: str | None, available: list[str] | None = None) -> str:
    """``asked`` if the recipe supports it, else the newest supported release (of ``available``, a wheel folder's)."""
    supported = supported_versions(recipe)
    public = {str(parse_version(v)): v for v in supported}
    if asked is not None:
        if str(parse_version(asked)) not in public:
            raise LauncherError(
                f"recipe {recipe.name} supports vLLM {', '.join(supported)}, not {asked}",
                hint=f"the nearest supported release is {nearest_release(parse_version(asked), supported)}: "
                     f"--version {nearest_release(parse_version(asked), supported)}")
        return public[str(parse_version(asked))]
    if available is None:
        return newest(supported)
    offered = {str(parse_version(v)) for v in available}
    fits = [v for v in supported if str(parse_version(v)) in offered]
    if not fits:
        raise LauncherError(f"no wheel there is a vLLM recipe {recipe.name} supports: found "
                            f"{', '.join(sorted(available)) or 'none'}; supported: {', '.join(supported)}")
    return fits[0]


@dataclass
class InstallPlan:
    """What an install does, decided before anything runs (``--dry-run`` prints it)."""

    recipe: str
    version: str
    version_source: str
    python: PurePath
    create_venv: PurePath | None  # a venv made first (its python is ``python``)
    pip: list[str]
    source: str  # where the wheel comes from, in words
    windows: bool

    def lines(self) -> list[str]:
        out = [f"recipe        {self.recipe}",
               f"vLLM          {self.version}  [{self.version_source}]",
               f"from          {self.source}",
               f"python        {self.python}" + ("  (a new venv)" if self.create_venv else "")]
        steps = [shell_join([sys.executable, "-m", "venv", str(self.create_venv)], windows=self.windows)
                 ] if self.create_venv else []
        steps += [redact.url_credentials(shell_join(self.pip, windows=self.windows)),
                  f"launcher patch apply --vllm-python {shell_join([str(self.python)], windows=self.windows)}",
                  "launcher patch status (every patch applied)"]
        return out + [f"step {i:<9}{step}" for i, step in enumerate(steps, 1)]


def plan_install(*, recipe, version: str | None, venv: PurePath | None, vllm_python: PurePath | None,
                 wheel: PurePath | None, offline: bool, pip_args: list[str], windows: bool,
                 own_python: PurePath, own_is_venv: bool, exists=os.path.exists, listdir=os.listdir,
                 machine: str | None = None) -> InstallPlan:
    """The install as a plan: which Python, which release, which pip command (nothing runs here).
    ``machine`` (platform.machine()) checks a wheel's architecture too."""
    if venv is not None and vllm_python is not None:
        raise LauncherError("give --venv or --vllm-python, not both")
    if windows and wheel is None:
        raise LauncherError("PyPI has no vLLM wheel for Windows",
                            hint=f"pass --wheel with a Windows wheel or a folder of them, e.g. {WINDOWS_WHEEL_EXAMPLE}")
    if offline and wheel is None:
        raise LauncherError("--offline installs from a folder of wheels", hint="pass --wheel FOLDER")
    python, create = _where(venv, vllm_python, own_python, own_is_venv, exists, listdir)
    chosen, source, spec = _what(recipe, version, wheel, offline, exists, listdir, windows, machine)
    pip = [str(python), "-m", "pip", "install", *spec, *pip_args]
    how = "--version" if version else ("the newest the recipe supports" + (" in --wheel" if wheel else ""))
    return InstallPlan(recipe=recipe.name, version=chosen, version_source=how, python=python, create_venv=create,
                       pip=pip, source=source, windows=windows)


def _where(venv, vllm_python, own_python, own_is_venv, exists, listdir) -> tuple[PurePath, PurePath | None]:
    if vllm_python is not None:
        if not exists(str(vllm_python)):
            raise LauncherError(f"--vllm-python {vllm_python}: no such file",
                                hint="give a python executable, or --venv DIR to make a new environment")
        return vllm_python, None
    if venv is not None:
        python = venv_python(venv)
        if exists(str(python)):
            return python, None
        if exists(str(venv)) and _entries(listdir, venv, f"--venv {venv} is a file, not a folder for a venv"):
            raise LauncherError(f"--venv {venv} is a folder that holds no venv (no {python})",
                                hint="name an empty or new folder, or an existing venv")
        return python, venv
    if not own_is_venv:
        raise LauncherError(f"the launcher's Python ({own_python}) is not a venv; pip would change the system's packages",
                            hint="pass --venv DIR (made if missing) or --vllm-python PATH")
    return own_python, None


def _entries(listdir, folder: PurePath, not_a_folder: str) -> list[str]:
    """The names in ``folder``; a file given where a folder belongs is the user's error, said so."""
    try:
        return listdir(str(folder))
    except NotADirectoryError:
        raise LauncherError(not_a_folder) from None


def _what(recipe, version, wheel, offline, exists, listdir, windows, machine) -> tuple[str, str, list[str]]:
    """(release, where it comes from, pip's arguments for it)."""
    if wheel is None:
        chosen = choose_version(recipe, version)
        return chosen, "PyPI", [f"vllm=={chosen}"]
    if not exists(str(wheel)):
        raise LauncherError(f"--wheel {wheel}: no such file or folder")
    if wheel.name.endswith(".whl"):
        found = wheel_version(wheel)
        problem = wheel_platform_problem(wheel.name, windows=windows, machine=machine)
        if problem:
            raise LauncherError(f"--wheel {wheel.name} is {problem}",
                                hint="take the wheel built for this system"
                                     + (f", e.g. {WINDOWS_WHEEL_EXAMPLE}" if windows else ", or install from PyPI"))
        chosen = choose_version(recipe, version or found)
        if parse_version(found) != parse_version(chosen):
            raise LauncherError(f"--wheel {wheel.name} is vLLM {found}, not {version}")
        return chosen, f"the wheel {wheel}", [str(wheel)]
    # each vllm-*.whl's version (a malformed name is the user's to fix, said so), then why it
    # cannot install here: pip's --find-links takes only the wheels that install, the choice too
    versions = {n: wheel_version(PurePath(n)) for n in _entries(
        listdir, wheel, f"--wheel {wheel} is neither a .whl file nor a folder of wheels")
        if n.startswith("vllm-") and n.endswith(".whl")}
    problems = {n: wheel_platform_problem(n, windows=windows, machine=machine) for n in versions}
    wheels = [n for n, problem in problems.items() if not problem]
    if versions and not wheels:
        raise LauncherError(f"--wheel {wheel}: none of its vLLM wheels installs here ("
                            + "; ".join(f"{n}: {problems[n]}" for n in sorted(problems)) + ")",
                            hint="add the wheel built for this system to the folder")
    chosen = choose_version(recipe, version, [versions[n] for n in wheels])
    if version and not any(parse_version(versions[n]) == parse_version(chosen) for n in wheels):
        raise LauncherError(f"--wheel {wheel}: no vLLM {chosen} wheel there (found: {', '.join(sorted(wheels)) or 'none'})")
    links = ["--no-index"] if offline else []
    return chosen, f"the wheels in {wheel}" + (" only" if offline else " (dependencies from PyPI)"), \
        [*links, "--find-links", str(wheel), f"vllm=={chosen}"]


# --- carrying it out ----------------------------------------------------------


def run(plan: InstallPlan, echo) -> int:
    """Create, install, patch, verify; the exit code (0, or 1 when a patch is not applied after)."""
    from launcher import vllm_env

    if plan.create_venv is not None:
        echo(f"creating the venv {plan.create_venv}")
        try:
            _run([sys.executable, "-m", "venv", str(plan.create_venv)], "python -m venv")
        except BaseException:
            # Half a venv (a python, no pip) would be taken as one by every later install.
            shutil.rmtree(plan.create_venv, ignore_errors=True)
            raise
    before = vllm_env.inspect(str(plan.python), "launcher install")
    if before.has_vllm and parse_version(before.vllm_version) == parse_version(plan.version):
        echo(f"vLLM {before.vllm_version} is already installed in {plan.python}: pip not run")
    else:
        if before.has_vllm:
            _revert_stamped(Path(before.package_dir), echo)
        echo("running: " + redact.url_credentials(shell_join(plan.pip, windows=plan.windows)))
        _has_pip(plan.python)
        _run(plan.pip, "pip install")
    after = vllm_env.inspect(str(plan.python), "launcher install")
    if not after.has_vllm or parse_version(after.vllm_version) != parse_version(plan.version):
        raise LauncherError(f"after pip, {plan.python} has vLLM {after.vllm_version or 'none'}, not {plan.version}")
    return _patch_and_verify(Path(after.package_dir), plan, echo)


def _end(proc: subprocess.Popen, grace_s: float = 10.0, ask: bool = True) -> None:
    """The child ended: asked (SIGTERM; ``ask=False``: it got the signal already and is given
    ``grace_s`` first), then killed after ``grace_s``."""
    for step in (proc.terminate if ask else (lambda: None), proc.kill):
        if proc.poll() is not None:
            return
        step()
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _has_pip(python: PurePath) -> None:
    """pip must be there before it is run: a venv whose creation was cut short has a python and
    no pip, and pip's own "No module named pip" does not say what to do."""
    try:
        ok = subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode == 0
    except OSError as exc:
        raise LauncherError(f"cannot run {python}: {exc.strerror}") from None
    if not ok:
        raise LauncherError(f"{python} has no pip (a venv whose creation was interrupted?)",
                            hint=f"run `{python} -m ensurepip`, or remove that venv and run launcher install again")


def _run(argv: list[str], what: str) -> None:
    # pip's own progress goes straight to the terminal: a download of gigabytes must not look stuck.
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        raise LauncherError(f"{what} could not start ({argv[0]}): {exc.strerror}") from None
    try:
        # SIGTERM or SIGHUP sent to the launcher alone would end it and leave pip running on.
        with interrupts.unwinding():
            code = proc.wait()
    except interrupts.Signalled as sig:
        _end(proc)
        raise LauncherError(f"{what} stopped by {sig.name}; it was ended too, and nothing was patched",
                            exit_code=sig.exit_status) from None
    except BaseException:  # Ctrl-C reaches pip too (one process group): let it finish going
        _end(proc, ask=False)
        raise
    if code != 0:
        raise LauncherError(f"{what} failed (exit {code}); nothing was patched", hint="its output is above")


def _revert_stamped(package: Path, echo) -> None:
    """Another release is there: put its files back before pip replaces it, so no stamp outlives its files."""
    from launcher.patching import engine

    if engine.status(package).stamp is None:
        return
    echo("reverting the patches of the vLLM there before pip replaces it")
    engine.revert(package)


def _patch_and_verify(package: Path, plan: InstallPlan, echo) -> int:
    from launcher.patching import engine

    report = engine.apply(package)
    echo(report.message)
    status = engine.status(package)
    left = [f"{p.id} ({p.state})" for p in status.patches if p.state != "applied"]
    if left:
        echo(f"patch status: {len(left)} of {len(status.patches)} patches not applied: {', '.join(left)}")
        return EXIT_PROBLEMS
    echo(f"patch status: all {len(status.patches)} patches of series {status.series_version} applied "
         f"to vLLM {status.version} at {status.tree.root}")
    return 0


def next_steps(plan: InstallPlan, own_python: PurePath, recipe_arg: str | None = None) -> list[str]:
    """What to run next, with --vllm-python when the vLLM is not in the launcher's own Python;
    ``recipe_arg``: --recipe as given (a file too), repeated as is."""
    recipe = shell_join([recipe_arg or plan.recipe], windows=plan.windows)
    flag = "" if plan.python == own_python else \
        " --vllm-python " + shell_join([str(plan.python)], windows=plan.windows)
    return [f"next: launcher models pull --recipe {recipe}",
            f"      launcher serve --recipe {recipe}{flag}"]


# --- the command --------------------------------------------------------------

import typer  # noqa: E402  (the command below; the logic above stays importable without a CLI)

# A top-level `install`, not `vllm install`: inside an image the word `vllm` runs vLLM's own
# command line (docker/entrypoint.sh).


def install_cmd(
    version: str | None = typer.Option(None, "--version", help="the vLLM release (default: the newest the recipe supports)"),
    recipe: str = typer.Option(DEFAULT_RECIPE, "--recipe", "-r", help="the recipe whose releases and patches to install"),
    venv: Path | None = typer.Option(None, "--venv", help="install into the venv at DIR (made when missing)"),
    vllm_python: Path | None = typer.Option(None, "--vllm-python", help="install into this python's environment "
                                            "(default: the launcher's own venv, where serve looks first)"),
    wheel: Path | None = typer.Option(None, "--wheel", help="a vLLM wheel file, or a folder of wheels, instead of "
                                      "PyPI (Windows, hosts without the internet)"),
    offline: bool = typer.Option(False, "--offline", help="with a --wheel folder: install from that folder only "
                                 "(pip --no-index)"),
    pip_arg: list[str] = typer.Option([], "--pip-arg", help="one more argument for pip install (repeatable), "
                                      "e.g. --pip-arg=--extra-index-url=URL"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the steps; run nothing"),
) -> None:
    """Install a released vLLM the recipe supports (into the launcher's venv, or --venv), apply the
    patch series, verify it."""
    from launcher import recipe as recipes

    rec = recipes.load(recipe)
    own = Path(sys.executable)
    if vllm_python is not None and vllm_python.expanduser().is_dir():
        # the dry run printed its steps for it; the install then failed on "Permission denied"
        raise LauncherError(f"--vllm-python {vllm_python} is a folder, not a Python executable",
                            hint="give the python inside it (bin/python), or --venv DIR for a new environment")
    plan = plan_install(recipe=rec, version=version, venv=venv.expanduser().absolute() if venv else None,
                        vllm_python=vllm_python.expanduser().absolute() if vllm_python else None,
                        wheel=wheel.expanduser().absolute() if wheel else None, offline=offline,
                        pip_args=list(pip_arg), windows=os.name == "nt", own_python=own,
                        own_is_venv=sys.prefix != sys.base_prefix, machine=platform.machine())
    for line in plan.lines():
        typer.echo(line)
    if dry_run:
        return
    code = run(plan, typer.echo)
    if code == 0:
        for line in next_steps(plan, own, recipe):
            typer.echo(line)
    raise typer.Exit(code)
