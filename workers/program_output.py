"""A program's stdout or stderr, read by the worker through a pipe and kept as its last part.

A program writing straight to a log file on the checkpoint store can fill the store in
seconds (1 GB in 15 s of 1 MiB writes was seen), and every GPU's checkpoints with it. So its
output goes into a pipe that a thread of the worker reads, keeping only the last `keep` bytes
(CLOCKQ_COMMAND_LOG_KEEP_KB) in memory; the worker writes that tail to the work folder's log
when the program stops, replacing the file atomically. A log is therefore never larger than
`keep`, across every start of the program, and a program that writes faster than the worker
reads simply waits on its pipe.
"""

from __future__ import annotations

import contextlib
import os
import threading

READ_BYTES = 1 << 16
JOIN_TIMEOUT_S = 5.0  # a process outside the sandbox's namespace may hold the pipe (no sandbox)


class OutputTail:
    """The last `keep` bytes of one stream: what was kept from before (`previous`) and what the
    program writes to `write_fd` (give it to the program, then call `started()`)."""

    def __init__(self, keep: int, previous: bytes = b""):
        self.keep = keep
        self._buffer = bytearray(previous[-keep:] if previous else b"")
        self._since_start = 0  # bytes this run of the program wrote
        self._lock = threading.Lock()
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._read, name="clockq-program-output", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The program has its end of the pipe: the worker's copy is closed, so that the pipe
        reads as ended when the program's last process is gone."""
        self._close_write()

    def finish(self) -> bytes:
        """Wait for the end of the output (the program is gone), and the kept tail."""
        self._close_write()
        self._thread.join(JOIN_TIMEOUT_S)
        with self._lock:
            return bytes(self._buffer[-self.keep :])

    def recent(self, limit: int) -> bytes:
        """At most the last `limit` bytes this run of the program wrote."""
        with self._lock:
            return bytes(self._buffer[-min(limit, self._since_start, self.keep) :]) if self._since_start else b""

    def _read(self) -> None:
        try:
            while chunk := os.read(self.read_fd, READ_BYTES):
                with self._lock:
                    self._buffer += chunk
                    self._since_start += len(chunk)
                    if len(self._buffer) > 2 * self.keep:  # trimmed now and then, not per read
                        del self._buffer[: -self.keep]
        except OSError:
            pass
        finally:
            os.close(self.read_fd)

    def _close_write(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1
