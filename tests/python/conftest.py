"""pytest options of tests/python:
  --device cpu|cuda      the GPU variant (ctest python_api_gpu): cuda:sm_90 bundles trained on
                         the GPU; without a GPU the session exits 77 (ctest: skipped)
  --bundles DIR          load the tests' bundles from DIR (compiled there before), for GPU
                         machines without forgec; tests that call forgec themselves skip
                         where it is missing
  --compile-only         with --bundles: only compile the bundles into DIR (tests/gpu/suite.sh)
"""
import os
import subprocess

import pytest

import forge


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"],
                     help="device the trainers run on (cuda: bundles for cuda:sm_90)")
    parser.addoption("--bundles", default=None, help="directory of the tests' bundles")
    parser.addoption("--compile-only", action="store_true",
                     help="compile the bundles into --bundles and run nothing")


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_configure(config):
    config.forge_no_gpu = (config.getoption("--device") == "cuda" and
                           not config.getoption("--compile-only") and not gpu_present())


def pytest_collection_modifyitems(config, items):
    if config.forge_no_gpu:
        skip = pytest.mark.skip(reason="no GPU (nvidia-smi -L failed)")
        for item in items:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    if session.config.forge_no_gpu:
        session.exitstatus = 77


@pytest.fixture(scope="session")
def device(request):
    return request.config.getoption("--device")


@pytest.fixture(scope="session")
def target(device):
    return "cuda:sm_90" if device == "cuda" else "cpu"


class Bundles:
    """The tests' bundles by tag: compiled with forge.compile, or loaded from --bundles."""

    def __init__(self, config, target):
        self.dir = config.getoption("--bundles")
        self.compile_only = config.getoption("--compile-only")
        self.target = target
        self.cache = {}

    def get(self, tag, model, **options):
        if tag not in self.cache:
            path = os.path.join(self.dir, f"{tag}.forge") if self.dir else None
            if path and os.path.exists(path) and not self.compile_only:
                self.cache[tag] = forge.Bundle.load(path)
            else:
                b = forge.compile(model, target=self.target, **options)
                if path:
                    os.makedirs(self.dir, exist_ok=True)
                    b.save(path)
                self.cache[tag] = b
        return self.cache[tag]

    def ready(self):
        """Called by a test once it has its bundles: --compile-only stops it there."""
        if self.compile_only:
            pytest.skip("compile-only")


@pytest.fixture(scope="session")
def bundles(request, target):
    return Bundles(request.config, target)


@pytest.fixture
def forgec(bundles):
    """Tests that run forgec themselves; skipped where there is none (a GPU machine with
    bundles compiled elsewhere) and when only compiling."""
    bundles.ready()
    try:
        return forge.forgec_path()
    except forge.ForgeError as e:
        pytest.skip(str(e))
