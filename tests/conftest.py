"""Shared fixtures: an isolated FLEET_HOME, the scripted LM server and its needle-in-a-file scenario."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["FLEET_NO_KEYRING"] = "1"  # tests never touch the developer's keyring

from tests.support import prereqs
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS

# Hypothesis fails an example that takes over 200 ms: a clock in disguise, which a machine whose cores
# other work shares crosses (a masking example took 340 ms under a CPU hog). Properties, not speed.
hypothesis_settings.register_profile("fleet", deadline=None)
hypothesis_settings.load_profile("fleet")


def pytest_configure(config: pytest.Config) -> None:
    """On a machine that lacks a piece the suite needs, root installs it before any test runs (the
    README's test command alone then passes on a fresh Debian machine); anyone else is told the one
    line to run, and the tests that need the piece skip (fail in CI)."""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return  # xdist workers: the controller has done it
    absent = prereqs.missing()
    if not absent:
        return
    if os.geteuid() == 0 and not os.environ.get("FLEET_NO_SETUP"):
        print(f"installing what the tests need ({', '.join(absent)}) with {prereqs.SETUP} ...", file=sys.stderr)
        subprocess.run([str(prereqs.SETUP)], check=True)
    else:
        needs = "the tests that need them skip (fail in CI or as root)"
        print(f"missing {', '.join(absent)}: {needs}; {prereqs.how_to_install()}", file=sys.stderr)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Most of a test's time is spent waiting on a subprocess, a server or a scripted model's
    latency, so twice as many workers as cores keeps the cores busy."""
    return 2 * (os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` each test runs on whichever worker is free, except tests that share
    one of our module- or session-scoped fixtures (a browser, a served app, the Daytona double) or an
    ``xdist_group`` marker: they stay on one worker, so the fixture is built once. The slow single
    tests are sent out before the quick ones, so the last minute is not one soak on one worker."""
    grouping = bool(getattr(config, "workerinput", None)) and config.getvalue("loadgroup")
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = [d[-1] for d in fixtures.name2fixturedefs.values()] if fixtures else []
        if any(d.scope != "function" and d.func.__module__.startswith("tests.") for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(config.rootpath).as_posix()))
        groups = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group")})
        if grouping and groups:
            _put_in_group(item, "_".join(groups))
    if grouping:  # xdist sends groups out largest first, then the rest in this order: slow ones first
        scope = {item: item.nodeid.rpartition("@")[2] for item in items}  # as xdist's loadgroup reads it
        slow = {scope[item] for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: scope[item] not in slow)  # stable: a group's tests keep their order


def _put_in_group(item: pytest.Item, group: str) -> None:
    """The worker reports ``nodeid@group`` and the controller schedules a group's tests on one worker.
    xdist 3.8 writes that suffix to ``item._nodeid``, which pytest 9 no longer reads (the id is a
    structured ``NodeId`` in ``item._id``), so without this no group ever formed."""
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def oracle() -> Iterator[OracleLM]:
    with OracleLM() as lm:
        yield lm


@pytest.fixture
def needle(oracle: OracleLM) -> OracleLM:
    """The oracle finding the secret code in a file, for questions that mention "secret code"."""
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    return oracle


@pytest.fixture
def fleet_env(tmp_path: Path, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing the runtime at the oracle and a fresh FLEET_HOME."""
    env = {
        "FLEET_HOME": str(tmp_path / "home"),
        "FLEET_LM_MODEL": "openai/oracle",
        "FLEET_LM_API_BASE": oracle.base_url,
        "FLEET_LM_API_KEY": "sk-test-oracle-0000",
        "FLEET_LM_RETRIES": "0",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return env


@pytest.fixture
def ctrl_c_reaches_children() -> Iterator[None]:
    """Children start with SIGINT's default disposition, as a terminal's Ctrl-C finds them. A shell
    that runs the suite in the background (``cmd &`` without job control) makes pytest ignore
    SIGINT, every child inherits that, and asyncio then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
