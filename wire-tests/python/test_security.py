"""pymongo with credentials against Sluice with authorization enabled: the first user made
through mongod's localhost exception, then SCRAM-SHA-256 and SCRAM-SHA-1 logins, a wrong
password refused with 18, and an unauthorized write refused with 13. Each test runs in the
static layout and in the secured cluster layout (`sluice demo --cluster` with a keyfile
between the config server, the shard servers and the router; the users file is the config
server's, which keeps the users in its admin.system.users)."""

import os
import tempfile

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import Process, free_port


@pytest.fixture(scope="module", params=["static", "cluster"])
def secured(request):
    tmp = tempfile.mkdtemp(prefix="sluice-sec-")
    users = os.path.join(tmp, "users.json")
    config = os.path.join(tmp, "sluice.toml")
    security = f'authorization = "enabled"\nusers_file = "{users}"\n'
    args = ["--shards", "2"]
    if request.param == "cluster":
        key = os.path.join(tmp, "keyfile")
        with open(key, "w") as f:
            f.write("c2VjdXJpdHktc3VpdGUtY2x1c3Rlci1rZXk\n")
        os.chmod(key, 0o600)
        security += f'key_file = "{key}"\n'
        args.append("--cluster")
    else:
        args.append("--static")
    with open(config, "w") as f:
        f.write(f'metrics_listen = ""\n[security]\n{security}')
    port = free_port()
    p = Process(["demo", "--port", str(port), *args, "--config", config], port)
    p.users = users
    yield p
    p.stop()


def login(p, user, pwd, **kw):
    kw.setdefault("serverSelectionTimeoutMS", 5000)
    return pymongo.MongoClient(p.uri, username=user, password=pwd, authSource="admin", **kw)


def test_first_user_then_both_mechanisms(secured):
    anon = secured.client()
    with pytest.raises(OperationFailure) as e:
        anon.test.c.insert_one({"_id": 0})
    assert e.value.code == 13
    assert e.value.details["errmsg"] == "Command insert requires authentication"
    anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
    # The exception closes once a user exists.
    with pytest.raises(OperationFailure) as e:
        anon.admin.command("createUser", "other", pwd="x", roles=[])
    assert e.value.code == 13
    with open(secured.users) as f:
        text = f.read()
    assert "admin.root" in text and "rootpw" not in text

    root = login(secured, "root", "rootpw")
    root.admin.command("createUser", "app", pwd="apppw", roles=[{"role": "readWrite", "db": "shop"}])
    root.admin.command("createUser", "viewer", pwd="viewpw", roles=[{"role": "read", "db": "shop"}],
                       mechanisms=["SCRAM-SHA-1"])
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-1"):
        app = login(secured, "app", "apppw", authMechanism=mech)
        app.shop.orders.insert_one({"mech": mech})
        status = app.admin.command("connectionStatus")
        assert status["authInfo"]["authenticatedUsers"] == [{"user": "app", "db": "admin"}]
    viewer = login(secured, "viewer", "viewpw")
    assert viewer.shop.orders.count_documents({}) == 2
    with pytest.raises(OperationFailure) as e:
        viewer.shop.orders.insert_one({"x": 1})
    assert e.value.code == 13
    assert e.value.details["errmsg"].startswith("not authorized on shop to execute command { insert: \"orders\"")


def test_wrong_password_is_18(secured):
    bad = login(secured, "app", "wrong")
    with pytest.raises(OperationFailure) as e:
        bad.admin.command("ping")
    assert e.value.code == 18
    assert "Authentication failed." in str(e.value)
