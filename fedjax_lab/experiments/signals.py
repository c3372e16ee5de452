"""Stopping cleanly on Ctrl-C (SIGINT) and SIGTERM: the signal sets a flag, the host loop checks it between
compiled blocks, writes what it has (metrics, a checkpoint) and stops; a second signal stops at once.

Python runs a signal handler only between bytecodes, so a handler alone would wait for a long XLA compilation
or block to return, and JAX's C++ code may swallow the ``KeyboardInterrupt`` a default handler raises. The
interpreter's C-level handler also writes the signal's number to a wake-up pipe (:func:`signal.set_wakeup_fd`)
the moment it arrives; a small thread reads it and says what will happen. On a second signal the command line
ends the process (exit ``128 + signal``: the run resumes from its last checkpoint, a torn metrics line is
dropped); elsewhere (a notebook, a script) it raises ``KeyboardInterrupt`` in the main thread.
"""

from __future__ import annotations

import _thread
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(Exception):
    """A signal asked the run to stop; raised by :meth:`StopOnSignal.check` between blocks."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class RunInterrupted(Exception):
    """A run (or sweep) was stopped by a signal; its results up to ``last_round`` are on disk and ``resume``
    is the command that continues it. The command line exits with ``128 + signum`` (130 Ctrl-C, 143
    SIGTERM)."""

    def __init__(self, run_dir: Path, last_round: int, signum: int = signal.SIGINT, checkpointed: bool = True,
                 resume: str | None = None):
        resume = resume or resume_command(run_dir)
        since = "" if checkpointed else " (--resume continues from its last checkpoint)"
        super().__init__(f"interrupted ({signal.Signals(signum).name}); results up to round {last_round} are "
                         f"in {run_dir}{since}; resume with:\n  {resume}")
        self.run_dir, self.last_round, self.signum = run_dir, last_round, signum


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``."""
    run_dir = shlex.quote(str(run_dir))
    return f"fedjax-lab run {run_dir}/config.yaml --run-dir {run_dir} --resume"


EXIT_ON_SECOND_SIGNAL = False
"""Whether a second signal ends the process at once (``os._exit``): set by the command line, which owns its
process. In a notebook or a script the second signal raises ``KeyboardInterrupt`` in the main thread
instead."""

REPEAT_WINDOW_S = 0.5
"""A signal this soon after the first counts as the same one: a wrapper that forwards the terminal's Ctrl-C to
its own process group delivers it twice."""


def _ignore(signum: int, frame) -> None:
    pass


def exit_at_once(signum: int, frame=None) -> None:
    """A signal handler that ends the process with ``128 + signum`` (the command line, once its results are
    written: an impatient Ctrl-C then does not raise inside JAX's clean-up)."""
    os._exit(128 + signum)


class StopOnSignal:
    """Context manager: while active, SIGINT and SIGTERM set :attr:`signum` instead of raising; the host loop
    calls :meth:`check` between blocks. Outside the main thread (where Python cannot install handlers) it does
    nothing and the default behaviour stays. Nested uses share the outer one."""

    _active: StopOnSignal | None = None

    def __init__(self, what: str = "the run"):
        self.what = what
        self._signum: int | None = None
        self._outer: StopOnSignal | None = None
        self._count = 0
        self._first_at = 0.0
        self._raised = False
        self._installed = False

    @property
    def signum(self) -> int | None:
        """The first signal that arrived, or ``None``."""
        return self._outer.signum if self._outer is not None else self._signum

    def __enter__(self) -> StopOnSignal:  # noqa: PYI034 - not subclassed
        if StopOnSignal._active is not None:
            self._outer = StopOnSignal._active
            return self
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._reader = threading.Thread(target=self._read, daemon=True, name="fedjax-lab signals")
        self._reader.start()
        self._installed = True
        StopOnSignal._active = self
        return self

    def _read(self) -> None:
        read = self._pipe[0]
        while True:
            try:
                data = os.read(read, 16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if (signum not in SIGNALS
                        or self._count and time.monotonic() - self._first_at < REPEAT_WINDOW_S):
                    continue
                self._count += 1
                name = signal.Signals(signum).name
                if self._count == 1:
                    self._signum, self._first_at = signum, time.monotonic()
                    print(f"\nfedjax-lab: {name}: stopping {self.what} after the current block, once its "
                          "results are written (again to stop at once, losing the rounds since the last "
                          "checkpoint)", file=sys.stderr, flush=True)
                elif EXIT_ON_SECOND_SIGNAL:
                    print(f"\nfedjax-lab: {name} again: stopping at once; --resume continues from the last "
                          "checkpoint", file=sys.stderr, flush=True)
                    os._exit(128 + signum)
                else:  # the Python handler may have run before this count: have it run (again) now
                    _thread.interrupt_main()

    def _handle(self, signum: int, frame) -> None:
        """The Python-level handler, run for each signal in the main thread between bytecodes: nothing on the
        first, which the reader thread has seen; ``KeyboardInterrupt`` once the reader has counted a
        second."""
        if self._count >= 2 and not self._raised:
            self._raised = True  # once: the signal itself and the reader's nudge may both land here
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raises :class:`StopRequested` if a signal arrived."""
        if self.signum is not None:
            raise StopRequested(self.signum)

    def __exit__(self, *exc) -> None:
        self._outer = None
        if not self._installed:
            return
        for s in SIGNALS:  # a handler call still pending (the reader's nudge) lands here, not in the next one
            signal.signal(s, _ignore)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._pipe[1])  # ends the reader
        self._reader.join(timeout=1)
        os.close(self._pipe[0])
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        StopOnSignal._active = None
        self._installed = False
