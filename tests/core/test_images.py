"""Images in sub-calls: ``llm_query(prompt, images=[...])`` and ``llm_query_batched(prompts, images=[[...], ...])``
send a context's image files (by their name in ``sources``) or bytes the code made to the sub model as
image content parts; the root prompt never carries pixels (docs/inputs.md).

Runs go through the engine and the scripted model server, which decodes each image part it receives
(tests/support/oracle_lm.py), so the mime type and the bytes are checked where the model would see them.
The wire tests use the real sandbox (bytes cross its host-call bridge); the host's own checks (caps,
names) use the in-process one."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from dspy.clients.model_metadata import model_info

from fleet_rlm.core import context, images, lm, tape
from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox import base, worker
from fleet_rlm.types import RunRequest
from tests.support import documents as make
from tests.support import fake_sandbox
from tests.support.oracle_lm import Image, OracleLM, Scenario

pytestmark = pytest.mark.anyio

RED = make.png(4, 3, (200, 30, 30))
BLUE = make.png(5, 5, (20, 40, 220))
COLOURS = {hashlib.sha256(RED).hexdigest(): "red", hashlib.sha256(BLUE).hexdigest(): "blue"}
MB = 1024 * 1024


def colour_of(prompt: str, images: list[Image]) -> str:
    """The scripted vision model: names each image's colour by its bytes (only PNGs it was shown)."""
    return " + ".join(
        COLOURS.get(hashlib.sha256(i.data).hexdigest(), "unknown") if i.mime == "image/png" else f"not png: {i.mime}"
        for i in images
    )


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "local")


def pictures(root: Path) -> Path:
    return make.write(root, {"a_red.png": RED, "b_blue.png": BLUE, "notes.txt": "Two pictures of one colour each."})


def sub_images(oracle: OracleLM) -> list[list[Image]]:
    return [r.images for r in oracle.requests("sub")]


async def test_a_context_image_reaches_the_sub_model_as_an_image_part(
    fleet_env: dict, oracle: OracleLM, real: None, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    steps = [
        "imgs = [s for s in sources if s.get('kind') == 'image']\n"
        "print([(s['name'], s['mime'], s['bytes']) for s in imgs])",
        "answers = [llm_query('what colour?', images=[s['name']]) for s in imgs]\nSUBMIT(' / '.join(answers))",
    ]
    oracle.add(Scenario("colours", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("colours: what are the pictures?", context_paths=[str(folder)]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "red / blue"
    # The server got each file's own bytes as a PNG part, one per call, beside the prompt's text.
    assert sub_images(oracle) == [[Image("image/png", RED)], [Image("image/png", BLUE)]]
    assert all("what colour?" in str(r.messages) for r in oracle.requests("sub"))
    # The root model saw the images listed, and how to send them, never their pixels.
    roots = [str(r.messages) for r in oracle.requests("root")]
    assert "`images` is a list of up to 8 images" in roots[0]  # the REPL's functions, as documented to it
    assert "images: 2 in `sources`" in roots[0] and '"kind": "image"' in roots[0]  # the opening observation
    encoded = [base64.b64encode(png).decode() for png in (RED, BLUE)]
    assert not any(e in text for e in encoded for text in roots)
    assert all(not r.images for r in oracle.requests("root"))
    # Each call's event counts its images and bytes (never the pixels); the provider's tokens include them.
    subs = [e["data"] for e in events if e["kind"] == "subcall.finished"]
    assert [(s["images"], s["image_bytes"]) for s in subs] == [(1, len(RED)), (1, len(BLUE))]
    assert all(s["prompt_tokens"] >= oracle.state.image_tokens for s in subs)
    assert not any(e in str(events) for e in encoded)
    assert result.usage["total"]["prompt_tokens"] >= 2 * oracle.state.image_tokens


async def test_bytes_the_code_made_cross_the_sandbox_bridge(
    fleet_env: dict, oracle: OracleLM, real: None, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    jpeg = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40  # a JPEG by its first bytes
    steps = [
        f"made = bytes.fromhex({BLUE.hex()!r})\n"
        f"jpeg = bytearray.fromhex({jpeg.hex()!r})\n"
        "one = llm_query('what colour?', images=[made])\n"
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        "both = llm_query_batched(['first?', 'second?', 'third?'], images=[[red, made], [], [jpeg]])\n"
        "SUBMIT(one + ' | ' + ' | '.join(both))",
    ]
    oracle.add(Scenario("made", steps, see=colour_of, sub=lambda prompt: "no image"))
    async with Engine() as engine:
        result = await engine.run(RunRequest("made: colours of made bytes", context_paths=[str(folder)]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "blue | red + blue | no image | not png: image/jpeg"
    expected = [[Image("image/png", BLUE)], [Image("image/png", RED), Image("image/png", BLUE)], [],
                [Image("image/jpeg", bytes(jpeg))]]  # fmt: skip
    assert sorted(sub_images(oracle), key=repr) == sorted(expected, key=repr)  # a batch's calls run concurrently
    subs = sorted((e["data"].get("images", 0), e["data"].get("image_bytes", 0)) for e in events
                  if e["kind"] == "subcall.finished")  # fmt: skip
    assert subs == sorted([(1, len(BLUE)), (2, len(RED) + len(BLUE)), (0, 0), (1, len(jpeg))])


async def test_the_caps_and_wrong_items_are_clear_errors_and_nothing_is_sent(
    fleet_env: dict, oracle: OracleLM, in_process: None, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    png_header = RED[:32]
    steps = [
        "errors = []\n"
        "def attempt(fn, *args, **kwargs):\n"
        "    try:\n        fn(*args, **kwargs)\n        errors.append('sent')\n"
        "    except Exception as e:\n        errors.append(type(e).__name__ + ': ' + str(e))\n"
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        f"head = bytes.fromhex({png_header.hex()!r})\n"
        "attempt(llm_query, 'many?', images=[red] * 9)\n"
        f"attempt(llm_query, 'huge?', images=[head + bytes({21 * MB})])\n"
        f"attempt(llm_query, 'too much?', images=[head + bytes({15 * MB})] * 3)\n"
        "attempt(llm_query, 'text?', images=[b'just some text'])\n"
        "attempt(llm_query, 'who?', images=['no/such.png'])\n"
        "attempt(llm_query, 'notes?', images=[next(s['name'] for s in sources if s['name'].endswith('notes.txt'))])\n"
        "attempt(llm_query, 'number?', images=[42])\n"
        "attempt(llm_query, 'flat?', images=red)\n"
        "attempt(llm_query_batched, ['a?', 'b?'], images=[[red]])\n"
        "print(llm_query_batched(['a?', 'b?'], images=[[red] * 9, [red]]))\n"
        "SUBMIT('\\n'.join(errors))",
    ]
    oracle.add(Scenario("caps", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("caps: try them", context_paths=[str(folder)]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    lines = (result.answer or "").splitlines()  # host errors reach the code as RuntimeError("ValueError: ...")
    assert len(lines) == 9, lines
    many, huge, much, text, who, notes, number, flat, batch = lines
    assert "ValueError: " in many and "9 images" in many and "limit of 8" in many
    assert "ValueError: " in huge and "20 MB" in huge and "images[0]" in huge
    assert "ValueError: " in much and "40 MB" in much
    assert "ValueError: " in text and "not a PNG, JPEG, GIF or WebP image" in text
    assert "ValueError: " in who and "no/such.png" in who and "a_red.png" in who  # names the images there are
    assert "ValueError: " in notes and "not an image" in notes
    assert "TypeError: " in number and "int" in number
    assert "TypeError: " in flat and "list" in flat
    assert "ValueError: " in batch and "one list of images per prompt" in batch
    # In a batch, a slot over a cap fails alone; the other one is sent.
    printed = next(e["data"]["output"] for e in events if e["kind"] == "code.executed")
    assert "[ERROR]" in printed and "limit of 8" in printed and "red" in printed
    assert sub_images(oracle) == [[Image("image/png", RED)]]


async def test_a_sub_model_without_vision_is_an_error_naming_the_setting(
    fleet_env: dict, oracle: OracleLM, in_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEET_SUB_LM_MODEL", "openai/gpt-3.5-turbo")  # LiteLLM's model map: no vision
    oracle.state.models += ("gpt-3.5-turbo",)
    folder = pictures(tmp_path / "pics")
    steps = [
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        "try:\n    llm_query('what colour?', images=[red])\nexcept RuntimeError as e:\n    error = str(e)\n"
        "SUBMIT(error + ' || ' + llm_query('The secret code is K9'))",
    ]
    oracle.add(Scenario("blind", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("blind: what colour?", context_paths=[str(folder)]))
    assert result.status == "succeeded", result.error
    error, text_answer = (result.answer or "").split(" || ")
    assert "openai/gpt-3.5-turbo" in error and "FLEET_SUB_LM_MODEL" in error and "vision" in error
    assert text_answer == "K9"  # the same model still answers text
    assert sub_images(oracle) == [[]]  # the image call was never sent


async def test_a_model_litellm_does_not_know_is_asked_and_its_refusal_is_clear(
    fleet_env: dict, oracle: OracleLM, in_process: None, tmp_path: Path
) -> None:
    oracle.state.refuse_images = True  # openai/oracle is not in LiteLLM's map: the server has the last word
    folder = pictures(tmp_path / "pics")
    steps = [
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        "try:\n    llm_query('what colour?', images=[red])\nexcept RuntimeError as e:\n    SUBMIT(str(e))",
    ]
    oracle.add(Scenario("refused", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("refused: what colour?", context_paths=[str(folder)]))
    assert result.status == "succeeded", result.error
    assert "does not support image input" in (result.answer or "")  # the provider's words
    assert "FLEET_SUB_LM_MODEL" in (result.answer or "") and "1 image" in (result.answer or "")
    assert sub_images(oracle) == [[Image("image/png", RED)]]


async def test_a_recorded_image_call_replays_without_a_model(
    fleet_env: dict, real: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    steps = [
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        f"made = bytes.fromhex({BLUE.hex()!r})\n"
        "one = llm_query('what colour?', images=[red])\n"
        "two = llm_query_batched(['and this?', 'both?'], images=[[made], [red, made]])\n"
        "SUBMIT(one + ' / ' + ' / '.join(two))",
    ]
    with OracleLM(Scenario("replayed", steps, see=colour_of)) as oracle:
        monkeypatch.setenv("FLEET_LM_API_BASE", oracle.base_url)
        async with Engine() as engine:
            source = await engine.run(RunRequest("replayed: colours", context_paths=[str(folder)]))
        assert source.status == "succeeded", source.error
        assert source.answer == "red / blue / red + blue"
        assert len(oracle.requests("sub")) == 3
    # The server is stopped: a model call would fail, and none may be made.
    async with Engine() as engine:
        replay_id = await engine.replay(source.run_id)
        result = await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
        events = engine.events(replay_id)
    assert result.status == "succeeded", result.error
    assert result.answer == source.answer
    assert report.diverged is False, report
    subs = [e["data"] for e in events if e["kind"] == "subcall.finished"]
    assert len(subs) == 3 and all(s.get("replayed") and not s.get("error") for s in subs)
    assert result.usage["total"]["calls"] == 0
    # What the run kept (store, record) holds no pixels: the calls were keyed by the images' digests.
    home = Path(fleet_env["FLEET_HOME"])
    encoded = [base64.b64encode(png).decode().encode() for png in (RED, BLUE)]
    for path in home.rglob("*"):
        if path.is_file() and path.suffix != ".png":
            data = path.read_bytes()
            assert not any(e in data for e in encoded), path


async def test_a_changed_image_is_a_replay_divergence(
    fleet_env: dict, oracle: OracleLM, in_process: None, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    steps = [
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        "SUBMIT(llm_query('what colour?', images=[red]))",
    ]
    oracle.add(Scenario("changed", steps, see=colour_of))
    async with Engine() as engine:
        source = await engine.run(RunRequest("changed: colour", context_paths=[str(folder)]))
        assert source.answer == "red"
        (folder / "a_red.png").write_bytes(BLUE)  # same name, other pixels
        result = await engine.wait(await engine.replay(source.run_id))
        report = engine.workspace.replay_report(result.run_id)
    assert result.status == "succeeded", result.error
    assert report.diverged is True and report.first_divergence is not None
    assert len(oracle.requests("sub")) == 1  # still answered from the record, not asked again


async def test_a_child_rlm_has_no_images_of_its_own_but_may_send_bytes(
    fleet_env: dict, oracle: OracleLM, in_process: None, tmp_path: Path
) -> None:
    folder = pictures(tmp_path / "pics")
    root = [
        "red = next(s['name'] for s in sources if s['name'].endswith('a_red.png'))\n"
        "SUBMIT(rlm_query('child look ' + red, context='only text'))",
    ]
    child = [
        "name = query.split(' ', 2)[2]\n"
        "try:\n    llm_query('what colour?', images=[name])\nexcept RuntimeError as e:\n    refused = str(e)\n"
        f"SUBMIT(refused + ' || ' + llm_query('what colour?', images=[bytes.fromhex({BLUE.hex()!r})]))",
    ]
    oracle.add(Scenario("parent asks", root, see=colour_of))
    oracle.add(Scenario("child look", child, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("parent asks: colour", context_paths=[str(folder)]))
    assert result.status == "succeeded", result.error
    refused, seen = (result.answer or "").split(" || ")
    assert "no image named" in refused and "has no images" in refused and "child RLM" in refused
    assert seen == "blue"


@pytest.fixture
def on_daytona(fleet_env: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Runs sandboxed on the Daytona API double, whose REPL is the shim over sandbox/worker.py."""
    from fleet_rlm.sandbox.local import detect_isolation
    from tests.support.daytona_api import DoubleThread

    if detect_isolation()[0] != "bwrap":
        pytest.skip(f"the Daytona double needs bubblewrap, unusable here: {detect_isolation()[1]}")
    with DoubleThread(tmp_path / "daytona") as double:
        for key, value in {"FLEET_SANDBOX": "daytona", "DAYTONA_API_URL": double.api_url,
                           "DAYTONA_API_KEY": "test-key"}.items():  # fmt: skip
            monkeypatch.setenv(key, value)
        yield


async def test_bytes_cross_the_daytona_bridge_too(
    fleet_env: dict, oracle: OracleLM, on_daytona: None, tmp_path: Path
) -> None:
    steps = [
        f"made = bytes.fromhex({RED.hex()!r})\n"
        "SUBMIT(llm_query('what colour?', images=[made]) + ' / ' + llm_query_batched(['and?'], images=[[made]])[0])",
    ]
    oracle.add(Scenario("remote", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("remote: colour", context_text=["x"]))
    assert result.status == "succeeded", result.error
    assert result.answer == "red / red"
    assert sub_images(oracle) == [[Image("image/png", RED)]] * 2


@pytest.mark.parametrize("sub_model", ["openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5"])
async def test_a_vision_model_is_billed_for_the_images_in_its_own_wire_format(
    fleet_env: dict, oracle: OracleLM, in_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sub_model: str
) -> None:
    monkeypatch.setenv("FLEET_SUB_LM_MODEL", sub_model)  # priced in LiteLLM's map, with vision; served by the oracle
    provider, _, name = sub_model.partition("/")
    oracle.state.models += (name,)  # listed: the preflight asks nothing
    folder = pictures(tmp_path / "pics")
    steps = [
        "blue = next(s for s in sources if s['name'].endswith('b_blue.png'))\n"
        "SUBMIT(llm_query('what colour?', images=[blue]))",  # a `sources` entry itself names its image too
    ]
    oracle.add(Scenario("billed", steps, see=colour_of))
    async with Engine() as engine:
        result = await engine.run(RunRequest("billed: colour", context_paths=[str(folder)]))
        sub = next(e["data"] for e in engine.events(result.run_id) if e["kind"] == "subcall.finished")
    assert result.status == "succeeded", result.error
    assert result.answer == "blue"
    assert sub_images(oracle) == [[Image("image/png", BLUE)]]  # OpenAI's image_url part, or Anthropic's image block
    rates = model_info(provider, name)
    assert sub["prompt_tokens"] >= oracle.state.image_tokens
    expected = (
        sub["prompt_tokens"] * rates["input_cost_per_token"] + sub["completion_tokens"] * rates["output_cost_per_token"]
    )
    assert sub["cost"] == pytest.approx(expected)  # the image's tokens are paid for, and the budget charged
    assert result.usage["by_model"][sub_model]["cost"] == pytest.approx(expected)


def test_an_image_call_is_keyed_by_digests() -> None:
    def call(png: bytes) -> list[dict]:
        return [{"role": "user", "content": images.content("what colour?", [("image/png", png)])}]

    keyed = lm.keyed(call(RED))
    assert base64.b64encode(RED).decode() not in str(keyed)
    assert (
        keyed[0]["content"][1]["sha256"]
        == hashlib.sha256(call(RED)[0]["content"][1]["image_url"]["url"].encode()).hexdigest()
    )
    assert tape.request_key(None, lm.keyed(call(RED))) == tape.request_key(None, lm.keyed(call(RED)))
    assert tape.request_key(None, lm.keyed(call(RED))) != tape.request_key(None, lm.keyed(call(BLUE)))
    assert lm.keyed([{"role": "user", "content": "plain"}]) == [{"role": "user", "content": "plain"}]


def test_one_calls_images_fit_in_one_host_call_message() -> None:
    """The per-call cap is below what one bridge message holds once base64 has grown it by a third."""
    assert images.MAX_CALL_BYTES * 4 // 3 + 1024 * 1024 < base.MAX_MESSAGE_BYTES == worker.MAX_MESSAGE
    assert images.MAX_CALL_BYTES >= 2 * context.MAX_IMAGE_BYTES  # two staged images of the largest size
    assert worker.BYTES_TAG == base.BYTES_TAG
