"""A wheel built from the tracked files carries everything the installed agent reads besides its modules: the page's
templates, scripts and vendored libraries, the Grafana and Prometheus files, the systemd unit. `pip install .` (not
only the editable install the tests use) must give a working status page; and setuptools builds it without its
"package is absent from the packages configuration" warnings, which announce that data folders are about to be
dropped from wheels."""

import functools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_layers import OURS

REPO = Path(__file__).resolve().parent.parent
# Folders whose every tracked file an installed agent reads at run time.
DATA = ("dashboards/templates", "dashboards/static", "dashboards/grafana", "dashboards/prometheus", "agent/service")


@functools.cache
def tracked() -> tuple[str, ...]:
    return tuple(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[set[str], str]:
    # A copy of the tracked files only: a build in the checkout would reuse its build/ folder, stale or not.
    source = tmp_path_factory.mktemp("source")
    for name in tracked():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("infersight-*.whl")
    with zipfile.ZipFile(built) as archive:
        return set(archive.namelist()), done.stdout + done.stderr


def test_the_wheel_carries_every_data_file_the_agent_reads(wheel):
    names, _ = wheel
    wanted = {name for name in tracked() if name.startswith(DATA)}
    assert len(wanted) >= 20  # the page's templates, scripts and vendored libraries at least
    assert wanted - names == set()


def test_the_wheel_carries_every_module_and_no_test(wheel):
    names, _ = wheel
    modules = {name for name in tracked() if name.endswith(".py") and name.split("/")[0] in OURS}
    assert modules - names == set()
    assert not any(name.startswith("tests/") for name in names)


def test_setuptools_builds_it_without_data_folder_warnings(wheel):
    _, log = wheel
    assert "is absent from the `packages` configuration" not in log
