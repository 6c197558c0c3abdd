"""Fixtures for the pymongo suites: a Sluice router (and later embedded shards) started as a
separate process on a free loopback port, stopped when the tests end."""

import os
import socket
import subprocess
import tempfile
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
        # The output goes to a file, never to a pipe nobody reads: once a pipe's buffer is
        # full, every thread that logs blocks on it and the process stops answering. The file
        # stays for a failed run to be read.
        self.log = tempfile.NamedTemporaryFile(prefix="sluice-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [SLUICE_BIN, *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice exited early:\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sluice did not start listening within 20 s")

    def output(self):
        """What the process has written so far (its log file: `self.log.name`)."""
        with open(self.log.name, errors="replace") as f:
            return f.read()

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
        self.log.close()


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
    p = Process(["shard", "--port", str(port), "--set-name", "shardA", "--enable-test-commands"], port)
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


class Demo(Process):
    """`sluice demo` (3 embedded shards) with a configuration file for its policies."""

    def shard_clients(self):
        """Direct connections to every member of the demo's shards (replica sets), from
        listShards: counters summed over them are the shards' totals."""
        client = self.client()
        hosts = [
            h
            for s in client.admin.command("listShards")["shards"]
            for h in s["host"].split("/", 1)[-1].split(",")
        ]
        client.close()
        return [pymongo.MongoClient(f"mongodb://{h}/?directConnection=true") for h in hosts]

    def shard_command_total(self, name):
        total = 0
        for c in self.shard_clients():
            total += c.admin.command("serverStatus")["metrics"]["commands"].get(name, {}).get("total", 0)
            c.close()
        return total


def start_demo(directory, overrides, *args):
    """`sluice demo` on a free port, its `ordered_rewrite_overrides` (namespace -> policy) written
    to a configuration file in `directory`; `args` are more command-line arguments."""
    config = directory / "policies.toml"
    config.write_text(
        "[ordered_rewrite_overrides]\n" + "".join(f'"{ns}" = "{p}"\n' for ns, p in overrides.items())
    )
    port = free_port()
    return Demo(["demo", "--port", str(port), "--config", str(config), *args], port)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    p = start_demo(tmp_path_factory.mktemp("demo"), {"demo.p_off": "off", "demo.p_always": "always"})
    yield p
    p.stop()
