"""Integration fixtures: the docker images this test run tagged go at its end."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _remove_this_runs_images():
    """Tags carry the run's id (docker_env.RUN_ID), so a run beside this one never
    sees them; removing them, the containers on them and what failed builds left
    keeps the daemon from filling up, run after run (docker_env.cleanup_run)."""
    yield
    from tests.integration import docker_env

    docker_env.cleanup_run()
