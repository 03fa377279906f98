"""A RabbitMQ node of a test's own (Debian's `rabbitmq-server`, as the machine's node runs it):
its own node name, free ports on 127.0.0.1, data, logs and Erlang cookie in the test's folder,
so it can be stopped, restarted and wiped without touching the node other tests share."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.db import wait_for
from tests.support.ports import free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


@dataclass
class Node:
    folder: Path
    name: str
    port: int
    dist_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.folder),  # its Erlang cookie
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "data"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
            "RABBITMQ_PID_FILE": str(self.folder / "pid"),
        }

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "plugins").write_text("[].\n")
        with (self.folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [SERVER], env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self.answers, 90, f"RabbitMQ node {self.name} to listen on {self.port}")

    def answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def ctl(self, *args: str) -> str:
        cookie = (self.folder / ".erlang.cookie").read_text().strip()
        done = subprocess.run(
            ["rabbitmqctl", "-n", self.name, "--erlang-cookie", cookie, *args],
            env=self._env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def queue_types(self) -> dict[str, str]:
        lines = self.ctl("list_queues", "name", "type", "--quiet", "--no-table-headers")
        return dict(line.split("\t")[:2] for line in lines.splitlines() if "\t" in line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def wipe_and_restart(self) -> None:
        """Killed, its data gone, started again: a node back without a message or queue."""
        self.stop()
        shutil.rmtree(self.folder / "data", ignore_errors=True)
        self.start()


@contextmanager
def rabbitmq_node(folder: Path) -> Iterator[Node]:
    if not Path(SERVER).exists():
        raise RuntimeError("rabbitmq-server is not installed (apt install rabbitmq-server)")
    port = free_port()
    node = Node(folder, f"dtask-{uuid.uuid4().hex[:8]}@localhost", port, free_port())
    try:
        node.start()
        yield node
    finally:
        node.stop()
