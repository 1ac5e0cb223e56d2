"""What a test run leaves on the shared Docker daemon (issue 57, item 5).

Each `make test` left two dangling images (the overlay builds that must fail
stop after their first steps, and the classic builder keeps the last good
step's image, untagged), and a run killed before its end left its tags and
containers for good. These tests build small busybox images on the real
daemon, as a run's own, as a killed run's and as a live run's beside it, and
check what is left after the end of a run and after the sweep at the start of
the next.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration import docker_env

pytestmark = pytest.mark.docker

LABEL = docker_env.BASE_NAME_LABEL


@pytest.fixture(scope="module")
def client():
    return docker_env.client()


def _dockerfile(marker: str, base_name: str, fail: bool) -> dict[str, tuple[bytes, int]]:
    # The marker makes every step new content: no cache hit from an earlier run.
    lines = [f"FROM {docker_env.BUSYBOX_IMAGE}", f'LABEL {LABEL}="{base_name}"', f"ENV MARKER={marker}",
             "RUN echo \"$MARKER\" > /marker", "RUN false" if fail else "RUN true"]
    return {"Dockerfile": ("\n".join(lines).encode() + b"\n", 0o644)}


def _dangling(client, base_name: str) -> list:
    return docker_env.images(client, filters={"dangling": True, "label": f"{LABEL}={base_name}"})


def _tags_of(client, run_id: str) -> list[str]:
    return [t for image in docker_env.images(client) for t in image.tags if run_id in t]


def test_a_failed_build_leaves_no_dangling_image(client):
    marker = uuid.uuid4().hex
    base_name = docker_env.run_tag("vllm-sm12x-test/probe", marker[:12])
    with pytest.raises(pytest.fail.Exception):
        docker_env.build_from_files(client, "vllm-sm12x-test/probe-failed", _dockerfile(marker, base_name, fail=True))
    assert _dangling(client, base_name) == []


def test_the_end_of_a_run_leaves_no_tag_container_or_dangling_image_of_it(client, monkeypatch):
    run_id = f"run1-{int(time.time())}-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(docker_env, "RUN_ID", run_id)
    monkeypatch.setattr(docker_env, "_RUN_TAGS", [])
    marker = uuid.uuid4().hex
    base_name = docker_env.run_tag("vllm-sm12x-test/probe", marker[:12])
    tag = docker_env.build_from_files(client, "vllm-sm12x-test/probe", _dockerfile(marker, base_name, fail=False))
    cache = client.images.get(tag).tags
    container = client.containers.create(tag, ["true"])
    # What a build that failed and was not cleaned (interrupted) leaves: an untagged leaf naming the run.
    failed = _dockerfile(marker + "x", base_name, fail=True)
    with pytest.raises(Exception):
        client.images.build(fileobj=docker_env._tar(failed), custom_context=True, rm=True, forcerm=True)
    assert len(_dangling(client, base_name)) == 1
    try:
        docker_env.cleanup_run(client)
        assert _tags_of(client, run_id) == []
        assert client.containers.list(all=True, filters={"id": container.id}) == []
        assert _dangling(client, base_name) == []
        # The content stays, named: the next run's cache, not a dangling image.
        [kept] = [t for t in cache if t.endswith("-cache")]
        assert client.images.get(kept).tags == [kept]
    finally:
        for t in cache:
            if t.endswith("-cache"):
                client.images.remove(t)


def test_the_sweep_removes_a_killed_runs_leftovers_and_never_a_live_runs(client):
    # The sweep lock from the first build to the sweep: a run (or xdist worker) beside this
    # one sweeping meanwhile would take the stand-in killed run's leftovers before this sweep.
    with docker_env.sweep_lock():
        _sweep_a_killed_and_a_live_run(client)


def _sweep_a_killed_and_a_live_run(client):
    now = time.time()
    killed = f"run2-{int(now - docker_env.STALE_AFTER_S - 60)}-{uuid.uuid4().hex[:8]}"
    live = f"run3-{int(now - 60)}-{uuid.uuid4().hex[:8]}"
    made: dict[str, dict] = {}
    for run_id in (killed, live):
        marker = uuid.uuid4().hex
        base_name = f"vllm-sm12x-test/probe:{marker[:12]}-{run_id}"
        image, _ = client.images.build(fileobj=docker_env._tar(_dockerfile(marker, base_name, fail=False)),
                                       custom_context=True, rm=True, forcerm=True, tag=base_name)
        container = client.containers.create(base_name, ["true"])
        with pytest.raises(Exception):
            client.images.build(fileobj=docker_env._tar(_dockerfile(marker + "x", base_name, fail=True)),
                                custom_context=True, rm=True, forcerm=True)
        made[run_id] = {"tag": base_name, "container": container.id}
    try:
        gone = docker_env.sweep_stale_runs(client, now=now, lock=False)
        assert made[killed]["tag"] in gone
        assert _tags_of(client, killed) == [] and _dangling(client, made[killed]["tag"]) == []
        assert client.containers.list(all=True, filters={"id": made[killed]["container"]}) == []
        # The live run (started a minute ago, beside this one) keeps everything.
        assert _tags_of(client, live) == [made[live]["tag"]]
        assert len(_dangling(client, made[live]["tag"])) == 1
        assert client.containers.list(all=True, filters={"id": made[live]["container"]}) != []
    finally:  # the live stand-in's things, by name (a sweep with no age limit would take other runs' too)
        for run_id, things in made.items():
            for container in client.containers.list(all=True, filters={"id": things["container"]}):
                container.remove(force=True)
            for image in _dangling(client, things["tag"]):
                client.images.remove(image.id)
            if _tags_of(client, run_id):
                client.images.remove(things["tag"])
