"""Fixtures for tae_driver tests: a backend harness per backend kind (conformance suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.tae_driver.harness import BACKEND_KINDS, BackendHarness


@pytest.fixture(params=BACKEND_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> BackendHarness:
    return BackendHarness(kind=request.param, dir_path=tmp_path / "wal")
