import asyncio
import dataclasses
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fleet_rlm.redaction import remember_secrets
from fleet_rlm.store import (
    SCHEMA_VERSION,
    Approval,
    DatasetRow,
    Optimization,
    ProgramVersion,
    RunRecord,
    Store,
    StoreError,
)
from fleet_rlm.store.db import MIGRATIONS
from fleet_rlm.store.owners import owner_alive, process_start
from fleet_rlm.types import Event


def _run(run_id: str, **kw) -> RunRecord:
    return RunRecord(id=run_id, question=f"q {run_id}", **kw)


# -- schema -------------------------------------------------------------------


def test_fresh_store_is_migrated_with_wal(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "fleet.db"
    with Store(path):
        pass
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "events", "sessions"} <= tables
    conn.close()


_OPENER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fleet_rlm.store import Store

    for line in sys.stdin:  # one fresh path per round, sent to every opener at the same moment
        try:
            Store(Path(line.strip())).close()
            print("ok", flush=True)
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
    """
)


def test_processes_opening_a_fresh_store_at_once_all_get_in(tmp_path: Path) -> None:
    """Two first runs at the same moment (each creating the store) both start: the switch to WAL
    is not left to fail with "database is locked" (it did in about one round in seven)."""
    openers = [
        subprocess.Popen([sys.executable, "-c", _OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    try:
        for n in range(40):
            path = tmp_path / f"round{n}" / "fleet.db"
            for proc in openers:
                proc.stdin.write(f"{path}\n")  # type: ignore[union-attr]
            for proc in openers:
                proc.stdin.flush()  # type: ignore[union-attr]
            assert [proc.stdout.readline().strip() for proc in openers] == ["ok"] * 4, n  # type: ignore[union-attr]
    finally:
        for proc in openers:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=30)


def test_a_store_locked_too_long_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fleet.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
    monkeypatch.setattr("fleet_rlm.store.db._BUSY_SECONDS", 0.2)
    try:
        with pytest.raises(StoreError, match=r"stayed locked for 0\.2 s by another fleet-rlm process; try again"):
            Store(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    Store(path).close()  # and nothing was harmed


def test_reopen_is_idempotent_and_data_survives(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store(path) as s:
        s.runs.create(_run("r1", request={"model": "m"}))
        s.runs.append_event("r1", "run.started", {"question": "q r1"})
        s.sessions.create("s1", name="notes", meta={"a": 1})
    for _ in range(2):
        with Store(path) as s:
            run = s.runs.get("r1")
            assert run is not None and run.request == {"model": "m"}
            assert [e["kind"] for e in s.runs.events("r1")] == ["run.started"]
            assert s.sessions.get("s1").meta == {"a": 1}


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(StoreError, match=rf"newer fleet-rlm \(schema {SCHEMA_VERSION + 5}\); upgrade"):
        Store(path)


# -- runs ---------------------------------------------------------------------


def test_create_get_update(store: Store) -> None:
    store.runs.create(_run("r1", session_id="s", owner_pid=1, owner_host="h"))
    store.runs.update("r1", status="running", started_at=5.0, usage={"total_tokens": 3}, iterations=2)
    run = store.runs.get("r1")
    assert run.status == "running" and run.started_at == 5.0 and run.iterations == 2
    assert run.usage == {"total_tokens": 3} and run.request == {}
    assert store.runs.get("missing") is None
    with pytest.raises(ValueError, match="already exists"):
        store.runs.create(_run("r1"))
    with pytest.raises(ValueError, match="cannot update"):
        store.runs.update("r1", id="x")
    with pytest.raises(ValueError, match="cannot update"):
        store.runs.update("r1", bogus=1)
    with pytest.raises(ValueError, match="unknown run status"):
        store.runs.update("r1", status="exploded")
    with pytest.raises(KeyError):
        store.runs.update("missing", status="failed")


def test_list_paging_and_filters(store: Store) -> None:
    for i in range(7):
        store.runs.create(_run(f"r{i}", created_at=100.0 + i, session_id="a" if i % 2 else "b", status="succeeded"))
    store.runs.update("r3", status="failed")
    assert [r.id for r in store.runs.list()] == [f"r{i}" for i in range(6, -1, -1)]
    assert [r.id for r in store.runs.list(limit=3, offset=2)] == ["r4", "r3", "r2"]
    assert [r.id for r in store.runs.list(session_id="a")] == ["r5", "r3", "r1"]
    assert [r.id for r in store.runs.list(status="failed")] == ["r3"]
    assert [r.id for r in store.runs.list(session_id="b", status="failed")] == []


def test_delete_run_removes_events(store: Store) -> None:
    store.runs.create(_run("r1"))
    store.runs.create(_run("r2"))
    for kind in ("a", "b"):
        store.runs.append_event("r1", kind, {})
        store.runs.append_event("r2", kind, {})
    store.runs.delete("r1")
    assert store.runs.get("r1") is None and store.runs.events("r1") == [] and store.runs.last_seq("r1") == 0
    assert len(store.runs.events("r2")) == 2


# -- events -------------------------------------------------------------------


def test_append_and_read_events(store: Store) -> None:
    store.runs.create(_run("r1"))
    e1 = store.runs.append_event("r1", "run.started", {"x": 1}, ts=10.0)
    e2 = store.runs.append_event("r1", "lm.call", {"y": [1, 2]}, node="root.1", parent="root", depth=1)
    assert e1 == {
        "v": 1,
        "run_id": "r1",
        "seq": 1,
        "ts": 10.0,
        "kind": "run.started",
        "node": "root",
        "parent": None,
        "depth": 0,
        "data": {"x": 1},
    }
    assert e2["seq"] == 2 and e2["node"] == "root.1" and e2["depth"] == 1
    assert store.runs.events("r1") == [e1, e2]
    assert store.runs.events("r1", after_seq=1) == [e2]
    assert store.runs.events("r1", limit=1) == [e1]
    assert store.runs.last_seq("r1") == 2 and store.runs.last_seq("nope") == 0


def test_event_for_unknown_run_is_refused(store: Store) -> None:
    with pytest.raises(KeyError, match="no run"):
        store.runs.append_event("ghost", "warning", {})


def test_seq_gap_free_across_threads(store: Store) -> None:
    store.runs.create(_run("r1"))
    seqs: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for i in range(200):
            seq = store.runs.append_event("r1", "warning", {"i": i})["seq"]
            with lock:
                seqs.append(seq)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seqs) == list(range(1, 1601))
    assert [e["seq"] for e in store.runs.events("r1")] == list(range(1, 1601))


def test_seq_gap_free_across_store_instances(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store(path) as s:
        s.runs.create(_run("r1"))
    stores = [Store(path), Store(path)]

    def worker(s: Store) -> None:
        for _ in range(150):
            s.runs.append_event("r1", "warning", {})

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e["seq"] for e in stores[0].runs.events("r1")] == list(range(1, 601))
    for s in stores:
        s.close()


_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fleet_rlm.store import Store

    s = Store(Path(sys.argv[1]))
    for i in range(int(sys.argv[2])):
        s.runs.append_event("r1", "warning", {"who": sys.argv[3], "i": i})
    s.close()
    """
)


def test_seq_gap_free_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store(path) as s:
        s.runs.create(_run("r1"))
        procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(path), "200", name]) for name in ("p1", "p2")]
        for i in range(100):  # and this process too, at the same time
            s.runs.append_event("r1", "warning", {"who": "me", "i": i})
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        events = s.runs.events("r1")
    assert [e["seq"] for e in events] == list(range(1, 501))
    for who, n in (("p1", 200), ("p2", 200), ("me", 100)):
        # each writer's own events keep their order
        assert [e["data"]["i"] for e in events if e["data"]["who"] == who] == list(range(n))


# -- crash recovery -----------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_mark_interrupted(store: Store) -> None:
    host = socket.gethostname()
    dead = _dead_pid()
    store.runs.create(_run("dead", status="running", owner_pid=dead, owner_host=host, usage={"n": 1}))
    store.runs.create(_run("queued-dead", status="queued", owner_pid=dead, owner_host=host))
    store.runs.create(_run("mine", status="running", owner_pid=os.getpid(), owner_host=host))
    store.runs.create(_run("other-host", status="running", owner_pid=dead, owner_host=host + "-elsewhere"))
    store.runs.create(_run("done", status="succeeded", owner_pid=dead, owner_host=host))
    store.runs.append_event("dead", "run.started", {})

    before = time.time()
    assert sorted(store.runs.mark_interrupted()) == ["dead", "queued-dead"]

    run = store.runs.get("dead")
    assert run.status == "interrupted" and run.finished_at >= before
    assert run.stop_reason == f"the process running it stopped (pid {dead})"
    last = store.runs.events("dead")[-1]
    assert last["seq"] == 2 and last["kind"] == "run.finished"
    assert last["data"] == {
        "status": "interrupted",
        "answer": None,
        "usage": {"n": 1},
        "stop_reason": run.stop_reason,
    }
    assert [e["kind"] for e in store.runs.events("queued-dead")] == ["run.finished"]
    assert store.runs.get("mine").status == "running"
    assert store.runs.get("other-host").status == "running"
    assert store.runs.get("done").status == "succeeded"
    assert store.runs.mark_interrupted() == []  # idempotent


def test_mark_interrupted_custom_alive_check(tmp_path: Path) -> None:
    host = socket.gethostname()
    verdict = {111: True, 222: False}
    with Store(tmp_path / "fleet.db", alive=lambda pid, start: verdict[pid]) as store:
        store.runs.create(_run("a", status="running", owner_pid=111, owner_host=host))
        store.runs.create(_run("b", status="running", owner_pid=222, owner_host=host))
        store.runs.create(_run("me", status="running", owner_pid=os.getpid(), owner_host=host))
        assert store.runs.mark_interrupted() == ["b"]
        verdict[111] = False
        # our own runs count as alive whatever the check says (and are never checked)
        assert store.runs.mark_interrupted() == ["a"]
        assert store.runs.get("me").status == "running"


def test_dead_owner_is_noticed_on_read(store: Store) -> None:
    """get_run and list_runs close a dead process's run at once, with its run.finished event."""
    host = socket.gethostname()
    dead = _dead_pid()
    store.runs.create(_run("gone", status="running", owner_pid=dead, owner_host=host))
    store.runs.append_event("gone", "run.started", {})
    run = store.runs.get("gone")
    assert run.status == "interrupted" and run.stop_reason == f"the process running it stopped (pid {dead})"
    assert [e["kind"] for e in store.runs.events("gone")] == ["run.started", "run.finished"]

    store.runs.create(_run("gone-too", status="queued", owner_pid=dead, owner_host=host))
    # A status filter sees the truth too: the dead run is no longer "queued".
    assert store.runs.list(status="queued") == []
    assert [r.status for r in store.runs.list(status="interrupted")] == ["interrupted", "interrupted"]
    assert store.runs.mark_interrupted() == []  # already recorded, once
    assert [e["kind"] for e in store.runs.events("gone-too")] == ["run.finished"]


def test_recycled_pid_is_not_the_owner(store: Store) -> None:
    """The owner is a pid AND its start stamp: another process on the same pid is not the owner."""
    host = socket.gethostname()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stamp = process_start(other.pid)
        assert stamp is not None and stamp == process_start(other.pid)
        store.runs.create(_run("live", status="running", owner_pid=other.pid, owner_host=host, owner_start=stamp))
        # Same pid, but the process that owned the run started at another time: it is gone.
        store.runs.create(
            _run("recycled", status="running", owner_pid=other.pid, owner_host=host, owner_start=stamp + "0")
        )
        assert store.runs.get("live").status == "running"
        assert store.runs.get("recycled").status == "interrupted"
    finally:
        other.kill()
        other.wait()
    assert store.runs.get("live").status == "interrupted"  # now its owner really is gone


def test_an_exited_unreaped_owner_is_dead() -> None:
    """A killed server whose parent has not reaped it yet (a zombie) no longer owns its runs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stamp = process_start(child.pid)
    assert owner_alive(child.pid, stamp)
    child.kill()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.01)
    try:
        assert not owner_alive(child.pid, stamp) and not owner_alive(child.pid, None)
    finally:
        child.wait()


def test_own_runs_carry_this_process_start_stamp(store: Store) -> None:
    store.runs.create(_run("mine", status="running", owner_pid=os.getpid(), owner_host=socket.gethostname()))
    assert store.runs.get("mine").owner_start == process_start(os.getpid()) is not None


def test_secrets_are_masked_before_they_reach_the_file(store: Store) -> None:
    remember_secrets(["plainkey0123456789abcdef"])
    store.runs.create(_run("r1", request={"note": "sent plainkey0123456789abcdef"}))
    store.runs.update("r1", error="provider said: bad key plainkey0123456789abcdef", answer="Bearer abcdefghijkl")
    store.runs.append_event("r1", "warning", {"message": "echo plainkey0123456789abcdef"})
    run = store.runs.get("r1")
    assert (run.error, run.answer, run.request) == ("provider said: bad key ***", "***", {"note": "sent ***"})
    assert store.runs.events("r1")[0]["data"] == {"message": "echo ***"}
    store.close()
    raw = b"".join(f.read_bytes() for f in store.path.parent.iterdir() if f.name.startswith("fleet.db"))
    assert b"plainkey0123456789abcdef" not in raw and b"abcdefghijkl" not in raw


def test_store_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "home" / "fleet.db"
    with Store(path) as store:
        store.runs.create(_run("r1"))  # a write: the -wal file exists now
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in path.parent.iterdir()}
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert {"fleet.db", "fleet.db-wal", "fleet.db-shm"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_older_store_files_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "home" / "fleet.db"
    Store(path).close()
    path.parent.chmod(0o755)
    path.chmod(0o644)
    Store(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


# -- sessions -----------------------------------------------------------------


def test_sessions(store: Store) -> None:
    s1 = store.sessions.create("s1", name="first")
    time.sleep(0.01)
    store.sessions.create("s2", meta={"k": "v"})
    assert [s.id for s in store.sessions.list()] == ["s2", "s1"]
    time.sleep(0.01)
    store.sessions.touch("s1")
    assert store.sessions.get("s1").last_used_at > s1.last_used_at
    assert [s.id for s in store.sessions.list()] == ["s1", "s2"]
    store.sessions.close("s2")
    assert [s.id for s in store.sessions.list()] == ["s1"]
    assert {s.id for s in store.sessions.list(include_closed=True)} == {"s1", "s2"}
    assert store.sessions.get("s2").closed_at is not None
    assert store.sessions.get("nope") is None
    with pytest.raises(ValueError, match="already exists"):
        store.sessions.create("s1")
    with pytest.raises(KeyError):
        store.sessions.touch("nope")


# -- uploads and feedback -----------------------------------------------------


def test_uploads_and_feedback_are_rows_that_go_with_their_run(store: Store) -> None:
    store.runs.create(_run("r1", status="succeeded"))
    store.runs.create(_run("r2", status="succeeded"))
    store.uploads.add("u1", "notes.txt", 5)
    store.uploads.add("u2", "shared.txt", 7)
    store.uploads.attach("r1", ["u1", "u2"])
    store.uploads.attach("r2", ["u2"])
    given = store.uploads.add_feedback("r1", False, "the right one", "key sk-live-abcdefgh12345678")
    assert store.uploads.feedback("r1") == [given]  # what was stored is what reads give back
    assert (given.correct, given.expected) == (False, "the right one") and "sk-live" not in (given.comment or "")
    upload = store.uploads.get("u1")
    assert upload is not None and (upload.name, upload.size) == ("notes.txt", 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        upload.name = "elsewhere.txt"  # type: ignore[misc]
    assert sorted(store.uploads.of_run("r1")) == ["u1", "u2"]
    assert store.runs.purge(["r1"]) == ["u1"]  # u2: r2 still reads it
    assert store.uploads.get("u1") is None and store.uploads.get("u2") is not None
    assert store.uploads.feedback("r1") == [] and store.uploads.of_run("r1") == []


def test_json_columns_are_json(store: Store) -> None:
    store.runs.create(_run("r1", request={"a": [1, 2]}))
    row = store.read("SELECT request_json, usage_json FROM runs WHERE id = 'r1'")[0]
    assert json.loads(row[0]) == {"a": [1, 2]} and json.loads(row[1]) == {}


# -- optimization and agent rows ------------------------------------------------


def _frozen(rows: object) -> bool:
    """Every row a frozen dataclass (a dict read back would let a caller edit what it was given)."""
    items = rows if isinstance(rows, list) else [rows]
    return bool(items) and all(dataclasses.is_dataclass(r) and r.__dataclass_params__.frozen for r in items)


def test_optimization_rows_are_frozen_dataclasses_with_json_decoded(store: Store) -> None:
    opt = store.optimize
    store.runs.create(_run("r1", status="succeeded", answer="42", request={"context_paths": ["/d"]}))
    store.uploads.add_feedback("r1", True, None, "good")
    rows = [DatasetRow(0, "train", "q0", None, ["/d"], "a0", True, None, None),
            DatasetRow(1, "holdout", "q1", None, None, "a1", None, None, None)]  # fmt: skip
    opt.create_dataset("d1", "ten", "jsonl", 0.5, 7, rows)
    opt.add_program_version(ProgramVersion(
        id="v1", base_id=None, optimization_id="o1", dataset_id="d1", optimizer="bootstrap", metric="exact",
        scores={"train_after": 1.0}, state={"act": {"demos": []}}, changes={}, created_at=1.0,
    ))  # fmt: skip
    opt.activate_program("v1", "promote", "better")
    opt.create_optimization(Optimization(
        id="o1", lineage="o1", dataset_id="d1", optimizer="bootstrap", metric="exact", base_version=None,
        params={"trials": 2}, version_id=None, scores={}, created_at=2.0,
    ))  # fmt: skip
    opt.update_optimization("o1", version_id="v1", scores={"train_after": 1.0})
    opt.cache_eval("o1", "p", "e", run_id="r1", answer="42", steps=[{"code": "x"}], llm_calls=3, cost=None)

    dataset = opt.get_dataset("ten")
    assert dataset is not None and (dataset.id, dataset.train, dataset.holdout) == ("d1", 1, 1)
    assert opt.list_datasets() == [dataset]
    first, second = opt.dataset_rows("d1")
    assert (first.context_paths, first.verdict, second.context_paths, second.verdict) == (["/d"], True, [], None)
    (judged,) = opt.judged_runs()
    assert (judged.run_id, judged.request, judged.correct, judged.earlier) == ("r1", {"context_paths": ["/d"]}, True, 0)
    version = opt.get_program_version("v1")
    assert version is not None and version.state == {"act": {"demos": []}} and version.scores == {"train_after": 1.0}
    assert opt.list_program_versions() == [dataclasses.replace(version, state=None)]  # listings leave state out
    (activation,) = opt.activations()
    assert (activation.version_id, activation.action, activation.reason) == ("v1", "promote", "better")
    optimization = opt.get_optimization("o1")
    assert optimization is not None and (optimization.version_id, optimization.params) == ("v1", {"trials": 2})
    assert opt.list_optimizations() == [optimization]
    cached = opt.cached_eval("o1", "p", "e")
    assert cached is not None and (cached.steps, cached.llm_calls) == ([{"code": "x"}], 3)
    for found in (dataset, [first, second], judged, version, activation, optimization, cached):
        assert _frozen(found), found
    with pytest.raises(dataclasses.FrozenInstanceError):
        dataset.train = 2  # type: ignore[misc]


def test_agent_rows_are_frozen_dataclasses_with_json_decoded(store: Store) -> None:
    agent, owner = store.agent, (os.getpid(), socket.gethostname(), None)
    made = agent.create_conversation("c1", "birds", "chat-c1", "workspace")
    agent.create_turn("t1", "c1", owner)
    said = agent.add_message("c1", "t1", "user", "text", {"role": "user"}, text="hi", arguments={"k": 1})
    pending = Approval(id="a1", conversation_id="c1", turn_id="t1", call_id="k1", tool="write_memory",
                       arguments={"path": "a"}, summary="write a", blocked=None, status="pending", decided_by=None,
                       reason=None, always=False, created_at=1.0, expires_at=time.time() + 60, decided_at=None,
                       executed_at=None)  # fmt: skip
    recorded = agent.record_approvals("t1", [pending, dataclasses.replace(pending, id="a2", call_id="k2",
                                                                          expires_at=0.0)])  # fmt: skip
    store.uploads.add("u1", "notes.txt", 5)
    agent.attach("c1", ["u1"])
    agent.link_run("c1", "r-gone", "t1")
    agent.save_checkpoint("cp1", "wf", {"format": 1})

    (listed,) = agent.list_conversations()
    assert listed.pending == 2 and dataclasses.replace(listed, pending=None) == agent.get_conversation("c1")
    assert (made.title, made.grants, made.mcp_servers, made.pending) == ("birds", [], [], None)
    turn = agent.get_turn("t1")
    assert turn is not None and turn.status == "paused" and agent.active_turn("c1") == turn
    assert agent.messages("c1") == [said] and (said.af, said.arguments) == ({"role": "user"}, {"k": 1})
    assert agent.get_approval("a1") == recorded[0] and recorded[0].arguments == {"path": "a"}
    (expired,) = agent.expire_approvals(lambda approval: {"call": approval.call_id})
    assert (expired.id, expired.status) == ("a2", "expired")
    decided, claimed = agent.decide_approval("a1", True, "me", None, True, owner)
    assert (decided.status, decided.always, claimed) == ("approved", True, True)
    assert agent.list_approvals(status="approved") == [dataclasses.replace(decided, reason=None)]
    executing = agent.claim_execution("a1")
    assert executing is not None and executing.executed_at is not None
    assert agent.get_conversation("c1").grants == ["write_memory"]  # "always" granted the tool
    assert [e.action for e in agent.audit("c1")] == ["executed", "approved", "expired", "requested", "requested"]
    (run,) = agent.conversation_runs("c1")
    assert (run.run_id, run.status) == ("r-gone", None)  # the run is not kept: its link stays
    assert [(a.upload_id, a.name) for a in agent.attachments("c1")] == [("u1", "notes.txt")]
    checkpoint = agent.load_checkpoint("cp1")
    assert checkpoint is not None and checkpoint.data == {"format": 1}
    assert agent.workflow_checkpoints("wf") == [checkpoint]
    for found in (made, turn, said, recorded, expired, decided, executing, agent.audit("c1"), run, checkpoint):
        assert _frozen(found), found
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.title = "fish"  # type: ignore[misc]


# -- the writer thread ----------------------------------------------------------


def _held(store: Store) -> threading.Event:
    """Hold the writer thread until the returned event is set, so what follows is queued together."""
    holding, release = threading.Event(), threading.Event()
    store.submit(lambda: (holding.set(), release.wait(30)))
    assert holding.wait(10)
    return release


def test_a_failing_write_leaves_its_batch_neighbours(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    store.runs.create(_run("r1"))
    release = _held(store)
    store.runs.queue_event("r1", "warning", {"n": 1})
    missing = store.submit(store.runs.update, "ghost", status="failed")
    store.runs.queue_event("ghost", "warning", {})  # no such run: dropped, and said so
    store.runs.queue_event("r1", "warning", {"n": 2})
    answered = store.submit(store.runs.update, "r1", answer="a")
    release.set()
    with pytest.raises(KeyError, match="ghost"):
        missing.result(10)
    assert answered.result(10) is None
    store.flush()
    assert [(e["seq"], e["data"]) for e in store.runs.events("r1")] == [(1, {"n": 1}), (2, {"n": 2})]
    assert store.runs.get("r1").answer == "a"
    assert "no run 'ghost'; runs.create() before appending events" in caplog.text


def test_a_lone_failing_write_is_undone_and_never_published(store: Store) -> None:
    """A batch of one job commits without a savepoint; when that job fails, nothing of it stays."""
    store.runs.create(_run("r1"))
    seen: list[Event] = []
    store.add_listener(seen.extend)

    def append_then_fail() -> None:
        store.runs.append_event("r1", "warning", {"n": 1})  # joins the open transaction
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.submit(append_then_fail).result(10)
    store.runs.append_event("r1", "warning", {"n": 2})  # the writer goes on
    store.flush()
    assert [(e["seq"], e["data"]) for e in store.runs.events("r1")] == [(1, {"n": 2})]
    assert [e["data"] for e in seen if e["kind"] == "warning"] == [{"n": 2}]


@pytest.mark.anyio
async def test_write_awaits_the_commit_and_a_cancelled_caller_does_not_undo_it(store: Store) -> None:
    await store.write(store.runs.create, _run("r1"))
    assert store.runs.get("r1") is not None  # committed when write() returns
    release = await asyncio.to_thread(_held, store)
    waiting = asyncio.create_task(store.write(store.runs.update, "r1", status="running"))
    await asyncio.sleep(0.05)
    waiting.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.to_thread(store.flush)
    assert store.runs.get("r1").status == "running"


def test_migration_to_a_global_event_order_keeps_every_event(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:2]:  # a store written by the fleet-rlm before the global order
        step(conn)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO runs (id, status, created_at) VALUES ('old', 'succeeded', 1.0)")
    for seq, ts in ((1, 5.0), (2, 6.0)):
        conn.execute(
            "INSERT INTO events (run_id, seq, ts, kind, node, depth, data_json)"
            " VALUES ('old', ?, ?, 'warning', 'root', 0, ?)",
            (seq, ts, json.dumps({"seq": seq})),
        )
    conn.close()
    with Store(path) as store:
        assert [(e["seq"], e["data"]) for e in store.runs.events("old")] == [(1, {"seq": 1}), (2, {"seq": 2})]
        assert store.runs.append_event("old", "warning", {})["seq"] == 3
        events, cursor = store.runs.events_since(0, 10)
    assert [e["seq"] for e in events] == [1, 2, 3] and cursor == 3


def test_events_since_follows_every_run_by_one_cursor(tmp_path: Path) -> None:
    with Store(tmp_path / "fleet.db") as here, Store(tmp_path / "fleet.db") as there:
        here.runs.create(_run("mine"))
        there.runs.create(_run("theirs"))
        here.runs.append_event("mine", "warning", {})
        start = here.runs.event_cursor()
        assert here.runs.events_since(start, 10) == ([], start)
        for _ in range(3):
            there.runs.append_event("theirs", "warning", {})
            here.runs.append_event("mine", "warning", {})
        events, cursor = here.runs.events_since(start, 10)
        assert [(e["run_id"], e["seq"]) for e in events] == [("theirs", 1), ("mine", 2), ("theirs", 2), ("mine", 3),
                                                             ("theirs", 3), ("mine", 4)]  # fmt: skip
        # This store's own runs reach its listeners live: a tail can leave them out.
        assert here.runs.writes("mine") and not here.runs.writes("theirs")
        others, same = here.runs.events_since(start, 10, others_only=True)
        assert [e["seq"] for e in others] == [1, 2, 3] and same == cursor
        first_page, after = here.runs.events_since(start, 4)
        assert first_page == events[:4] and here.runs.events_since(after, 10)[0] == events[4:]
        here.runs.delete("mine")  # deleted events' places are never reused
        there.runs.append_event("theirs", "warning", {})
        assert [e["seq"] for e in here.runs.events_since(cursor, 10)[0]] == [4]
