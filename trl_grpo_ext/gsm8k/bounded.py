r"""Answer checking in bounded time, on any thread.

math-verify (sympy) can take unbounded time on some answers (``\binom{10000000}{5000000}``: 189 s for
``\binom{1000000}{500000}``), and its own timeout uses ``signal.alarm``, which works only in the main thread: TRL
runs async reward functions in a worker thread, where math-verify runs without any timeout (Math-Verify #50, #55;
TRL PR #5281; verl PR #5839). Here each answer's whole check (extraction, parsing, comparison) gets
`ANSWER_TIMEOUT_S` seconds:

* in the main thread, under a ``SIGALRM`` timer (as math-verify's own timeout, but one timer around the whole check,
  math-verify's own disabled);
* in any other thread, in a worker process (``python -m trl_grpo_ext.gsm8k.bounded``, `worker_main`, started on
  first use and kept), killed and restarted when an answer runs out of time. A subprocess, not ``multiprocessing``:
  that would re-import the user's script (spawn) or fork a process holding CUDA and threads.

An answer given up on counts as wrong (the caller's `default`), and the caller says how many it gave up on.
"""

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

ANSWER_TIMEOUT_S = 5.0  # seconds one answer's check may take, as math-verify's default parse and verify timeouts
_WORKER_MODULE = "trl_grpo_ext.gsm8k.bounded"


class _Expired(BaseException):
    """Raised by the main thread's timer; a BaseException, so that math-verify's `except Exception` lets it pass."""


def _on_alarm(signum, frame):
    raise _Expired


def _signals_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _run_with_alarm(function: Callable, args: Sequence, default, timeout: float) -> tuple[object, bool]:
    """(function(*args), False), or (default, True) if it ran past `timeout` seconds. Main thread only."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return function(*args), False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        return default, True
    finally:
        signal.signal(signal.SIGALRM, previous)


class _Worker:
    """One worker process (`worker_main`): JSON lines in (``[name, args]``), JSON lines out (``[result]``)."""

    def __init__(self):
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # where `trl_grpo_ext` can be imported from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", _WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout, self.replies), daemon=True).start()
        try:  # the worker says it is ready once sympy and math-verify are imported
            ready = self.replies.get(timeout=_STARTUP_S)
        except queue.Empty:
            ready = None
        if ready is None:
            self.close()
            raise RuntimeError(f"the answer worker did not start within {_STARTUP_S:.0f} s")

    @staticmethod
    def _read(stream, replies: queue.Queue) -> None:
        for line in stream:
            replies.put(line)
        replies.put(None)  # the process ended

    def call(self, name: str, args: Sequence, timeout: float):
        """The worker's `name`(*args); raises `TimeoutError` past `timeout` seconds, `RuntimeError` if it died."""
        self.process.stdin.write(json.dumps([name, list(args)]) + "\n")
        self.process.stdin.flush()
        try:
            line = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(name) from None
        if line is None:
            raise RuntimeError(f"the answer worker ended (exit code {self.process.poll()})")
        return json.loads(line)[0]

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


# The first check from a thread starts the worker (about 1 s: sympy and math-verify are imported there); it serves
# every thread, one call at a time.
_worker: _Worker | None = None
_worker_lock = threading.Lock()
_STARTUP_S = 60.0  # seconds a new worker may take to import sympy and math-verify (~1 s)


def _close_worker() -> None:
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


atexit.register(_close_worker)


def _run_in_worker(name: str, calls: Sequence[Sequence], default, timeout: float) -> tuple[list, int]:
    global _worker
    results, gave_up = [], 0
    with _worker_lock:
        for args in calls:
            try:
                _worker = _worker or _Worker()
                results.append(_worker.call(name, args, timeout))
            except (TimeoutError, RuntimeError, OSError, ValueError):
                _close_worker()
                results.append(default)
                gave_up += 1
    return results, gave_up


def run_bounded(function: Callable, calls: Sequence[Sequence], default, timeout: float | None = None):
    """`function`(*args) for each `args` of `calls`, each given `timeout` seconds (`ANSWER_TIMEOUT_S` when None).

    Args:
        function: a module-level function of `trl_grpo_ext.gsm8k.rewards` taking and returning JSON values (it is
            called by name in the worker process off the main thread).
        calls: the argument tuples, one per answer.
        default: the result of a call given up on.

    Returns:
        (results: one per call, in order; gave_up: how many calls ran out of time and got `default`). A call of n
        answers returns within about n x `timeout` seconds (plus a worker start, ~1 s, off the main thread, after
        each give-up). Never raises for what `function` does.
    """
    timeout = ANSWER_TIMEOUT_S if timeout is None else timeout
    if _signals_usable():
        outcomes = [_run_with_alarm(function, args, default, timeout) for args in calls]
        return [result for result, _ in outcomes], sum(expired for _, expired in outcomes)
    return _run_in_worker(function.__name__, calls, default, timeout)


def worker_main() -> None:
    """The worker process: ``python -m trl_grpo_ext.gsm8k.bounded``. Reads JSON lines ``[name, args]`` from stdin
    and answers each with the JSON line ``[rewards.<name>(*args)]`` on stdout, after a first line saying it is ready.
    Anything else the libraries print goes to stderr, so that stdout holds only replies. The parent kills it when a
    call runs out of time."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # a library's print must not corrupt the replies
    import logging

    from . import rewards

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # no timeout here: the parent's is the bound
    replies.write("ready\n")
    for line in sys.stdin:
        name, args = json.loads(line)
        replies.write(json.dumps([rewards.BOUNDED[name](*args)]) + "\n")


if __name__ == "__main__":
    worker_main()
