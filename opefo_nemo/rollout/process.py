"""One rollout server child process, seen from the client: start, request/reply, stop
(docs/rollout.md, "Robustness").
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from opefo_nemo.rollout.environment import server_pythonpath, site_directories
from opefo_nemo.rollout.protocol import PROTOCOL_VERSION, ProtocolError, recv_message, send_message

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class RolloutServerError(RuntimeError):
    """A rollout server failed, died, timed out or reported an error."""


class ServerProcess:
    """A started (not yet ready) server; call :meth:`wait_ready` next. It runs in its own process
    group (so stopping it also stops anything it started), talks over one end of a
    ``socketpair`` it inherits, and writes its output to a log file whose tail is quoted in every
    error. Its ``PYTHONPATH`` reaches this package's sources only when they are a source tree,
    never the trainer's site-packages (``environment.py``). Any transport failure (timeout, dead
    process, broken message) raises :class:`RolloutServerError`; the caller must then stop the
    server, since a late reply would otherwise be read as the answer to a later request."""

    def __init__(
        self, index: int, python: str, server_args: list[str], env: dict[str, str], log_path: Path
    ) -> None:
        self.index = index
        self.log_path = log_path
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sites = site_directories()
        env = {
            **env,
            "PYTHONPATH": server_pythonpath(str(_PACKAGE_ROOT), env.get("PYTHONPATH"), sites),
        }
        trainer = ["--trainer-prefix", sys.prefix]
        for directory in sites:
            trainer += ["--trainer-site", directory]
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        python,
                        "-m",
                        "opefo_nemo.rollout.server",
                        "--fd",
                        str(child_sock.fileno()),
                        *server_args,
                        *trainer,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    pass_fds=(child_sock.fileno(),),
                    start_new_session=True,
                )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        self.sock = parent_sock
        self.info: dict = {}
        self.in_flight = True  # until the ready message: a request the server has not answered

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> dict:
        """Wait for the server's ``ready`` message and check the protocol version."""
        reply = self._receive(time.monotonic() + timeout_s, "start-up")
        if reply.get("protocol") != PROTOCOL_VERSION:
            raise self._error(
                f"speaks protocol {reply.get('protocol')!r}, this client speaks {PROTOCOL_VERSION}"
            )
        self.info = reply
        return reply

    def send(self, message: dict) -> None:
        self.in_flight = True
        try:
            send_message(self.sock, message)
        except OSError as exc:
            raise self._error(f"could not be sent {message.get('op')!r} ({exc})") from exc

    def receive(self, timeout_s: float, what: str) -> dict:
        return self._receive(time.monotonic() + timeout_s, what)

    def request(self, message: dict, timeout_s: float) -> dict:
        self.send(message)
        return self.receive(timeout_s, repr(message.get("op")))

    def _receive(self, deadline: float, what: str) -> dict:
        try:
            reply = recv_message(self.sock, deadline, poll=self._check_alive)
        except TimeoutError as exc:
            raise self._error(f"did not answer {what} within the timeout") from exc
        except ProtocolError as exc:
            self._wait_exit(2.0)
            raise self._error(f"broke the connection during {what} ({exc})") from exc
        self.in_flight = False
        if not reply.get("ok"):
            raise self._error(f"reported an error during {what}:\n{reply.get('error')}")
        return reply

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ProtocolError(f"process exited with code {self.proc.returncode}")

    def _wait_exit(self, timeout_s: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)

    def _error(self, what: str) -> RolloutServerError:
        status = "running" if self.proc.poll() is None else f"exit code {self.proc.returncode}"
        return RolloutServerError(
            f"rollout server {self.index} (pid {self.pid}, {status}) {what}\n"
            f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask the server to exit; kill its process group if it does not. Idempotent.

        A server still busy with a request (start-up included) is not asked: it would only read
        the request when done, so it is sent SIGTERM (then SIGKILL) at once.
        """
        if self.proc.poll() is None and not self.in_flight:
            with contextlib.suppress(OSError):
                send_message(self.sock, {"op": "shutdown"})
            self._wait_exit(grace_s)
        for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            if not process_group_alive(self.pid):
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            self._wait_exit(wait_s)
            deadline = time.monotonic() + wait_s
            while process_group_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._wait_exit(1.0)
        self.sock.close()


def process_group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still exists (zombies excluded)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
