"""`sluice --config` with `sluice shard` processes: sharding through the router, metadata
persisted across a restart, a contradicting shard list refused; and `sluice hash`."""

import os
import subprocess
import tempfile

import pytest
from bson import Int64

from conftest import SLUICE_BIN, Process, free_port


@pytest.fixture(scope="module")
def shard_processes():
    procs = []
    for i in range(3):
        port = free_port()
        procs.append(Process(["shard", "--port", str(port), "--set-name", f"shard{i}"], port))
    yield procs
    for p in procs:
        p.stop()


def write_config(path, router_port, shards, metadata):
    lines = [f'listen = "127.0.0.1:{router_port}"', f'metadata_path = "{metadata}"', ""]
    for i, s in enumerate(shards):
        lines += ["[[shards]]", f'id = "shard{i}"', f'address = "127.0.0.1:{s.port}"', ""]
    lines += ["[[collections]]", 'ns = "app.items"', "key = '{\"_id\": \"hashed\"}'", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def chunk_layout(client):
    coll = client.config.collections.find_one({"_id": "app.items"})
    return coll["uuid"], [(c["min"], c["max"], c["shard"]) for c in client.config.chunks.find({"uuid": coll["uuid"]}).sort("min", 1)]


def test_cluster_config_persists_metadata_across_restarts(shard_processes, tmp_path):
    metadata = tmp_path / "meta.bson"
    config = tmp_path / "cluster.toml"
    port = free_port()
    write_config(config, port, shard_processes, metadata)
    router = Process(["--config", str(config)], port)
    try:
        client = router.client()
        uuid, layout = chunk_layout(client)
        assert len(layout) == 6
        assert [s for _, _, s in layout] == ["shard0", "shard0", "shard1", "shard1", "shard2", "shard2"]
        client.admin.command("shardCollection", "app.more", key={"k": "hashed"}, numInitialChunks=5)
        client.close()
    finally:
        router.stop()
    assert metadata.exists()

    router = Process(["--config", str(config)], port)
    try:
        client = router.client()
        uuid2, layout2 = chunk_layout(client)
        assert uuid2 == uuid, "the same collection, not a new one"
        assert layout2 == layout
        more = client.config.collections.find_one({"_id": "app.more"})
        assert client.config.chunks.count_documents({"uuid": more["uuid"]}) == 5
        client.close()
    finally:
        router.stop()

    # A shard list that contradicts the persisted metadata is refused at start-up.
    reordered = [shard_processes[1], shard_processes[0], shard_processes[2]]
    write_config(config, port, reordered, metadata)
    out = subprocess.run([SLUICE_BIN, "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "contradict the persisted metadata" in out.stderr + out.stdout


def test_unknown_config_fields_are_refused(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('listen = "127.0.0.1:1"\nmax_conections = 5\n')
    out = subprocess.run([SLUICE_BIN, "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "max_conections" in out.stderr


@pytest.mark.parametrize(
    "value,expected",
    [
        ("42", -944302157085130861),
        ('{"$numberLong": "42"}', -944302157085130861),
        ("42.123", -944302157085130861),
        ('"abc"', 8478485326885698097),
        ("null", 2338878944348059895),
        ('{"a": "abc", "b": {"$numberLong": "123"}}', 4771603801758380216),
        ('["bar", "baz", "qux"]', -2938911267422831539),
        ('{"$minKey": 1}', 7961148599568647290),
        ('{"$maxKey": 1}', 5504842513779440750),
        ('{"$timestamp": {"t": 0, "i": 0}}', -7867208682377458672),
    ],
)
def test_sluice_hash_prints_the_number_long(value, expected):
    out = subprocess.run([SLUICE_BIN, "hash", value], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == expected


def test_sluice_hash_rejects_bad_json():
    out = subprocess.run([SLUICE_BIN, "hash", "{not json"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "not valid extended JSON" in out.stderr
