import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fleet_rlm.core.events import EVENT_VERSION, EventBus
from fleet_rlm.redaction import redact
from fleet_rlm.store import RunRecord, Store, StoreError


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "fleet.db")
    for run_id in ("r1", "r2"):
        s.runs.create(RunRecord(id=run_id, question="q"))
    yield s
    s.close()


async def _collect(
    agen, limit: int | None = None, *, into: list | None = None, until: Callable[[dict], bool] | None = None
) -> list[dict[str, Any]]:
    """The events ``agen`` yields (also appended to ``into`` as they come), up to ``limit`` or ``until``."""
    out = [] if into is None else into
    async with aclosing(agen):
        async for event in agen:
            out.append(event)
            if (limit is not None and len(out) >= limit) or (until is not None and until(event)):
                break
    return out


def _finish(bus: EventBus, run_id: str = "r1") -> None:
    bus.publish(run_id, "run.finished", {"status": "succeeded", "answer": "42", "usage": {}})


def test_publish_queues_and_the_store_assigns_the_envelope(store: Store) -> None:
    bus = EventBus(store)
    assert bus.publish("r1", "lm.call", {"model": "m"}, node="root.0", parent="root", depth=1) is None
    store.flush()
    (event,) = store.runs.events("r1")
    assert event["v"] == EVENT_VERSION == 1
    assert event["seq"] == 1 and event["kind"] == "lm.call" and event["depth"] == 1
    assert (event["node"], event["parent"], event["data"]) == ("root.0", "root", {"model": "m"})


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
        bus.publish("r2", "lm.call", {"i": i})
    await asyncio.wait_for(task, 20)
    assert [e["seq"] for e in got] == list(range(1, 302))
    assert [e["data"].get("i") for e in got[:300]] == list(range(300))


@pytest.mark.anyio
async def test_all_runs_subscription_is_live_only_and_recovers_lag(store: Store) -> None:
    bus = EventBus(store, queue_size=3)
    bus.publish("r1", "run.started", {})  # stored before subscribing: not replayed
    store.flush()
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
    t = threading.Thread(target=lambda: bus.publish("r1", "warning", {}))
    t.start()
    t.join()
    store.flush()
    assert [e["seq"] for e in store.runs.events("r1")] == [1]


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
        bus.publish("r1", "code.executed", data)
        store.flush()
        seq = store.runs.last_seq("r1")
        (row,) = store.read("SELECT data_json FROM events WHERE run_id = 'r1' AND seq = ?", (seq,))
        stored = json.loads(row[0])
        for _ in range(depth):
            stored = stored["nested"][0]
        assert stored == {key: "***"}

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
        store.runs.create(RunRecord(id="r9", status="running", owner_pid=dead.pid, owner_host=socket.gethostname()))
        store.runs.append_event("r9", "run.started", {})
        got = await asyncio.wait_for(_collect(EventBus(store).subscribe("r9")), 5)
    assert [e["kind"] for e in got] == ["run.started", "run.finished"]
    assert got[-1]["data"]["status"] == "interrupted"


# -- the writer thread -----------------------------------------------------------


def _hold_writer(store: Store) -> tuple[Future, threading.Event]:
    """Keep the store's writer thread (and SQLite's write lock) busy until the event is set."""
    holding, release = threading.Event(), threading.Event()

    def slow_write() -> None:
        holding.set()
        release.wait(30)

    held = store.submit(slow_write)
    assert holding.wait(10), "the writer never picked up the slow write"
    return held, release


@pytest.mark.anyio
async def test_publish_returns_at_once_and_nobody_sees_the_event_before_it_commits(store: Store) -> None:
    bus = EventBus(store)
    follower = asyncio.create_task(_collect(bus.subscribe("r1")))
    await asyncio.sleep(0.05)
    held, release = await asyncio.to_thread(_hold_writer, store)
    bus.publish("r1", "run.started", {})
    _finish(bus)
    # Had publish waited for the writer, it would have returned only after the slow write ended.
    assert not held.done()
    await asyncio.sleep(0.1)
    # Reads do not wait for the writer either (WAL); neither they nor the subscriber see anything yet.
    assert store.runs.events("r1") == [] and not follower.done()
    release.set()
    await bus.flush()
    got = await asyncio.wait_for(follower, 5)
    assert [(e["seq"], e["kind"]) for e in got] == [(1, "run.started"), (2, "run.finished")]
    assert got == store.runs.events("r1")


@pytest.mark.anyio
async def test_subscribers_get_what_was_stored_not_the_callers_object(store: Store) -> None:
    bus = EventBus(store)
    follower = asyncio.create_task(_collect(bus.subscribe("r1")))
    await asyncio.sleep(0.05)
    data = {"api_key": "abc", "n": 1}
    bus.publish("r1", "warning", data)
    _finish(bus)
    got = await asyncio.wait_for(follower, 5)
    assert got[0]["data"] == {"api_key": "***", "n": 1} == store.runs.events("r1")[0]["data"]
    assert data == {"api_key": "abc", "n": 1}


_PUBLISHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fleet_rlm.core.events import EventBus
    from fleet_rlm.store import Store

    store = Store(Path(sys.argv[1]))
    bus = EventBus(store)
    for i in range(int(sys.argv[2])):
        bus.publish("r1", "warning", {"who": sys.argv[3], "i": i})
    store.close()  # commits what is still queued
    """
)


def test_publishers_on_threads_and_in_processes_keep_seq_gap_free_and_their_order(store: Store) -> None:
    bus = EventBus(store)
    procs = [subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(store.path), "300", w]) for w in ("p1", "p2")]

    def publish(who: str) -> None:
        for i in range(300):
            bus.publish("r1", "warning", {"who": who, "i": i})

    threads = [threading.Thread(target=publish, args=(f"t{n}",)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store.flush()
    events = store.runs.events("r1")
    assert [e["seq"] for e in events] == list(range(1, 1501))
    for who in ("p1", "p2", "t0", "t1", "t2"):
        assert [e["data"]["i"] for e in events if e["data"]["who"] == who] == list(range(300))


def test_close_commits_what_is_still_queued(tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    store.runs.create(RunRecord(id="r1"))
    bus = EventBus(store)
    held, release = _hold_writer(store)
    for i in range(200):
        bus.publish("r1", "warning", {"i": i})  # queued behind the held write
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and not held.done()  # close() waits for the queue, it does not drop it
    release.set()
    closer.join(30)
    with pytest.raises(StoreError, match="closed"):
        bus.publish("r1", "warning", {})
    with Store(tmp_path / "fleet.db") as again:
        assert [e["data"]["i"] for e in again.runs.events("r1")] == list(range(200))


# -- tailing: runs this process does not run -------------------------------------


def _is_finished(run_id: str) -> Callable[[dict], bool]:
    return lambda event: event["run_id"] == run_id and event["kind"] == "run.finished"


@pytest.mark.anyio
async def test_a_run_another_writer_runs_is_followed_by_tailing(tmp_path: Path) -> None:
    """``there`` stands for another process: nothing it writes reaches ``here``'s bus live."""
    with Store(tmp_path / "fleet.db") as here, Store(tmp_path / "fleet.db") as there:
        owner = {"owner_pid": os.getpid(), "owner_host": socket.gethostname()}
        there.runs.create(RunRecord(id="r1", status="running", **owner))
        there.runs.append_event("r1", "run.started", {})
        bus, elsewhere = EventBus(here), EventBus(there)
        everything = asyncio.create_task(_collect(bus.subscribe(None), until=_is_finished("r1")))
        await asyncio.sleep(0.3)  # the all-runs subscription has taken its cursor
        follower = asyncio.create_task(_collect(bus.subscribe("r1")))
        for burst in range(5):  # in bursts, so tailing catches them over several reads
            for i in range(20):
                elsewhere.publish("r1", "lm.call", {"burst": burst, "i": i})
            await asyncio.sleep(0.15)
        elsewhere.publish("r1", "run.finished", {"status": "succeeded"})
        got = await asyncio.wait_for(follower, 10)
        seen = await asyncio.wait_for(everything, 10)
        stored = here.runs.events("r1")
    assert [e["seq"] for e in stored] == list(range(1, 103))
    assert got == stored  # every event exactly once, in order, ending with run.finished
    assert seen == stored[1:]  # from its cursor on: run.started came before it
