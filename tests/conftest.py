"""Fixtures shared by the operator's tests against the emulated API server.

``api`` is an HTTP client of the emulator with the built-in resources, the
DLJob resource, two 4-GPU nodes and a 5 kW budget (``operator_cases.seed``);
``kubeconfig`` is a kubeconfig file pointing at it, as a user would write one;
``kube`` is the operator's ``Kube`` client of the emulator with the built-ins and the
DLJob resource (nothing seeded).
Test modules that need another cluster define their own ``api``.

How the tests split over xdist's workers: ``support.ci_order``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import kubernetes
import pytest
from hypothesis import settings
from operator_cases import seed
from powerflow.operator.kube import Kube
from support.ci_order import (  # noqa: F401  (pytest hooks)
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_terminal_summary,
    pytest_testnodedown,
    pytest_xdist_make_scheduler,
)
from support.kube_emulator import KubeEmulator
from support.operator_harness import write_kubeconfig

from powerflow.core import contract

# Seeded randomness: every hypothesis test draws the same examples on every run, so CI
# never turns red by chance and a failure found stays found (keep it as an ``@example``).
# ``HYPOTHESIS_PROFILE=explore`` draws new examples, to look for more.
settings.register_profile("seeded", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        await seed(client)
        yield client


@pytest.fixture
def kubeconfig(kmock: KubeEmulator, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))


@pytest.fixture
async def kube(kmock: KubeEmulator) -> AsyncIterator[Kube]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url)))
    try:
        yield Kube(api, None)
    finally:
        api.close()


@pytest.fixture(scope="session")
def compiled_placement() -> None:
    """The placement kernel compiled (``placement_kernels.place``) before a test times
    anything: with a cold numba cache its first call compiles for seconds, which a
    hypothesis strategy that places (``test_placement.scenarios``) would count as slow
    input generation."""
    from powerflow.core.gpus import A100
    from powerflow.core.policy.placement import place_columns
    from powerflow.core.policy.snapshot import Node

    place_columns([Node("n0", 2, A100)], ["a"], [1], [()], [True])
