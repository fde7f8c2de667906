"""The runtime's poll loop (runtime/poll_loop.py) with a scripted consumer, no broker: the
order of a processor's hooks, a failed rebalance callback raised from the loop (never into the
client), readiness once, abandon before the consumer leaves the group, and the record filter."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from unlearn.runtime.poll_loop import PollLoop, coalesce, records


class Consumer:
    """Calls the rebalance callbacks the way librdkafka does: from inside a poll."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.calls = script, []  # type: ignore[var-annotated]
        self.cb: dict[str, Any] = {}

    def subscribe(self, topics: list[str], **cb: Any) -> None:
        self.cb = cb

    def next(self) -> list[Any]:
        step = self.script.pop(0) if self.script else []
        if isinstance(step, tuple):  # ("on_assign", [tp, ...])
            self.cb[step[0]](self, step[1])
            return []
        return step

    def assign(self, partitions: list[Any]) -> None:
        self.calls.append(("assign", len(partitions)))

    def unassign(self) -> None:
        self.calls.append(("unassign",))

    def close(self) -> None:
        self.calls.append(("close",))
        self.cb["on_revoke"](self, ["p0"])


class Poller:
    def poll(self, consumer: Consumer, stop: threading.Event, check: Any) -> list[Any]:
        got = consumer.next()
        if not consumer.script:
            stop.set()
        return got


class Processor:
    def __init__(self, fail_in: str = "") -> None:
        self.fail_in, self.hooks = fail_in, []  # type: ignore[var-annotated]

    def _hook(self, name: str, *args: Any) -> None:
        self.hooks.append(name)
        if name == self.fail_in:
            raise RuntimeError(f"{name} failed")

    def assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._hook("assign")
        consumer.assign(partitions)

    def revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._hook("revoke")

    def lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._hook("lost")

    def process(self, batch: list[Any]) -> None:
        self._hook("process")

    def idle(self) -> None:
        self._hook("idle")

    def tick(self) -> None:
        self._hook("tick")

    def finish(self) -> None:
        self._hook("finish")

    def abandon(self) -> None:
        self._hook("abandon")

    def close(self, clean: bool) -> None:
        self._hook(f"close({clean})")


def test_a_clean_run_calls_the_hooks_in_order_and_is_ready_once() -> None:
    consumer, proc, ready = Consumer([("on_assign", ["p0"]), ["m1", "m2"], [], ("on_assign", ["p0"])]), Processor(), []
    loop = PollLoop(consumer, proc, Poller(), on_ready=lambda: ready.append(1))
    loop.subscribe(["t"])
    loop.run(threading.Event())
    assert proc.hooks == ["assign", "idle", "tick", "process", "tick", "idle", "tick", "assign", "idle", "tick",
                          "finish", "revoke", "close(True)"]
    assert ready == [1] and loop.ready.is_set() and loop.fatal is None


def test_a_failed_assignment_is_raised_by_the_loop_not_into_the_client() -> None:
    consumer, proc = Consumer([("on_assign", ["p0"]), ["m1"]]), Processor(fail_in="assign")
    loop = PollLoop(consumer, proc, Poller())
    loop.subscribe(["t"])
    with pytest.raises(RuntimeError, match="assign failed"):
        loop.run(threading.Event())
    assert ("unassign",) in consumer.calls and not loop.ready.is_set()
    assert "process" not in proc.hooks  # nothing after the failed assignment was processed
    # abandoned before the consumer left the group (whose revocation must not make anything durable)
    assert proc.hooks[-3:] == ["abandon", "revoke", "close(False)"]


def test_a_failure_in_processing_abandons_and_keeps_the_first_error() -> None:
    consumer, proc = Consumer([("on_assign", ["p0"]), ["m1"]]), Processor(fail_in="process")
    loop = PollLoop(consumer, proc, Poller())
    loop.subscribe(["t"])
    with pytest.raises(RuntimeError, match="process failed"):
        loop.run(threading.Event())
    assert "finish" not in proc.hooks and proc.hooks[-3:] == ["abandon", "revoke", "close(False)"]
    assert str(loop.fatal) == "process failed"


def test_a_failed_revocation_stops_the_loop() -> None:
    consumer, proc = Consumer([("on_assign", ["p0"]), ("on_revoke", ["p0"]), ["m1"]]), Processor(fail_in="revoke")
    loop = PollLoop(consumer, proc, Poller())
    loop.subscribe(["t"])
    with pytest.raises(RuntimeError, match="revoke failed"):
        loop.run(threading.Event())
    assert "process" not in proc.hooks


def _msg(err: Any = None) -> Any:
    return SimpleNamespace(error=lambda: err)


def test_records_skips_eof_logs_transient_errors_and_raises_fatal_ones() -> None:
    ok = _msg()
    eof = _msg(KafkaError(KafkaError._PARTITION_EOF))
    transient = _msg(KafkaError(KafkaError._TRANSPORT))
    assert records([ok, eof, transient, ok], "t") == [ok, ok]
    with pytest.raises(KafkaException):
        records([ok, _msg(KafkaError(KafkaError._FATAL, fatal=True))], "t")


def test_coalesce_waits_only_for_the_first_record() -> None:
    calls: list[tuple[int, float]] = []

    class C:
        def consume(self, num_messages: int, timeout: float) -> list[Any]:
            calls.append((num_messages, timeout))
            return [1] if num_messages == 1 else [2, 3]

    assert coalesce(C(), 500, 0.05) == [1, 2, 3]
    assert calls == [(1, 0.05), (499, 0)]


def test_a_slow_turn_is_logged_with_its_parts(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """A turn whose processing and timers, or whose poll that returned records, take longer than
    SLOW_TURN_S is a warning naming each part (every record behind it waited that long); a quick
    one is not, nor an idle poll's wait."""
    import time as clock

    from unlearn.runtime import poll_loop

    monkeypatch.setattr(poll_loop, "SLOW_TURN_S", 0.05)

    class Slow(Processor):
        def process(self, batch: list[Any]) -> None:
            super().process(batch)
            if batch == ["slow"]:
                clock.sleep(0.08)

    consumer = Consumer([["quick"], ["slow"]])
    loop = PollLoop(consumer, Slow(), Poller())
    loop.subscribe(["t"])
    with caplog.at_level("WARNING", logger="unlearn.runtime"):
        loop.turn(threading.Event())
        assert not caplog.records
        loop.turn(threading.Event())
    (rec,) = caplog.records
    assert rec.getMessage().startswith("slow turn: processing ") and "(1 records), timers " in rec.getMessage()

    class SlowPoll(Poller):
        def poll(self, consumer: Consumer, stop: threading.Event, check: Any) -> list[Any]:
            clock.sleep(0.08)
            return super().poll(consumer, stop, check)

    class AssignThenRecords(Poller):
        def poll(self, consumer: Consumer, stop: threading.Event, check: Any) -> list[Any]:
            clock.sleep(0.08)
            consumer.next()  # the assignment, inside the poll as librdkafka runs it
            return consumer.next()

    caplog.clear()
    loop = PollLoop(Consumer([("on_assign", ["p0"]), ["late"]]), Processor(), AssignThenRecords())
    loop.subscribe(["t"])
    with caplog.at_level("WARNING", logger="unlearn.runtime"):
        loop.turn(threading.Event())  # a poll that brought partitions up (their restore): not slow
        assert not caplog.records
    caplog.clear()
    loop = PollLoop(Consumer([[], ["late"]]), Processor(), SlowPoll())
    loop.subscribe(["t"])
    with caplog.at_level("WARNING", logger="unlearn.runtime"):
        loop.turn(threading.Event())  # an idle poll waits by design: not a slow turn
        assert not caplog.records
        loop.turn(threading.Event())
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert msg.startswith("slow turn: processing ") and "(1 records)" in msg
    assert int(msg.rsplit("after a poll of ", 1)[1].split(" ")[0]) >= 80
