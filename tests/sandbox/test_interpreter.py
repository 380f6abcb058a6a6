"""The dspy CodeInterpreter adapter, alone and driven by stock dspy.RLM."""

from __future__ import annotations

import os
import threading

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import pytest
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreter,
    CodeInterpreterError,
    FinalOutput,
)
from dspy.utils import DummyLM
from dspy.utils.callback import BaseCallback

from fleet_rlm.sandbox.interpreter import SandboxInterpreter


@pytest.fixture
def interp():
    interpreter = SandboxInterpreter()
    yield interpreter
    interpreter.shutdown()


def test_protocol_results_and_errors(interp):
    assert isinstance(interp, CodeInterpreter)
    assert interp.execute("x = 2") is None
    assert interp.execute("print('hello')\nx * 21") == "hello\n42"
    assert interp.execute("y = n + 1\ny", variables={"n": 9}) == 10  # plain data comes back as a value
    assert interp.execute("{'k': [1, 2.5, None]}") == {"k": [1, 2.5, None]}
    assert interp.execute("object") == "<class 'object'>"  # anything else as its repr
    with pytest.raises(SyntaxError, match="line 1"):
        interp.execute("def (")
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError") as info:
        interp.execute("print('partial')\n1/0")
    assert "partial" in str(info.value)
    assert interp.execute("SUBMIT('done')") == FinalOutput({"output": "done"})  # as dspy's interpreters give it
    interp.output_fields = [{"name": "a"}, {"name": "b", "type": "int"}]
    assert interp.execute("SUBMIT(1, b=2)") == FinalOutput({"a": 1, "b": 2})


def test_sync_tools_are_called_concurrently_and_can_change(interp):
    lock = threading.Lock()
    running, peak = 0, 0
    gate = threading.Barrier(4, timeout=10)

    def shout(text: str) -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        gate.wait()  # only returns once 4 calls run at the same time
        with lock:
            running -= 1
        return text.upper()

    interp.tools.update({"shout": shout})
    interp._tools_registered = False
    code = "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(4) as p:\n"
    code += "    out = list(p.map(shout, ['a', 'b', 'c', 'd']))\nout"
    assert interp.execute(code) == ["A", "B", "C", "D"]
    assert peak == 4
    interp.tools["shout"] = lambda text: text + "!"
    assert interp.execute("shout('hi')") == "hi!"
    interp.tools.pop("shout")
    with pytest.raises(CodeExecutionError, match="no longer available"):
        interp.execute("shout('gone')")


def test_big_variables_are_sent_once(interp):
    big = "x" * (5 * 1024 * 1024)
    interp.start()
    sandbox = interp._sandbox
    before = sandbox.bytes_sent
    for _ in range(3):  # RLM re-binds its inputs on every iteration
        assert interp.execute("len(context)", variables={"context": big}) == len(big)
    assert len(big) <= sandbox.bytes_sent - before < len(big) + 10_000
    assert interp.execute("len(context)", variables={"context": big + "y"}) == len(big) + 1


def test_shutdown_cleans_up_and_dead_worker_is_terminal():
    interp = SandboxInterpreter()
    work_dir = interp.work_dir
    interp.execute("open('f.txt', 'w').write('x')")
    assert (work_dir / "f.txt").exists()
    with pytest.raises(CodeInterpreterError) as info:
        interp.execute("import os\nos._exit(1)")
    assert not isinstance(info.value, CodeExecutionError)
    assert "start a new session" in str(info.value)
    interp.shutdown()
    interp.shutdown()
    assert not work_dir.exists()


def test_stock_rlm_runs_on_the_sandbox():
    steps = [
        {
            "reasoning": "Look at the data first.",
            "code": "print('chars:', len(context))\nprint(context[:5])",
        },
        {
            "reasoning": "Ask a sub-LM and a sandbox sub-agent.",
            "code": (
                "summary = llm_query('Summarize: ' + context[:50])\n"
                "import dspy\n"
                "pred = dspy.Predict('question -> answer')(question=query)\n"
                "print(summary)\nprint(pred.answer)"
            ),
        },
        {
            "reasoning": "Submit.",
            "code": "SUBMIT(answer=pred.answer + ' / ' + summary.split()[-1])",
        },
    ]
    # One scripted LM, in call order: two steps, llm_query, the sandbox's Predict, the last step.
    # It is set with dspy.context only, so the host tools must run in the caller's context to see it.
    answers = [*steps[:2], {"answer": "forty-two"}, {"answer": "from-predict"}, steps[2]]
    rlm = dspy.RLM("context, query -> answer", max_iters=5, interpreter_factory=lambda: SandboxInterpreter())
    with dspy.context(lm=DummyLM(answers)):
        result = rlm(context="hello world " * 1000, query="what is it?")
    assert result.answer == "from-predict / forty-two"
    outputs = [entry["output"] for entry in result.trajectory]
    assert outputs[0].startswith("chars: 12000\nhello")
    assert "forty-two" in outputs[1] and "from-predict" in outputs[1]


# -- dspy's contract, as LocalInterpreter keeps it ----------------------------------------------------


@pytest.mark.parametrize("name", ["not-valid", "class", "SUBMIT", "__builtins__"])
def test_invalid_tool_names_fail_at_construction_and_before_the_sandbox_starts(name):
    with pytest.raises(ValueError, match="invalid names"):
        SandboxInterpreter(tools={name: lambda: 1})
    interp = SandboxInterpreter()
    try:
        interp.tools[name] = lambda: 1
        with pytest.raises(ValueError, match="invalid names"):
            interp.execute("1")
        assert interp._sandbox is None  # refused before anything started
        interp.tools = {}
        assert interp.execute("6 * 7") == 42
        assert interp.execute("SUBMIT(1)") == FinalOutput({"output": 1})  # SUBMIT is still the interpreter's
    finally:
        interp.shutdown()


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ([{"name": "class"}], "identifiers"),
        ([{"name": "a"}, {"name": "a"}], "unique"),
        ([{"type": "str"}], "identifiers"),
        ([{"name": "a", "default": object()}], "JSON-compatible"),
    ],
)
def test_output_fields_are_checked_at_construction_and_execute(fields, match):
    with pytest.raises(ValueError, match=match):
        SandboxInterpreter(output_fields=fields)
    interp = SandboxInterpreter()
    try:
        interp.output_fields = fields
        with pytest.raises(ValueError, match=match):
            interp.execute("1")
        assert interp._sandbox is None
    finally:
        interp.shutdown()


def test_reserved_variable_names_are_refused_before_the_sandbox_starts():
    interp = SandboxInterpreter(tools={"add": lambda left, right: left + right})
    try:
        for variables in ({"class": 1}, {"SUBMIT": "shadowed"}, {"__builtins__": {}}, {"add": "shadowed"}):
            with pytest.raises(CodeInterpreterError, match="invalid names"):
                interp.execute("1", variables=variables)
            assert interp._sandbox is None
        assert interp.execute("add(19, 23)") == 42
        assert interp.execute("SUBMIT(42)") == FinalOutput({"output": 42})
    finally:
        interp.shutdown()


class Recorder(BaseCallback):
    def __init__(self):
        self.events = []

    def on_interpreter_execute_start(self, call_id, instance, inputs):
        self.events.append(("execute_start", inputs["code"]))

    def on_interpreter_execute_end(self, call_id, outputs, exception=None):
        self.events.append(("execute_end", outputs))

    def on_interpreter_tool_call_start(self, call_id, instance, inputs):
        self.events.append(("tool_start", inputs["tool_name"]))

    def on_interpreter_tool_call_end(self, call_id, outputs, exception=None):
        self.events.append(("tool_end", outputs))


def test_dspy_callbacks_see_executions_and_tool_calls():
    own = Recorder()
    with SandboxInterpreter(tools={"answer": lambda: 42}, callbacks=[own]) as interp:
        assert interp.execute("answer()") == 42
    assert own.events == [
        ("execute_start", "answer()"),
        ("tool_start", "answer"),
        ("tool_end", 42),
        ("execute_end", 42),
    ]

    ambient = Recorder()  # how MLflow's and OpenInference's DSPy tracing register theirs
    with dspy.context(callbacks=[ambient]), SandboxInterpreter(tools={"answer": lambda: 42}) as interp:
        interp.execute("answer()")
    assert ("execute_start", "answer()") in ambient.events and ("tool_end", 42) in ambient.events


def test_stock_rlm_executions_reach_dspy_callbacks():
    steps = [
        {"reasoning": "Add.", "code": "total = add(left=19, right=23)"},
        {"reasoning": "Done.", "code": "SUBMIT(str(total))"},
    ]

    def add(*, left: int, right: int) -> int:
        return left + right

    recorder = Recorder()
    rlm = dspy.RLM("question -> answer", max_iters=3, tools=[add], interpreter_factory=SandboxInterpreter)
    with dspy.context(lm=DummyLM(steps), callbacks=[recorder]):
        assert rlm(question="What is 19 + 23?").answer == "42"
    started = [code for kind, code in recorder.events if kind == "execute_start"]
    assert started[-2:] == [s["code"] for s in steps] and ("tool_start", "add") in recorder.events


def test_deliberate_differences_from_local_interpreter():
    """As docs/python-api.md states them: a timeout keeps the session, printed output keeps its newline."""
    with SandboxInterpreter(exec_timeout=1) as interp:
        interp.execute("kept = 7")
        with pytest.raises(CodeExecutionError, match="TimeoutError"):
            interp.execute("import time\ntime.sleep(30)")
        assert interp.execute("kept") == 7
        assert interp.execute("print('x')") == "x\n"
