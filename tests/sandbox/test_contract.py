"""The sandbox contract: what every backend must do, run against each registered backend.

A new backend adds its name to BACKENDS here and must pass unchanged. "daytona" runs through the
loopback Daytona API double with the real SDK; "live_daytona" runs the same tests against real
Daytona when DAYTONA_API_KEY is set (marker ``live_daytona``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet_rlm.config import Settings
from fleet_rlm.sandbox.base import Sandbox, SandboxError, SandboxSpec, create_sandbox
from fleet_rlm.volumes import volumes_for
from tests.support import fake_sandbox

pytestmark = pytest.mark.anyio
LIVE = pytest.mark.skipif(
    not os.environ.get("DAYTONA_API_KEY"),
    reason="live Daytona: DAYTONA_API_KEY is not set, so these contract tests did not run against real Daytona",
)
BACKENDS = ["local", "fake", "daytona", pytest.param("live_daytona", marks=[pytest.mark.live_daytona, LIVE])]


def _settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    home = tmp_path / "home"
    if request.param == "daytona":  # the loopback double, driven by the real SDK
        double = request.getfixturevalue("daytona_double")
        return Settings(sandbox="daytona", home=home, daytona_api_url=double.api_url, daytona_api_key="test-key")
    if request.param == "live_daytona":  # real Daytona: DAYTONA_API_KEY / DAYTONA_API_URL from the environment
        return Settings(sandbox="daytona", home=home)
    return Settings(sandbox=request.param, home=home)


class Volume:
    """A volume as the host sees it: a folder for the local backends, the Daytona volume API otherwise."""

    def __init__(self, settings: Settings, tmp_path: Path) -> None:
        self.name = f"v{uuid.uuid4().hex[:8]}"
        self.store = volumes_for(settings) if settings.sandbox == "daytona" else None
        self.path = self.store.ensure(self.name) if self.store else tmp_path / self.name
        if self.store is None:
            self.path.mkdir()

    def write(self, rel: str, text: str) -> None:
        if self.store is None:
            (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.path / rel).write_text(text)
        else:
            self.store.write(self.name, rel, text)

    def read(self, rel: str) -> str:
        return (self.path / rel).read_text() if self.store is None else self.store.read_text(self.name, rel)


@pytest.fixture(params=BACKENDS)
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[..., Sandbox]]:
    fake_sandbox.register()
    settings = _settings(request, tmp_path)
    made: list[Sandbox] = []

    def build(**kwargs: Any) -> Sandbox:
        spec = SandboxSpec(work_dir=tmp_path / f"box{len(made)}", **kwargs)
        box = create_sandbox(settings, spec)
        made.append(box)
        return box

    build.volume = lambda: Volume(settings, tmp_path)  # type: ignore[attr-defined]
    yield build
    for box in made:
        await box.shutdown()


@pytest.mark.slow
async def test_namespace_persists_and_output_and_value_are_both_kept(make) -> None:
    box = make()
    await box.start()
    assert box.alive
    assert (await box.execute("x = 20")).value is None
    result = await box.execute("print('hi')\nx * 2 + 2")
    assert result.stdout == "hi\n" and result.value == "42" and result.data == 42
    assert (await box.execute("{'a': [1, None]}")).data == {"a": [1, None]}
    assert (await box.execute("object()")).data is None  # not plain data: shown by repr only


async def test_errors_come_back_in_the_result(make) -> None:
    box = make()
    syntax = await box.execute("def (")
    assert syntax.error_kind == "syntax" and "SyntaxError" in syntax.error
    raised = await box.execute("print('before')\n1/0")
    assert raised.error_kind == "exception" and "ZeroDivisionError" in raised.error
    assert raised.stdout == "before\n"
    assert (await box.execute("1 + 1")).data == 2


async def test_submit_with_and_without_fields(make) -> None:
    box = make()
    assert (await box.execute("SUBMIT('done')")).final == {"answer": "done"}
    await box.configure_output_fields([{"name": "a"}, {"name": "b"}])
    assert (await box.execute("SUBMIT(1, b=[2])")).final == {"a": 1, "b": [2]}
    missing = await box.execute("SUBMIT(1)")
    assert missing.final is None and "missing" in missing.error


async def test_inputs_as_data(make, tmp_path: Path) -> None:
    box = make()
    await box.set_var("sources", [{"name": "a", "start": 0, "end": 3}])
    await box.put_text("query", "what é?")
    host_file = tmp_path / "staged.txt"
    host_file.write_text("line\n" * 1000, encoding="utf-8")
    await box.put_text("context", host_file)
    result = await box.execute("(query, len(context), sources[0]['end'])")
    assert result.data == ["what é?", 5000, 3]


async def test_a_list_grows_by_appends_and_a_rebound_name_is_refused(make) -> None:
    box = make()
    await box.set_var("history", [{"step": 1}])
    await box.append_var("history", {"step": 2})
    assert (await box.execute("[h['step'] for h in history]")).data == [1, 2]
    await box.execute("history = 'mine now'")
    with pytest.raises(ValueError, match="not a list"):
        await box.append_var("history", {"step": 3})


async def test_input_files_land_in_the_work_folder(make, tmp_path: Path) -> None:
    box = make()
    if isinstance(box, fake_sandbox.FakeSandbox):
        pytest.skip("the in-process fake runs code in the test's own process: its working folder is not the sandbox's")
    picture = tmp_path / "picture.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)  # every byte value, not text
    await box.put_file("inputs/images/0-picture.png", picture)
    code = "import hashlib\nhashlib.sha256(open('inputs/images/0-picture.png', 'rb').read()).hexdigest()"
    result = await box.execute(code)
    assert result.data == hashlib.sha256(picture.read_bytes()).hexdigest()
    refused = [await _refused(box, path, picture) for path in ("/etc/x", "../x", "inputs/../../x", "")]
    assert all(refused), refused


async def _refused(box: Any, path: str, data: Path) -> bool:
    try:
        await box.put_file(path, data)
    except (ValueError, SandboxError):
        return True
    return False


async def test_host_functions_results_errors_and_threads(make) -> None:
    async def shout(text: str) -> str:
        await asyncio.sleep(0.05)
        return text.upper()

    async def fails() -> None:
        raise ValueError("no such thing")

    box = make()
    await box.register_functions({"shout": shout, "fails": fails})
    assert (await box.execute("shout('a')")).data == "A"
    code = "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(8) as p:\n"
    code += "    out = list(p.map(shout, 'abcdefgh'))\nout"
    assert (await box.execute(code)).data == list("ABCDEFGH")
    failed = await box.execute("try:\n    fails()\nexcept RuntimeError as e:\n    print('caught', e)")
    assert "caught" in failed.stdout and "no such thing" in failed.stdout


async def test_a_timeout_interrupts_the_step_and_keeps_the_namespace(make) -> None:
    box = make()
    await box.execute("kept = 'yes'")
    with anyio.fail_after(30):
        result = await box.execute("while True:\n    pass", timeout=1)
    assert result.error_kind == "timeout"
    assert (await box.execute("kept")).data == "yes"


async def test_output_is_capped(make) -> None:
    box = make(output_limit=1000)
    result = await box.execute("print('HEAD')\nfor i in range(5000):\n    print(i)\nprint('TAIL')")
    assert result.stdout.startswith("HEAD\n") and result.stdout.rstrip().endswith("TAIL")
    assert len(result.stdout) < 1200 and "omitted" in result.stdout


async def test_volumes_are_shared_with_the_host(make) -> None:
    vol = make.volume()
    vol.write("memory/in.txt", "from host")
    box = make(volumes={vol.name: vol.path})
    await box.start()
    inside = box.volume_paths[vol.name] + "/memory"
    code = f"open({inside!r} + '/out.txt', 'w').write('from code')\nopen({inside!r} + '/in.txt').read()"
    assert (await box.execute(code)).data == "from host"
    assert vol.read("memory/out.txt") == "from code"


async def test_shutdown_is_final(make) -> None:
    box = make()
    await box.execute("1")
    await box.shutdown()
    await box.shutdown()  # idempotent
    assert not box.alive
    with pytest.raises(SandboxError):
        await box.execute("1")
