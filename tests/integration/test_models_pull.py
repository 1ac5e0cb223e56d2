"""``launcher models pull|verify|list|path`` for real, through huggingface_hub.

Online tests run against ``fake_hub.FakeHub``: a local HTTP server on
127.0.0.1 that speaks the Hub's download API for tiny repos generated here
(a Gemma-4-shaped ModelOpt NVFP4 target and a DFlash drafter), reached with
``HF_ENDPOINT``. Offline tests use a Hub cache filled by a real
``snapshot_download`` from that server, then run with ``--offline`` /
``HF_HUB_OFFLINE=1`` while asserting that the server saw no request. Never
the internet. The launcher runs as a subprocess, as a user runs it, so the
Hub reads its environment at import exactly as it would there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.fake_hub import FakeHub, Repo
from tests.unit.test_checkpoint import NVFP4_QUANT, gemma4_config, gemma4_tensors, write_safetensors

ROOT = Path(__file__).resolve().parents[2]
TARGET_REPO = "test-org/tiny-gemma4-nvfp4"
DRAFTER_REPO = "test-org/tiny-dflash"
TOKEN = "hf_test_secret_token_value_1234"


def _safetensors_bytes(tmp: Path, tensors: dict) -> bytes:
    path = tmp / "w.safetensors"
    write_safetensors(path, tensors)
    data = path.read_bytes()
    path.unlink()
    return data


def target_repo(tmp: Path, *, per_layer_export: bool = False) -> Repo:
    """A tiny ModelOpt NVFP4 Gemma 4 target. ``per_layer_export``: written the way
    transformers >= 5.15 saves it (global_head_dim only in per_layer_config)."""
    config = gemma4_config(global_head_dim=None) if per_layer_export else gemma4_config()
    if per_layer_export:
        config["text_config"]["per_layer_config"] = {"3": {"head_dim": 512}}
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    weights = _safetensors_bytes(tmp, gemma4_tensors(nvfp4=True))
    return Repo(files={
        "config.json": json.dumps(config).encode(),
        "hf_quant_config.json": json.dumps(NVFP4_QUANT).encode(),
        "model.safetensors": weights,
        "tokenizer.json": b'{"version": "1.0"}',
        "chat_template.jinja": b"{{ messages }}",
        "README.md": b"# not fetched: outside the recipe's allow_patterns\n",
    })


def drafter_repo(tmp: Path) -> Repo:
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 1024,
              "hidden_size": 128, "num_hidden_layers": 1,
              "dflash_config": {"mask_token_id": 1000, "target_layer_ids": [0, 2]}}
    weights = _safetensors_bytes(tmp, {"fc.weight": ("BF16", [128, 256]), "norm.weight": ("BF16", [128])})
    return Repo(files={"config.json": json.dumps(config).encode(), "model.safetensors": weights})


def write_recipe(tmp: Path, target: Repo, *, target_revision: str | None = None) -> Path:
    """The shipped gemma4-moe-dflash recipe pointed at the fake repos: the
    target pinned to its commit, the drafter on a branch marked unverified."""
    data = yaml.safe_load((ROOT / "recipes" / "gemma4-moe-dflash.yaml").read_text())
    data["target"]["hub"] = {"repo": TARGET_REPO, "revision": target_revision or target.commit}
    data["drafter"]["hub"] = {"repo": DRAFTER_REPO, "revision": "main", "unverified": True}
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def launcher(args: list[str], *, tmp: Path, hub_url: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(PYTHONPATH=str(ROOT), MODELS_DIR=str(tmp / "models"), HF_HOME=str(tmp / "hf"),
               HF_ENDPOINT=hub_url, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def hub(tmp_path):
    with FakeHub() as server:
        server.repos[TARGET_REPO] = target_repo(tmp_path)
        server.repos[DRAFTER_REPO] = drafter_repo(tmp_path)
        yield server


def test_pull_fetches_both_at_pinned_and_resolved_revisions_then_verifies(hub, tmp_path):
    target, drafter = hub.repos[TARGET_REPO], hub.repos[DRAFTER_REPO]
    recipe = write_recipe(tmp_path, target)
    proc = launcher(["models", "pull", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    models = tmp_path / "models"
    tdir, ddir = models / "gemma-4-26B-A4B-it-NVFP4", models / "gemma-4-26B-A4B-it-DFlash"
    for name, data in target.files.items():
        if name == "README.md":
            assert not (tdir / name).exists()  # outside allow_patterns
        else:
            assert (tdir / name).read_bytes() == data
    assert (ddir / "model.safetensors").read_bytes() == drafter.files["model.safetensors"]
    # The drafter's branch is unverified: the commit it resolved to is printed and recorded.
    assert f"resolved to commit {drafter.commit}" in proc.stdout
    assert json.loads((ddir / ".launcher-source.json").read_text())["commit"] == drafter.commit
    assert json.loads((tdir / ".launcher-source.json").read_text())["commit"] == target.commit
    # Files were asked for at the pinned commit, never at a branch, for the target.
    assert all(f"/resolve/{target.commit}/" in s.path for s in hub.requests_for("GET", TARGET_REPO + "/resolve"))
    assert "verify target for vLLM 0.21.0: ok" in proc.stdout
    assert "verify drafter for vLLM 0.21.0: ok" in proc.stdout
    assert "ready: launcher serve --recipe gemma4-moe-dflash" in proc.stdout

    # A second pull finds everything in place and downloads nothing.
    before = len(hub.requests_for("GET", "/resolve/"))
    again = launcher(["models", "pull", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert again.returncode == 0, again.stderr
    assert len(hub.requests_for("GET", "/resolve/")) == before
    assert "already has every file" in again.stdout

    # verify and path agree with what serve uses.
    ver = launcher(["models", "verify", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert ver.returncode == 0, ver.stdout + ver.stderr
    path = launcher(["models", "path", "--recipe", str(recipe), "--drafter"], tmp=tmp_path, hub_url=hub.url)
    assert path.stdout.strip() == str(ddir)


def test_a_new_revision_replaces_the_old_files(hub, tmp_path):
    target = hub.repos[TARGET_REPO]
    recipe = write_recipe(tmp_path, target)
    assert launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url).returncode == 0
    old_commit = target.commit
    target.files["tokenizer_config.json"] = b'{"new": true}'
    del target.files["chat_template.jinja"]
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--revision", "main"],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tdir = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    assert target.commit != old_commit
    assert json.loads((tdir / ".launcher-source.json").read_text())["commit"] == target.commit
    assert (tdir / "tokenizer_config.json").read_bytes() == b'{"new": true}'
    assert not (tdir / "chat_template.jinja").exists()


def test_serve_preflight_names_an_interrupted_pull(tmp_path):
    """The Hub's download state without the marker a finished pull writes last."""
    folder = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    (folder / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (folder / ".cache" / "huggingface" / "download" / "ab12.0123.incomplete").write_bytes(b"x" * 10)
    proc = launcher(["serve", "--recipe", "gemma4-moe-dflash", "--dry-run"], tmp=tmp_path, hub_url="http://127.0.0.1:9")
    assert f"checkpoint: {folder}: a download into it was interrupted (1 partial file(s))" in proc.stdout
    assert "(fetch it with: launcher models pull --recipe gemma4-moe-dflash)" in proc.stdout


def test_interrupted_download_resumes_with_a_range_request(hub, tmp_path):
    target = hub.repos[TARGET_REPO]
    # The Hub writes what it received in 10 MB chunks: a shard of 24 MB cut
    # after half leaves at least one chunk on disk to resume from.
    tensors = gemma4_tensors(nvfp4=True)
    tensors["model.language_model.padding.weight"] = ("BF16", [3000, 4000])
    target.files["model.safetensors"] = _safetensors_bytes(tmp_path, tensors)
    hub.cut_once.add(f"{TARGET_REPO}/model.safetensors")
    proc = launcher(["models", "pull", "--recipe", str(write_recipe(tmp_path, target)), "--only", "target"],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    starts = [int(s.headers["range"].split("=")[1].rstrip("-")) for s in hub.requests_for("GET", "model.safetensors")
              if "range" in s.headers]
    assert starts, "the cut download was restarted from zero instead of resumed"
    assert 0 < starts[0] <= len(target.files["model.safetensors"]) // 2
    assert (tmp_path / "models/gemma-4-26B-A4B-it-NVFP4/model.safetensors").read_bytes() == target.files["model.safetensors"]


def test_not_enough_disk_refuses_before_any_byte(hub, tmp_path):
    target = hub.repos[TARGET_REPO]
    target.advertised_sizes["model.safetensors"] = 10**18  # 1 EB: no disk has that
    proc = launcher(["models", "pull", "--recipe", str(write_recipe(tmp_path, target))], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2
    assert "not enough disk space" in proc.stderr
    assert hub.requests_for("GET", "/resolve/") == []
    assert not (tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4").exists()  # refused: nothing left behind


def test_gated_repo_uses_hf_token_and_never_prints_it(hub, tmp_path):
    target = hub.repos[TARGET_REPO]
    target.gated = True
    hub.required_token = TOKEN
    recipe = write_recipe(tmp_path, target)
    denied = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url)
    assert denied.returncode == 2
    assert "is gated" in denied.stderr and "HF_TOKEN" in denied.stderr
    assert not (tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4").exists()
    ok = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url,
                  extra_env={"HF_TOKEN": TOKEN})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "HF_TOKEN from the environment" in ok.stdout
    assert TOKEN not in ok.stdout + ok.stderr + denied.stdout + denied.stderr
    assert any(s.headers.get("authorization") == f"Bearer {TOKEN}" for s in hub.requests_for("GET", "/resolve/"))


@pytest.mark.parametrize("status, code, methods", [
    (403, None, ("HEAD", "GET")),
    (401, "GatedRepo", ("GET",)),
    (403, None, ("GET",)),
    (403, "GatedRepo", ("HEAD", "GET")),
], ids=["403-no-code", "get-only-401-gated", "get-only-403-no-code", "403-gated"])
def test_a_refused_file_request_says_gated_or_private_not_network_or_disk(status, code, methods, hub, tmp_path):
    """Issue 55.13: a gated repo read as "check free space and permissions" (or as an
    unreachable Hub): huggingface_hub wraps the Hub's 403 in LocalEntryNotFoundError."""
    hub.repos[TARGET_REPO].refuse_files = (status, code, methods)
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url,
                    extra_env={"HF_TOKEN": TOKEN})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "gated" in proc.stderr and "HF_TOKEN" in proc.stderr
    assert "free space" not in proc.stderr and "cannot reach" not in proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr


def test_unknown_revision_is_named(hub, tmp_path):
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--revision", "f" * 40],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2
    assert f"has no revision '{'f' * 40}'" in proc.stderr


def test_transformers_515_export_gets_global_head_dim_back(tmp_path):
    """A config saved by transformers >= 5.15 (per_layer_config only) is what
    vLLM 0.21.0 cannot read: the pull repairs it and says so."""
    with FakeHub() as hub:
        hub.repos[TARGET_REPO] = target_repo(tmp_path, per_layer_export=True)
        recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
        proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = json.loads((tmp_path / "models/gemma-4-26B-A4B-it-NVFP4/config.json").read_text())
    assert cfg["text_config"]["global_head_dim"] == 512
    assert "per_layer_config[3].head_dim" in proc.stdout
    assert "verify target for vLLM 0.21.0: ok" in proc.stdout


def test_unreachable_hub_is_one_clear_error(tmp_path):
    recipe = write_recipe(tmp_path, target_repo(tmp_path))
    proc = launcher(["models", "pull", "--recipe", str(recipe)], tmp=tmp_path, hub_url="http://127.0.0.1:9")
    assert proc.returncode == 2
    assert "cannot reach the Hub at http://127.0.0.1:9" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_folder_holding_another_model_is_left_alone(hub, tmp_path):
    mine = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text('{"mine": true}')
    proc = launcher(["models", "pull", "--recipe", str(write_recipe(tmp_path, hub.repos[TARGET_REPO]))],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2
    assert "did not put there" in proc.stderr
    assert json.loads((mine / "config.json").read_text()) == {"mine": True}
    assert hub.seen == []


# ----------------------------------------------------------------------------- offline


def _fill_hub_cache(tmp: Path, hub_url: str, repo: str, revision: str) -> None:
    """What `hf download` leaves in $HF_HOME/hub: a real snapshot_download from the fake Hub."""
    code = f"import huggingface_hub as h; h.snapshot_download({repo!r}, revision={revision!r})"
    env = {**os.environ, "HF_HOME": str(tmp / "hf"), "HF_ENDPOINT": hub_url, "HF_HUB_DISABLE_XET": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=120)


def test_offline_fills_the_folders_from_a_prefilled_hub_cache(hub, tmp_path):
    target, drafter = hub.repos[TARGET_REPO], hub.repos[DRAFTER_REPO]
    recipe = write_recipe(tmp_path, target)
    _fill_hub_cache(tmp_path, hub.url, TARGET_REPO, target.commit)
    _fill_hub_cache(tmp_path, hub.url, DRAFTER_REPO, "main")
    hub.seen.clear()
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--offline"], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hub.seen == []  # not one request
    tdir = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    assert (tdir / "model.safetensors").read_bytes() == target.files["model.safetensors"]
    assert not (tdir / "model.safetensors").is_symlink()  # a container mounting only MODELS_DIR can read it
    assert "from the Hub cache" in proc.stdout
    assert json.loads((tmp_path / "models/gemma-4-26B-A4B-it-DFlash/.launcher-source.json").read_text())["commit"] == drafter.commit


def test_offline_without_cache_says_what_is_missing_and_stays_off_the_network(hub, tmp_path):
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    proc = launcher(["models", "pull", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url,
                    extra_env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert f"offline: {TARGET_REPO}@{hub.repos[TARGET_REPO].commit} (target) is not available" in proc.stderr
    assert "Hub cache" in proc.stderr
    assert hub.seen == []
    assert not (tmp_path / "models").exists()  # a refused pull leaves no MODELS_DIR it made


def test_offline_after_a_pull_names_the_missing_file(hub, tmp_path):
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    assert launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url).returncode == 0
    (tmp_path / "models/gemma-4-26B-A4B-it-NVFP4/model.safetensors").unlink()
    hub.seen.clear()
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--offline"], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2
    assert "model.safetensors (absent)" in proc.stderr
    assert hub.seen == []


# ----------------------------------------------------------------------------- no network at all


def test_dry_run_of_the_shipped_recipe_prints_repos_revisions_sizes_and_folders(tmp_path):
    proc = launcher(["models", "pull", "--recipe", "gemma4-moe-dflash", "--dry-run"], tmp=tmp_path,
                    hub_url="http://127.0.0.1:9")  # nothing listens on the discard port
    assert proc.returncode == 0, proc.stderr
    shipped = yaml.safe_load((ROOT / "recipes" / "gemma4-moe-dflash.yaml").read_text())
    shared = yaml.safe_load((ROOT / "recipes" / "shared" / "models.yaml").read_text())["models"]
    for role in ("target", "drafter"):
        hubsrc = shared[shipped[role]["name"]]["hub"]
        assert hubsrc["repo"] in proc.stdout and hubsrc["revision"] in proc.stdout
        assert str(tmp_path / "models" / shipped[role]["name"]) in proc.stdout
    assert "about 18.8 GB" in proc.stdout and "about 860.0 MB" in proc.stdout


def test_serve_on_missing_models_names_the_pull_command(tmp_path):
    proc = launcher(["serve", "--recipe", "gemma4-moe-dflash", "--dry-run"], tmp=tmp_path, hub_url="http://127.0.0.1:9")
    assert proc.returncode == 0  # a dry run that printed its (blocked) plan
    assert proc.stdout.count("fetch it with: launcher models pull --recipe gemma4-moe-dflash") == 2


def test_a_new_revision_removes_only_files_the_pull_wrote_inside_its_folder(hub, tmp_path):
    """Issue 28.4: the marker listed ../../precious.txt, and the next pull deleted it."""
    target = hub.repos[TARGET_REPO]
    recipe = write_recipe(tmp_path, target)
    assert launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url).returncode == 0
    tdir = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    beside = tmp_path / "models" / "other-model"
    beside.mkdir()
    (beside / "model.safetensors").write_bytes(b"weights")
    (tdir / "notes.txt").write_text("the user's own notes")
    (tdir / "escape").symlink_to(beside)
    marker = json.loads((tdir / ".launcher-source.json").read_text())
    marker["files"].update({"../../precious.txt": 7, str(precious): 7, "../other-model/model.safetensors": 7,
                            "escape/model.safetensors": 7, "notes.txt": None})
    (tdir / ".launcher-source.json").write_text(json.dumps(marker))

    del target.files["chat_template.jinja"]  # a file the first pull did write
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--revision", "main"],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert precious.read_text() == "keep me"
    assert (beside / "model.safetensors").read_bytes() == b"weights"
    assert (tdir / "notes.txt").read_text() == "the user's own notes"
    assert not (tdir / "chat_template.jinja").exists()
    assert "removed chat_template.jinja" in proc.stdout and "precious" not in proc.stdout


def test_verify_with_nothing_pulled_prints_one_line_per_folder_with_its_pull_command(hub, tmp_path):
    """Issue 29.6: ten blocks and "[no record of a pull (checked as found)]" for folders that are not there."""
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    proc = launcher(["models", "verify", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    models = tmp_path / "models"
    assert lines == [
        f"target: {models / 'gemma-4-26B-A4B-it-NVFP4'} is not there; fetch it with: "
        f"launcher models pull --recipe {recipe} --only target",
        f"drafter: {models / 'gemma-4-26B-A4B-it-DFlash'} is not there; fetch it with: "
        f"launcher models pull --recipe {recipe} --only drafter",
    ]
    assert not hub.seen  # verify never touched the Hub


def test_verify_catches_weights_cut_off_or_changed_after_the_pull(hub, tmp_path):
    """Issue 28.7: a safetensors file cut off in its data region (or altered) passed `models verify`."""
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    assert launcher(["models", "pull", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url).returncode == 0
    weights = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4" / "model.safetensors"
    original = weights.read_bytes()

    # Same size, one byte of tensor data changed: only the hash the Hub gave can tell.
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    proc = launcher(["models", "verify", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode != 0
    assert "model.safetensors (sha256" in proc.stderr and "differ from what the Hub sent" in proc.stderr

    # Cut off in the data region, with the marker's size edited to match (the size check alone passes).
    weights.write_bytes(original[: len(original) - 16])
    marker_path = weights.parent / ".launcher-source.json"
    marker = json.loads(marker_path.read_text())
    marker["files"]["model.safetensors"] = len(original) - 16
    marker_path.write_text(json.dumps(marker))
    (weights.parent / ".cache").rename(tmp_path / "hub-state")  # and no Hub record: the header check alone
    proc = launcher(["models", "verify", "--recipe", str(recipe)], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 1
    assert "cut off" in proc.stdout and "model.safetensors" in proc.stdout


@pytest.mark.parametrize("role", ["target", "drafter"], ids=["pinned-commit", "branch"])
def test_online_pull_with_a_warm_hub_cache_fills_the_folder(role, hub, tmp_path):
    """Issue 55.4: after `hf download` (or a `vllm serve`) of the repo, the dry run reported
    will_download=False for every cached file, the pull skipped them, then called the folder incomplete.
    The recipe pins the target to a commit and follows a branch for the drafter."""
    repo_id, folder = {"target": (TARGET_REPO, "gemma-4-26B-A4B-it-NVFP4"),
                       "drafter": (DRAFTER_REPO, "gemma-4-26B-A4B-it-DFlash")}[role]
    repo = hub.repos[repo_id]
    recipe = write_recipe(tmp_path, hub.repos[TARGET_REPO])
    _fill_hub_cache(tmp_path, hub.url, repo_id, repo.commit)
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", role], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dest = tmp_path / "models" / folder
    for name in ("config.json", "model.safetensors"):
        assert (dest / name).read_bytes() == repo.files[name]
    assert json.loads((dest / ".launcher-source.json").read_text())["commit"] == repo.commit


# ----------------------------------------------------------------------------- interrupted and concurrent offline pulls


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a real tmpfs (needs CAP_SYS_ADMIN): MODELS_DIR on another filesystem than the Hub
    cache, so the pull copies instead of hard-linking. Unmounted afterwards."""
    mounted = []

    def mount(where: Path, *options: str) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(["size=256m", *options]), "tmpfs", str(where)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", str(where)], check=True)


# Runs the real CLI; the first file move onto model.safetensors waits there, to be killed.
PAUSED_PULL = """
import os, sys, time, pathlib
real = pathlib.Path.replace
def replace(self, target):
    if pathlib.Path(target).name == "model.safetensors":
        pathlib.Path(os.environ["PAUSED"]).write_text("paused")
        time.sleep(120)
    return real(self, target)
pathlib.Path.replace = replace
from launcher.cli import main
sys.argv = ["launcher"] + sys.argv[1:]
main()
"""


def _env(tmp: Path, hub_url: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(PYTHONPATH=str(ROOT), MODELS_DIR=str(tmp / "models"), HF_HOME=str(tmp / "hf"),
               HF_ENDPOINT=hub_url, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1", **extra)
    return env


def test_a_killed_offline_pull_resumes_from_its_own_partial_copy(hub, tmp_path, tmpfs):
    """Issue 55.5: SIGKILL mid-copy left config.json and model.safetensors.part without a marker,
    and the next pull refused the folder as a stranger's."""
    import signal
    import time

    target = hub.repos[TARGET_REPO]
    recipe = write_recipe(tmp_path, target)
    _fill_hub_cache(tmp_path, hub.url, TARGET_REPO, target.commit)
    hub.seen.clear()
    tmpfs(tmp_path / "models")
    paused = tmp_path / "paused"
    args = ["models", "pull", "--recipe", str(recipe), "--only", "target", "--offline", "--no-verify"]
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_PULL, *args], env=_env(tmp_path, hub.url, PAUSED=str(paused)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not paused.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    tdir = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    assert not (tdir / "model.safetensors").exists() and not (tdir / ".launcher-source.json").exists()
    # What a kill mid-copy leaves: the first half of the weights under a temporary name.
    parts = [p for p in tdir.iterdir() if p.name.startswith("model.safetensors.") and ".part" in p.name]
    assert len(parts) == 1, sorted(p.name for p in tdir.iterdir())
    weights = target.files["model.safetensors"]
    parts[0].write_bytes(weights[: len(weights) // 2])
    # serve's preflight names the interrupted pull, as it does an interrupted online one
    preflight = launcher(["serve", "--recipe", str(recipe), "--dry-run"], tmp=tmp_path, hub_url=hub.url)
    assert f"checkpoint: {tdir}: a download into it was interrupted (1 partial file(s))" in preflight.stdout
    listed = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--dry-run"],
                      tmp=tmp_path, hub_url=hub.url)
    assert f"[an interrupted pull of {TARGET_REPO}: `launcher models pull` resumes it]" in listed.stdout

    again = launcher(args, tmp=tmp_path, hub_url=hub.url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tdir / "model.safetensors").read_bytes() == weights
    assert json.loads((tdir / ".launcher-source.json").read_text())["commit"] == target.commit
    assert sorted(p.name for p in tdir.iterdir() if ".part" in p.name or "pulling" in p.name) == []
    assert hub.seen == []  # offline throughout


def test_concurrent_offline_pulls_into_one_folder_all_succeed(hub, tmp_path, tmpfs):
    """Issue 55.5: 6-8 offline pulls at once into one folder raced on a fixed .part name
    (tracebacks, a truncated model.safetensors, then a wedged folder)."""
    target = hub.repos[TARGET_REPO]
    big = dict(target.files)
    big["model.safetensors"] = target.files["model.safetensors"] + b" " * (24 << 20)  # long enough to overlap
    hub.repos[TARGET_REPO] = target = type(target)(files=big)
    recipe = write_recipe(tmp_path, target)
    _fill_hub_cache(tmp_path, hub.url, TARGET_REPO, target.commit)
    tmpfs(tmp_path / "models")
    args = ["models", "pull", "--recipe", str(recipe), "--only", "target", "--offline", "--no-verify"]
    tdir = tmp_path / "models" / "gemma-4-26B-A4B-it-NVFP4"
    for _round in range(2):
        procs = [subprocess.Popen([sys.executable, "-m", "launcher", *args], env=_env(tmp_path, hub.url),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        assert [rc for rc, _, _ in results] == [0] * 6, [err for _, _, err in results]
        assert (tdir / "model.safetensors").read_bytes() == big["model.safetensors"]
        assert [p.name for p in tdir.iterdir() if ".part" in p.name] == []
        for p in list(tdir.iterdir()):  # empty it for the next round
            p.unlink() if p.is_file() else None


def test_an_offline_pull_into_a_read_only_models_dir_is_one_error(hub, tmp_path, tmpfs):
    target = hub.repos[TARGET_REPO]
    recipe = write_recipe(tmp_path, target)
    _fill_hub_cache(tmp_path, hub.url, TARGET_REPO, target.commit)
    tmpfs(tmp_path / "models", "ro")
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target", "--offline"],
                    tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Read-only file system" in proc.stderr and str(tmp_path / "models") in proc.stderr


def test_a_hub_file_name_leaving_the_folder_is_one_error(hub, tmp_path):
    """Issue 55.8: a listed name with ../ gave a traceback; nothing may land outside the folder.

    Online only: huggingface_hub refuses to put such a name in its cache, so an offline pull never sees one."""
    target = hub.repos[TARGET_REPO]
    evil = dict(target.files)
    evil["sub/../../escape.json"] = b"{}"
    hub.repos[TARGET_REPO] = target = type(target)(files=evil)
    recipe = write_recipe(tmp_path, target)
    data = yaml.safe_load(recipe.read_text())
    data["target"]["hub"]["allow_patterns"] = ["*.json", "*.safetensors", "**/*.json"]
    recipe.write_text(yaml.safe_dump(data))
    proc = launcher(["models", "pull", "--recipe", str(recipe), "--only", "target"], tmp=tmp_path, hub_url=hub.url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "sub/../../escape.json" in proc.stderr
    assert not (tmp_path / "models" / "escape.json").exists() and not (tmp_path / "escape.json").exists()

