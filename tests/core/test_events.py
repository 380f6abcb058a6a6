import asyncio
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fleet_rlm.core.events import EVENT_VERSION, EventBus
from fleet_rlm.redaction import redact
from fleet_rlm.store import RunRecord, Store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "fleet.db")
    for run_id in ("r1", "r2"):
        s.create_run(RunRecord(id=run_id, question="q"))
    yield s
    s.close()


async def _collect(agen, limit: int | None = None) -> list[dict[str, Any]]:
    out = []
    async with aclosing(agen):
        async for event in agen:
            out.append(event)
            if limit is not None and len(out) >= limit:
                break
    return out


def _finish(bus: EventBus, run_id: str = "r1") -> dict[str, Any]:
    return bus.publish(run_id, "run.finished", {"status": "succeeded", "answer": "42", "usage": {}})


def test_publish_stores_first_and_returns_envelope(store: Store) -> None:
    bus = EventBus(store)
    event = bus.publish("r1", "lm.call", {"model": "m"}, node="root.0", parent="root", depth=1)
    assert event["v"] == EVENT_VERSION == 1
    assert event["seq"] == 1 and event["kind"] == "lm.call" and event["depth"] == 1
    assert store.events("r1") == [event]


@pytest.mark.anyio
async def test_replay_from_after_seq_and_end_at_finished(store: Store) -> None:
    bus = EventBus(store)
    for i in range(5):
        bus.publish("r1", "step.started", {"i": i})
    _finish(bus)
    got = await asyncio.wait_for(_collect(bus.subscribe("r1", after_seq=3)), 5)
    assert [e["seq"] for e in got] == [4, 5, 6]
    assert got[-1]["kind"] == "run.finished"
    # Already at (or past) the end of a finished run: ends at once, no hang.
    assert await asyncio.wait_for(_collect(bus.subscribe("r1", after_seq=6)), 5) == []
    assert await asyncio.wait_for(_collect(bus.subscribe("r1", after_seq=60)), 5) == []
    assert bus.subscriber_count() == 0


@pytest.mark.anyio
async def test_live_subscription_ends_after_run_finished(store: Store) -> None:
    bus = EventBus(store)
    task = asyncio.create_task(_collect(bus.subscribe("r1")))
    await asyncio.sleep(0.05)
    bus.publish("r1", "run.started", {})
    bus.publish("r2", "run.started", {})  # another run: not ours
    _finish(bus)
    got = await asyncio.wait_for(task, 5)
    assert [(e["run_id"], e["kind"]) for e in got] == [("r1", "run.started"), ("r1", "run.finished")]
    assert bus.subscriber_count() == 0


@pytest.mark.anyio
async def test_replay_then_live_no_gap_no_duplicate(store: Store) -> None:
    """Subscribers join at random points while a thread and the loop both publish."""
    bus = EventBus(store, queue_size=1000)
    for i in range(50):
        bus.publish("r1", "step.started", {"i": i})
    total = 50 + 400 + 100 + 1

    def from_thread() -> None:
        for i in range(400):
            bus.publish("r1", "code.executed", {"i": i})

    thread = threading.Thread(target=from_thread)
    subs = [asyncio.create_task(_collect(bus.subscribe("r1", after_seq=a))) for a in (0, 10, 49)]
    thread.start()
    for i in range(100):  # publishes from the loop thread, interleaved with the thread's
        bus.publish("r1", "lm.call", {"i": i})
        if i % 10 == 0:
            subs.append(asyncio.create_task(_collect(bus.subscribe("r1", after_seq=i))))
        await asyncio.sleep(0)
    await asyncio.to_thread(thread.join)
    _finish(bus)
    results = await asyncio.wait_for(asyncio.gather(*subs), 20)
    for got in results:
        seqs = [e["seq"] for e in got]
        assert seqs == list(range(seqs[0], total + 1)), "gap or duplicate"
        assert got[-1]["kind"] == "run.finished"
    assert [e["seq"] for e in results[0]] == list(range(1, total + 1))
    assert bus.subscriber_count() == 0


@pytest.mark.anyio
async def test_slow_subscriber_with_tiny_queue_recovers(store: Store) -> None:
    bus = EventBus(store, queue_size=2)
    got: list[dict[str, Any]] = []

    async def slow() -> None:
        async with aclosing(bus.subscribe("r1")) as agen:
            async for event in agen:
                got.append(event)
                await asyncio.sleep(0.001)  # much slower than the publisher

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.05)

    def burst() -> None:
        for i in range(300):
            bus.publish("r1", "lm.call", {"i": i})
        _finish(bus)

    await asyncio.to_thread(burst)
    for i in range(20):  # and a burst from the loop thread itself
        assert bus.publish("r2", "lm.call", {"i": i})
    await asyncio.wait_for(task, 20)
    assert [e["seq"] for e in got] == list(range(1, 302))
    assert [e["data"].get("i") for e in got[:300]] == list(range(300))


@pytest.mark.anyio
async def test_all_runs_subscription_is_live_only_and_recovers_lag(store: Store) -> None:
    bus = EventBus(store, queue_size=3)
    bus.publish("r1", "run.started", {})  # before subscribing: not replayed
    got: list[dict[str, Any]] = []

    async def watch() -> None:
        async with aclosing(bus.subscribe(None)) as agen:
            async for event in agen:
                got.append(event)
                await asyncio.sleep(0.001)
                if len(got) == 81:
                    return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.05)

    def burst() -> None:
        for _ in range(40):
            bus.publish("r1", "lm.call", {})
            bus.publish("r2", "lm.call", {})

    await asyncio.to_thread(burst)
    _finish(bus, "r2")  # does not end an all-runs subscription
    await asyncio.wait_for(task, 20)
    by_run = {rid: [e["seq"] for e in got if e["run_id"] == rid] for rid in ("r1", "r2")}
    assert by_run == {"r1": list(range(2, 42)), "r2": list(range(1, 42))}
    assert bus.subscriber_count() == 0


@pytest.mark.anyio
async def test_unsubscribe_on_close(store: Store) -> None:
    bus = EventBus(store)
    bus.publish("r1", "run.started", {})
    agen = bus.subscribe("r1")
    assert (await agen.__anext__())["seq"] == 1
    assert bus.subscriber_count() == 1
    await agen.aclose()
    assert bus.subscriber_count() == 0
    bus.publish("r1", "warning", {"message": "nobody listening"})  # must not fail


def test_publish_from_thread_without_loop(store: Store) -> None:
    bus = EventBus(store)
    out: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: out.append(bus.publish("r1", "warning", {})))
    t.start()
    t.join()
    assert out[0]["seq"] == 1


# -- redaction -----------------------------------------------------------------


def test_redact_examples() -> None:
    data = {
        "api_key": "abc",
        "OPENAI_API_KEY": "abc",
        "headers": {"Authorization": "Bearer xyz", "Accept": "json"},
        "refresh_token": "t",
        "db_password": None,
        "usage": {"prompt_tokens": 10, "total_tokens": 12},
        "max_tokens": 100,
        "output": "using sk-proj-ABCDEFGH12345678 and Bearer abc.def.ghi now",
        "items": [{"secret": [1, 2]}, "plain"],
        "n": 3,
    }
    out = redact(data)
    assert out == {
        "api_key": "***",
        "OPENAI_API_KEY": "***",
        "headers": {"Authorization": "***", "Accept": "json"},
        "refresh_token": "***",
        "db_password": None,
        "usage": {"prompt_tokens": 10, "total_tokens": 12},
        "max_tokens": 100,
        "output": "using *** and *** now",
        "items": [{"secret": "***"}, "plain"],
        "n": 3,
    }
    assert data["api_key"] == "abc"  # input untouched


_SECRET_WORDS = ["api_key", "key", "token", "password", "secret", "authorization"]
_json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_json_value = st.recursive(
    _json_leaf,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@st.composite
def _secret_keys(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(_SECRET_WORDS))
    word = "".join(c.upper() if draw(st.booleans()) else c for c in word)
    key = draw(st.text(max_size=6)) + word + draw(st.text(max_size=6))
    # "*tokens*" keys are usage counters, deliberately not masked.
    assume("tokens" not in key.lower())
    return key


def test_secret_values_never_reach_the_store(store: Store) -> None:
    bus = EventBus(store)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(key=_secret_keys(), value=_json_value.filter(lambda v: v is not None), depth=st.integers(0, 3))
    def check(key: str, value: Any, depth: int) -> None:
        data: dict[str, Any] = {key: value}
        for _ in range(depth):
            data = {"nested": [data]}
        event = bus.publish("r1", "code.executed", data)
        (row,) = store._read("SELECT data_json FROM events WHERE run_id = 'r1' AND seq = ?", (event["seq"],))
        stored = json.loads(row[0])
        for _ in range(depth):
            stored = stored["nested"][0]
        assert stored == {key: "***"}
        assert event["data"] == json.loads(row[0])

    check()


@given(
    prefix=st.sampled_from(["sk-", "sk-ant-api03-", "Bearer ", "bearer  "]),
    body=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=8),
    around=st.text(alphabet=" \n.,:;()[]=_'\"", min_size=1, max_size=5),
)
def test_key_like_strings_are_masked_anywhere(prefix: str, body: str, around: str) -> None:
    secret = prefix + body
    out = redact({"log": f"x{around}{secret}{around}y", "list": [secret]})
    assert body not in json.dumps(out)


def test_key_like_pattern_leaves_ordinary_words() -> None:
    text = "ask-questions task-12345678, the bearer of news"
    assert redact(text) == text


@pytest.mark.anyio
async def test_following_a_run_whose_process_died_ends_at_once(tmp_path: Path) -> None:
    """No live events will ever come for it: the subscription closes the run out and ends."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "dead.db") as store:
        store.create_run(RunRecord(id="r9", status="running", owner_pid=dead.pid, owner_host=socket.gethostname()))
        store.append_event("r9", "run.started", {})
        got = await asyncio.wait_for(_collect(EventBus(store).subscribe("r9")), 5)
    assert [e["kind"] for e in got] == ["run.started", "run.finished"]
    assert got[-1]["data"]["status"] == "interrupted"
