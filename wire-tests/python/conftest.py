"""Fixtures for the pymongo suites: a Sluice router (and later embedded shards) started as a
separate process on a free loopback port, stopped when the tests end."""

import os
import socket
import subprocess
import time

import pymongo
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target", "debug", "sluice"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A sluice process and the address it listens on."""

    def __init__(self, args, port):
        self.port = port
        self.uri = f"mongodb://127.0.0.1:{port}/"
        if not os.path.exists(SLUICE_BIN):
            raise RuntimeError(f"{SLUICE_BIN} is missing: build it with `cargo build` first")
        self.proc = subprocess.Popen(
            [SLUICE_BIN, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode(errors="replace")
                raise RuntimeError(f"sluice exited early:\n{out}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sluice did not start listening within 20 s")

    def client(self, **kwargs):
        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return pymongo.MongoClient(self.uri, **kwargs)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def router():
    port = free_port()
    p = Process(["--listen", f"127.0.0.1:{port}"], port)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def shard():
    """One embedded shard in its own process, driven directly (not through the router)."""
    port = free_port()
    p = Process(["shard", "--port", str(port), "--set-name", "shardA"], port)
    yield p
    p.stop()


@pytest.fixture
def shard_db(shard):
    """A fresh database on the shard, dropped afterwards."""
    client = shard.client(directConnection=True)
    db = client[f"t_{os.getpid()}_{int(time.time() * 1e6) % 10**9}"]
    yield db
    client.drop_database(db.name)
    client.close()
