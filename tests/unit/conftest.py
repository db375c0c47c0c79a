"""Fixtures shared by the unit tests."""

from __future__ import annotations

import importlib.util

import pytest

# the array libraries the sampler's tests run on: numpy, and torch where it is installed
LIBS = ["numpy", "torch"] if importlib.util.find_spec("torch") is not None else ["numpy"]


@pytest.fixture(params=LIBS)
def lib(request: pytest.FixtureRequest) -> str:
    return str(request.param)
