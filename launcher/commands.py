"""Top-level commands: serve, doctor, recipes, version."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from launcher import __version__
from launcher.errors import LauncherError

recipes_app = typer.Typer(no_args_is_help=True, help="List, show, validate recipes; export their JSON Schema.")


def _context(vllm_python: str | None = None, *, runtime: str = "native"):
    from launcher import hardware, vllm_env
    from launcher.plan import Context

    env = vllm_env.resolve(vllm_python)
    has = env is not None and env.has_vllm
    ctx = Context(
        host=hardware.probe(),
        environ=dict(os.environ),
        installed_vllm=env.vllm_version if has else None,
        installed_transformers=env.transformers_version if env else None,
        vllm=env,
    )
    if runtime == "docker":
        ctx.images, ctx.docker_error = _local_images()
    return ctx


def _local_images():
    """The daemon's images for the docker runtime's plan, or why there are none to look at."""
    try:
        from launcher.runtime import docker as docker_runtime

        return docker_runtime.local_images(docker_runtime.connect(timeout=10)), None
    except ImportError as exc:
        return None, f"the Docker SDK is not installed ({exc})"
    except LauncherError as exc:
        return None, exc.message


def serve(
    ctx: typer.Context,
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe name (launcher recipes list) or a YAML file.")],
    model: Annotated[Optional[str], typer.Option(help="Target model folder (default: $MODELS_DIR/<recipe target>).")] = None,
    drafter: Annotated[Optional[str], typer.Option(help="Drafter folder (default: $MODELS_DIR/<recipe drafter>).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Hardware profile: rtx5090 | dgx-spark | dgx-spark-x2 (with --nnodes 2); the recipe lists its own (default: detected).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (or publish on, with docker).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Require this API key (never printed).")] = None,
    runtime: Annotated[str, typer.Option(help="native (vllm serve here) or docker.")] = "native",
    vllm_version: Annotated[Optional[str], typer.Option("--vllm-version", help="Plan for this vLLM (default: installed, else the newest the recipe supports, which launcher install installs).")] = None,
    image: Annotated[Optional[str], typer.Option(help="Docker image (docker runtime).")] = None,
    vllm_python: Annotated[Optional[str], typer.Option("--vllm-python", envvar="VLLM_PYTHON", help="Native: the python whose vLLM runs (default: this Python if it has vLLM, else the one behind `vllm` on PATH).")] = None,
    restart: Annotated[str, typer.Option(help="Docker runtime: no (foreground, removed at exit) or a restart policy: unless-stopped (back after a reboot until `launcher stop`), always, on-failure.")] = "no",
    set_: Annotated[list[str], typer.Option("--set", help="KEY=VALUE: an env var (UPPER_CASE) or a recipe field (dotted.path); beats recipe and environment.")] = [],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and preflight; start nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as JSON.")] = False,
    force: Annotated[bool, typer.Option(help="Start even if preflight blocks.")] = False,
    test_gpu: Annotated[bool, typer.Option("--test-gpu", help="Plan on a Hopper (sm_90) test GPU standing in for the profile's sm_12x card: swaps the Blackwell-only FP4 kernels for Marlin and scales the memory fraction to the card's budget, prints the --set items that implies, keeps every other preflight check (tests/gpu/README.md, 'Served').")] = False,
    wait: Annotated[bool, typer.Option(help="Native: wait for /health, send one chat request, print the endpoint.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for /health.")] = 1800.0,
    nnodes: Annotated[Optional[int], typer.Option("--nnodes", help="Machines serving the model together (vLLM's native multi-node); picks the recipe's profile for that many, e.g. dgx-spark-x2.")] = None,
    node_rank: Annotated[Optional[int], typer.Option("--node-rank", help="With --nnodes: this machine's rank, 0 on the head (serves the API), 1.. on the others (headless).")] = None,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="With --nnodes: the head's address on the link between the nodes; the head listens there for the others.")] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="With --nnodes: the head's torch.distributed port (vLLM's default 29501).")] = None,
    executor: Annotated[Optional[str], typer.Option("--distributed-executor-backend", help="With --nnodes: mp (vLLM's native multi-node, default) or ray (the head starts Ray, the others join it).")] = None,
    ifname: Annotated[Optional[str], typer.Option("--ifname", help="With --nnodes: the network interface NCCL, Gloo and UCX use (default: the profile's, e.g. enp1s0f1np1).")] = None,
) -> None:
    """Serve a recipe. Extra vLLM arguments go after `--`."""
    from launcher import multinode, passthrough
    from launcher import plan as plans

    if runtime not in ("native", "docker"):
        raise LauncherError(f"unknown runtime {runtime!r}", hint="use native or docker")
    if not timeout > 0:
        raise LauncherError(f"--timeout {timeout:g}: seconds to wait must be more than 0")
    if as_json and not dry_run:
        raise LauncherError("--json prints the plan of a dry run", hint="add --dry-run")
    if restart != "no" and runtime != "docker":
        raise LauncherError("--restart needs --runtime docker", hint="a native server ends with the launcher")
    if image and runtime != "docker":
        # the native runtime serves the installed vLLM: the image would be shown and ignored
        raise LauncherError(f"--image {image} needs --runtime docker", hint="add --runtime docker, or leave --image out")
    req = plans.Request(
        recipe=recipe, model=model, drafter=drafter, profile=profile, host=host, port=port, api_key=api_key,
        runtime=runtime, vllm_version=vllm_version, image=image, sets=list(set_), extra_args=list(ctx.args),
        test_gpu=test_gpu,
        nodes=multinode.request(nnodes, node_rank, master_addr, master_port, executor, ifname),
    )
    if req.nodes is not None and req.nodes.backend == "ray" and runtime == "docker":
        raise LauncherError("--distributed-executor-backend ray runs natively only",
                            hint="drop --runtime docker, or use the native multi-node (mp) in containers")
    req = passthrough.lift_address(req, _given(ctx, "host", "port"))
    from launcher import checks

    plan = checks.resolve(req, _context(vllm_python if runtime == "native" else None, runtime=runtime))
    if dry_run:
        _print_plan(plan, as_json, restart)
        return  # exit 0: the plan was printed; its verdict is in it (errors.EXIT_CODES_TABLE)
    if plan.blocking and not force:
        typer.echo(plans.format_plan(plan))
        first = plan.blocking[0]
        raise LauncherError(
            f"preflight blocks the start: {first.message}" + (f" (+{len(plan.blocking) - 1} more)" if len(plan.blocking) > 1 else ""),
            hint=first.hint or "see the preflight above; --force starts anyway",
        )
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if plan.test_gpu:
        typer.echo(f"test GPU: {plan.test_gpu.line()}", err=True)
    if runtime == "docker":
        from launcher.runtime import docker as docker_runtime

        raise typer.Exit(docker_runtime.run(plan, wait_timeout=timeout, restart=restart))
    from launcher.runtime import native

    raise typer.Exit(native.run(plan, wait=wait, timeout=timeout))


def _given(ctx: typer.Context, *names: str) -> set[str]:
    """The options among ``names`` typed on the command line (not left at their default)."""
    # By name: typer may bring its own copy of click, and with it its own ParameterSource.
    return {n for n in names if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"}


def _shown_spec(spec: dict | None) -> dict | None:
    """The container spec as printed: a key given after `--` is masked, as in the text plan (the
    spec's env holds no secret values: those stay in secret_env, names only)."""
    from launcher import redact

    return spec if spec is None else {**spec, "command": redact.argv(spec["command"])}


def _print_plan(plan, as_json: bool, restart: str = "no") -> None:
    from launcher import plan as plans

    if as_json:
        data = plans.to_dict(plan)
        if plan.runtime == "docker":
            data["container"] = _shown_spec(_container_spec(plan, restart))
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(plans.format_plan(plan))
    if plan.nodes:
        typer.echo(plans.format_nodes(plan))
    if plan.runtime == "docker":
        spec = _container_spec(plan, restart)
        if spec is not None:
            from launcher.runtime import docker as docker_runtime

            typer.echo("container")
            typer.echo(docker_runtime.format_container_spec(spec))
    bench = _bench_line(plan)
    if bench:
        typer.echo(bench)


def _bench_line(plan) -> str | None:
    """`launcher bench` for a server that is not where bench looks by default (-- --port 9000, --host)."""
    import inspect

    from launcher.bench.cli import bench
    from launcher.checks import shell_quote
    from launcher.runtime.native import base_url

    url = base_url(plan)
    if url == inspect.signature(bench).parameters["url"].default:
        return None
    return f"bench         launcher bench --recipe {shell_quote(plan.recipe_arg or plan.recipe)} --url {url}"


def _container_spec(plan, restart: str = "no"):
    try:
        from launcher.runtime import docker as docker_runtime
    except ImportError:
        return None
    return docker_runtime.container_spec(plan, restart=restart)


def ps(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable list.")] = False) -> None:
    """List the containers `launcher serve --runtime docker` started (running or not)."""
    from launcher.runtime import docker as docker_runtime

    rows = [docker_runtime.describe(c) for c in docker_runtime.managed(docker_runtime.connect())]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no containers started by the launcher")
        return
    keys = ["name", "status", "role", "restart", "recipe", "vllm", "endpoint", "image"]
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    for row in [{k: k.upper() for k in keys}, *rows]:
        typer.echo("  ".join(row[k].ljust(widths[k]) for k in keys).rstrip())


def stop(
    names: Annotated[Optional[list[str]], typer.Argument(help="Container names or recipe names (launcher ps).")] = None,
    every: Annotated[bool, typer.Option("--all", help="Every container the launcher started.")] = False,
) -> None:
    """Stop and remove containers the launcher started (a --restart one stays stopped)."""
    from launcher.runtime import docker as docker_runtime

    if not names and not every:
        raise LauncherError("name the container(s) to stop, or pass --all", hint="launcher ps lists them")
    stopped = docker_runtime.stop_managed(docker_runtime.connect(), list(names or []), every=every)
    typer.echo(f"stopped and removed: {', '.join(stopped)}" if stopped else "nothing to stop")


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    recipe: Annotated[Optional[str], typer.Option("--recipe", "-r", help="Check one recipe (default: all).")] = None,
    model: Annotated[Optional[Path], typer.Option(help="Inspect a checkpoint folder (with --recipe: as that recipe's target).")] = None,
    vllm_python: Annotated[Optional[str], typer.Option("--vllm-python", envvar="VLLM_PYTHON", help="The python whose vLLM to check (as serve finds it by default).")] = None,
    drafter: Annotated[Optional[Path], typer.Option(help="Check a DFlash drafter folder: what vLLM and z-lab's reference (dflash) need in its config.json.")] = None,
) -> None:
    """Report GPU, driver, versions, WSL/Windows, patch status, docker, and which recipes fit.

    Exits 1 when what was asked about has a problem: the --model or the
    --drafter does not load, the --recipe does not fit, or (none given) no
    recipe fits.
    """
    from launcher import doctor as doc

    report = doc.collect(recipe=recipe, model=model, vllm_python=vllm_python, drafter=drafter)
    typer.echo(json.dumps(report, indent=2) if as_json else doc.format_report(report))
    raise typer.Exit(doc.exit_code(report))


def version() -> None:
    """Print the launcher version."""
    typer.echo(f"launcher {__version__}")


@recipes_app.command("list")
def recipes_list() -> None:
    """List the shipped recipes."""
    from launcher import recipe as recipes

    for name, path in recipes.available().items():
        rec = recipes.load_file(path)
        typer.echo(f"{name:22} {rec.description}")


@recipes_app.command("show")
def recipes_show(name: str) -> None:
    """Print a recipe as validated (defaults filled in), its secrets masked."""
    import yaml

    from launcher import recipe as recipes
    from launcher import redact

    shown = redact.tree(recipes.load(name).model_dump(mode="json"))
    typer.echo(yaml.safe_dump(shown, sort_keys=False).rstrip())


@recipes_app.command("schema")
def recipes_schema() -> None:
    """Print the recipe JSON Schema."""
    from launcher import recipe as recipes

    typer.echo(recipes.schema_json())


@recipes_app.command("validate")
def recipes_validate(files: list[Path]) -> None:
    """Validate recipe files, patch ids included; every error names file, line and field. Exits 2 if any."""
    from launcher import recipe as recipes

    failed = 0
    for path in files:
        try:
            text = recipes.read_text(path)
            rec = recipes.parse_recipe(text, str(path))
            problems = recipes.patch_id_problems(rec, text, str(path), _series_ids)
        except OSError as exc:
            problems = [f"{path}: cannot read: {exc.strerror}"]
        except LauncherError as exc:
            problems = exc.message.splitlines()
        for line in problems:
            typer.echo(f"error: {line}", err=True)
        if problems:
            failed += 1
        else:
            typer.echo(f"{path}: ok ({rec.name})")
    if failed:
        typer.echo(f"{failed} of {len(files)} recipe file(s) invalid", err=True)
        raise typer.Exit(2)


def _series_ids(version: str) -> set[str]:
    from launcher.patching.series import series_for

    ser = series_for(version)
    return {p.id for p in ser.patches} | {p.id for p in getattr(ser, "build_patches", [])}


class _ServeCommand(TyperCommand):
    """Extra words go to vLLM only after ``--``; a stray word before it is an error.

    Without this, ``--dry-run true`` quietly appended ``true`` to vLLM's
    command line (boolean flags take no value).
    """

    def parse_args(self, ctx, args):
        head, tail = (args[: args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
        rest = super().parse_args(ctx, head)
        if ctx.args:
            raise LauncherError(
                f"unexpected argument(s) {' '.join(ctx.args)!r} before `--`",
                hint="launcher flags such as --dry-run, --force and --wait take no value; "
                     "vLLM's own arguments go after `--`")
        ctx.args = tail
        return rest


def register(app: typer.Typer) -> None:
    app.command(cls=_ServeCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(serve)
    app.command()(doctor)
    app.command()(ps)
    app.command()(stop)
    app.command()(version)
    app.add_typer(recipes_app, name="recipes")

