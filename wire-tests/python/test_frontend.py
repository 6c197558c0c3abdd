"""pymongo against the router alone: the handshake, topology discovery, compression."""

import pymongo
import pytest
from pymongo.errors import OperationFailure


def test_topology_is_sharded(router):
    client = router.client()
    client.admin.command("ping")
    assert client.topology_description.topology_type_name == "Sharded"
    (server,) = client.topology_description.server_descriptions().values()
    assert server.server_type_name == "Mongos"
    client.close()


def test_server_info_is_a_mongodb_8(router):
    client = router.client()
    info = client.server_info()
    assert info["version"].startswith("8.0")
    assert info["versionArray"][:2] == [8, 0]
    assert "version" in info["sluice"]
    client.close()


def test_ping_and_hello(router):
    client = router.client()
    assert client.admin.command("ping")["ok"] == 1.0
    hello = client.admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert hello["isWritablePrimary"] is True
    assert hello["maxWireVersion"] == 25
    assert "$clusterTime" in client.admin.command("ping")
    client.close()


def test_unknown_command_is_command_not_found(router):
    client = router.client()
    with pytest.raises(OperationFailure) as err:
        client.admin.command("noSuchCommand")
    assert err.value.code == 59
    assert err.value.details["codeName"] == "CommandNotFound"
    assert err.value.details["errmsg"] == "no such command: 'noSuchCommand'"
    client.close()


@pytest.mark.parametrize("compressor", ["snappy", "zlib", "zstd"])
def test_each_compressor_is_negotiated_and_used(router, compressor):
    client = router.client(compressors=compressor)

    def counters():
        status = client.admin.command("serverStatus")
        c = status["network"]["compression"][compressor]
        return c["decompressor"]["bytesIn"], c["compressor"]["bytesOut"]

    before = counters()
    for _ in range(3):
        assert client.admin.command("ping")["ok"] == 1.0
    after = counters()
    assert after[0] > before[0], "requests arrived compressed"
    assert after[1] > before[1], "replies were compressed"
    client.close()


def test_server_status_counts_connections(router):
    client = router.client()
    status = client.admin.command("serverStatus")
    assert status["process"] == "mongos"
    assert status["connections"]["current"] >= 1
    assert status["opcounters"]["command"] >= 1
    client.close()
