"""pytest options of tests/python: --device cpu|cuda (the GPU variant, ctest python_api_gpu).
With --device cuda and no GPU the session exits 77, which ctest reports as skipped."""
import subprocess

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"],
                     help="device the trainers run on (cuda: bundles for cuda:sm_90)")


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_configure(config):
    config.forge_no_gpu = config.getoption("--device") == "cuda" and not gpu_present()


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
