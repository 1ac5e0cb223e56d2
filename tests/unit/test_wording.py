"""Messages that said something other than what they meant (issue 57, item 8)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from launcher import recipe as recipes
from launcher.checks import resolve
from launcher.cli import app
from launcher.plan import Request
from launcher.runtime import docker as docker_runtime
from tests.unit.conftest import make_ctx


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_test_gpu_without_a_gpu_reads_as_a_sentence(models):
    plan = resolve(Request("gemma4-moe-dflash", test_gpu=True), make_ctx(None))
    said = [w for w in plan.warnings if w.startswith("--test-gpu")]
    assert said == ["--test-gpu: no GPU was detected, and none but a Hopper (sm_90) can stand in for sm_120"]


def test_models_list_says_a_model_without_a_pinned_hub_repo_is_not_fetched_and_where_it_comes_from(models):
    res = invoke("models", "list")
    rec = recipes.load("gemma4-31b-dflash")
    row = next(line for line in res.output.splitlines() if line.startswith(rec.drafter.name + " "))
    assert f"(models pull does not fetch it; from {rec.drafter.source})" in row
    assert "no hub source" not in res.output


@pytest.mark.parametrize("recipe, only, says", [
    # a bf16 target and a drafter are downloaded as published, not made by `launcher quantize`
    ("gemma4-e4b", "target", "download google/gemma-4-e4b-it from the Hugging Face hub into "),
    ("gemma4-31b-dflash", "drafter", "download z-lab/gemma-4-31B-it-DFlash from the Hugging Face hub into "),
    # a quantized target without a pinned download is made from its bf16 source
    ("gemma4-31b-dflash", "target", "quantize google/gemma-4-31B-it with `launcher quantize` into "),
])
def test_models_pull_says_how_to_get_a_model_it_cannot_fetch(models, recipe, only, says):
    res = invoke("models", "pull", "--recipe", recipe, "--only", only, "--dry-run")
    assert res.exit_code != 0
    hint = next(line for line in res.output.splitlines() if line.startswith("hint: "))
    assert hint.startswith("hint: " + says), hint
    assert ("--model" if only == "target" else "--drafter") in hint
    assert not ("quantize" in hint and only == "drafter")


def test_models_path_prints_the_drafter_too(models):
    rec = recipes.load("gemma4-moe-dflash")
    both = invoke("models", "path", "--recipe", rec.name).output.splitlines()
    assert both == [str(models / rec.target.name), str(models / rec.drafter.name)]
    assert invoke("models", "path", "--recipe", rec.name, "--target").output.splitlines() == both[:1]
    assert invoke("models", "path", "--recipe", rec.name, "--drafter").output.splitlines() == both[1:]
    assert invoke("models", "path", "--recipe", "gemma4-moe").output.splitlines() == both[:1]  # no drafter


def test_build_targets_names_each_version_once():
    from launcher.builder.targets import load

    data = load()
    last = invoke("build", "targets").output.splitlines()[-1]
    assert last.startswith(f"vLLM versions: {data.default_vllm_version} (the default)")
    for version in data.vllm_versions:
        assert last.count(version) == 1, last


def test_the_missing_image_hint_builds_and_never_pulls_an_unpublished_image(models):
    plan = resolve(Request("gemma4-moe-dflash", runtime="docker"), make_ctx(None))
    hint = docker_runtime.image_hint(plan)
    assert "make image-overlay" in hint and "docker pull" not in hint


def test_image_preflight_outside_an_image_is_refused():
    res = invoke("image", "preflight", "--", "--model", "/models/x")
    assert res.exit_code == 2
    assert "not inside a vllm-sm12x image" in res.output and "vllm-sm12x: starting" not in res.output


def test_forcing_modelopt_is_warned_in_a_dry_run_before_the_download(models):
    """The README promises the warning; before the checkpoint is on disk the recipe's format says
    it will be ModelOpt NVFP4."""
    plan = resolve(Request("gemma4-moe-dflash", extra_args=["--quantization", "modelopt"]), make_ctx(None))
    assert not plan.model.exists()
    warned = [r for r in plan.reasons if r.area == "checkpoint" and "--quantization modelopt" in r.message]
    assert len(warned) == 1 and not warned[0].blocking
    quiet = resolve(Request("gemma4-e4b", extra_args=["--quantization", "modelopt"]), make_ctx(None))
    assert not [r for r in quiet.reasons if "--quantization modelopt" in r.message]


def test_a_misspelt_patch_in_a_recipe_file_is_named_with_the_likely_one(models, tmp_path):
    """serve plans a user's recipe file; a patch id with a typo says which id was meant and how to
    find its line (recipes validate), as `recipes validate` itself does."""
    import re

    text = (recipes.available()["gemma4-moe-dflash"]).read_text()
    wrong = re.sub(r"- triton-unified-attention-fully-masked-tile\b", "- triton-unified-attention-fully-masked-tyle", text, count=1)
    assert wrong != text
    path = tmp_path / "mine.yaml"
    path.write_text(wrong.replace("name: gemma4-moe-dflash", "name: mine", 1))
    plan = resolve(Request(str(path), vllm_version="0.21.0"), make_ctx(None))
    said = [r for r in plan.reasons if r.area == "patches" and "masked-tyle" in r.message]
    assert len(said) == 1 and said[0].blocking
    assert said[0].message.endswith("(did you mean triton-unified-attention-fully-masked-tile?)")
    assert "recipes validate" in said[0].hint


def test_an_unknown_profile_lists_the_recipes_own(models):
    res = invoke("serve", "--recipe", "gemma4-e4b", "--profile", "nosuch", "--dry-run")
    assert res.exit_code == 2
    assert "hint: recipe gemma4-e4b has: " in res.output and "dgx-spark-x2" not in res.output
    assert "dgx-spark-x2" in invoke("serve", "--help").output


def test_the_plan_before_the_install_is_the_one_after_it(models):
    """Without vLLM the plan is for the release `launcher install` would install, so that the
    plan `make serve` shows and its hint (launcher install) agree."""
    from launcher import vllm_install

    for name in ("gemma4-moe-dflash", "gemma4-e4b"):
        rec = recipes.load(name)
        before = resolve(Request(name), make_ctx(None))
        chosen = vllm_install.choose_version(rec, None)
        assert before.vllm_version == chosen, name
        assert before.vllm_version_source.startswith("recipe default")
        after = resolve(Request(name), make_ctx(None, vllm=chosen, transformers="5.13.1"))
        assert (after.vllm_version, after.vllm_version_source) == (chosen, "installed")
        assert after.argv == before.argv


def test_a_file_given_as_the_model_is_called_a_file(models, tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 8)
    plan = resolve(Request("gemma4-moe-dflash", model=str(weights)), make_ctx(None))
    [said] = [r for r in plan.reasons if r.area == "checkpoint" and str(weights) in r.message]
    assert said.blocking and "is a file, not a folder" in said.message and "does not exist" not in said.message


def test_two_nodes_without_a_rank_say_which_rank_the_other_takes():
    from launcher import multinode
    from launcher.errors import LauncherError

    with pytest.raises(LauncherError) as info:
        multinode.request(2, None, "10.0.0.1", None, None, None)
    assert info.value.message.endswith("0 on the head (it serves the API), 1 on the other")
