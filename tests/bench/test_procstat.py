"""CPU time and memory read from /proc: whole processes, threads included."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from sluice.bench.procstat import CpuMeter, read_cpu_s, read_rss_kib
from sluice.bench.report import format_cpu

BURN_S = 0.2


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _no_such_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)  # exited and reaped: nothing has this pid now (for a while)


def test_cpu_of_a_thread_counts_for_its_process() -> None:
    before = read_cpu_s(os.getpid())
    assert before is not None
    worker = threading.Thread(target=_burn, args=(BURN_S,))
    worker.start()
    worker.join()
    after = read_cpu_s(os.getpid())
    assert after is not None
    # The thread has ended; the process still owns its CPU time.
    assert after - before >= BURN_S * 0.9


def test_unreadable_processes_give_none() -> None:
    pid = _no_such_pid()
    assert read_cpu_s(pid) is None
    assert read_rss_kib(pid) is None
    rss = read_rss_kib(os.getpid())
    assert rss is not None
    assert rss > 1000


def test_meter_reports_cpu_per_window_and_per_message() -> None:
    me = os.getpid()
    meter = CpuMeter()
    meter.start([me])
    _burn(BURN_S)
    meter.stop([me])
    report = meter.report(me, {"self": me}, messages=1000)
    assert report is not None
    broker = report["broker"]
    assert broker["pid"] == me
    assert broker["cpu_s"] >= BURN_S * 0.9
    assert 0 < broker["utilization"] <= 1.5
    assert broker["us_per_msg"] == round(broker["cpu_s"] * 1e6 / 1000, 3)
    generator = report["generator"]
    assert generator["cpu_s"] == broker["cpu_s"]
    assert [p["name"] for p in generator["processes"]] == ["self"]
    assert report["wall_s"] >= report["broker"]["cpu_s"] * 0.9


def test_meter_counts_late_processes_from_zero_and_marks_vanished_ones() -> None:
    me = os.getpid()
    gone = _no_such_pid()
    meter = CpuMeter()
    _burn(0.05)
    meter.start([])  # this process "was not there yet": its whole CPU time counts
    meter.stop([me, gone])
    report = meter.report(None, {"self": me, "gone": gone}, messages=0)
    assert report is not None
    assert report["broker"] is None
    processes = {p["name"]: p for p in report["generator"]["processes"]}
    total = read_cpu_s(me)
    assert total is not None
    # All of it since the process started, not only since `start`.
    assert 0 < processes["self"]["cpu_s"] <= total
    assert processes["self"]["us_per_msg"] is None  # no messages
    assert processes["gone"]["cpu_s"] is None
    assert report["generator"]["cpu_s"] is None  # a sum with a process missing is no sum


def test_cpu_lines_name_the_window_and_skip_what_is_unknown() -> None:
    window = {
        "wall_s": 2.0,
        "broker": {"pid": 1, "cpu_s": 1.5, "utilization": 0.75, "us_per_msg": 15.0},
        "generator": {"cpu_s": None, "utilization": None, "us_per_msg": None, "processes": []},
    }
    assert format_cpu("measured", window) == [
        "broker CPU (measured, 2.00 s): 1.50 s, 75% of one core, 15.0 us per message"
    ]
    window["broker"] = {"pid": 1, "cpu_s": 0.5, "utilization": None, "us_per_msg": None}
    assert format_cpu("held", window) == ["broker CPU (held, 2.00 s): 0.50 s"]
    assert format_cpu("measured", None) == ["CPU (measured): not measured"]
