"""Start-up check for one conformance target.

Runs pymongo's own test set-up, `test.client_context.init()` from the unmodified source
distribution, against the server named by DB_IP/DB_PORT, exactly as every test of the suites does
first. It reports whether that set-up completes (if it raises, every test of every suite errors
with the same exception), what it detected (topology, version, test commands, sessions), and the
answers to the server-side commands the unified runner relies on. Run with the source
distribution as the working directory and on PYTHONPATH; prints one JSON document.
"""

import json
import os
import sys
import traceback


def describe_exception(exc):
    """The exception and the innermost frame of the suite's code that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = None
    for frame in reversed(frames):
        if frame.filename.startswith(os.getcwd()):
            rel = os.path.relpath(frame.filename)
            where = f"{rel}:{frame.lineno} in {frame.name}: {frame.line}"
            break
    return {"error": f"{type(exc).__name__}: {exc}", "where": where}


def probe(client, command):
    """One admin command's outcome: ok, or the server's error code and message."""
    import pymongo.errors

    try:
        reply = client.admin.command(command)
        return {"ok": True, "reply": reply}
    except pymongo.errors.OperationFailure as exc:
        return {"ok": False, "code": exc.code, "errmsg": (exc.details or {}).get("errmsg")}
    except pymongo.errors.PyMongoError as exc:
        return {"ok": False, "errmsg": f"{type(exc).__name__}: {exc}"}


def capabilities(host, port):
    """What the suites' set-up and runner ask of the server, answered by the server itself."""
    import pymongo

    client = pymongo.MongoClient(host, port, directConnection=True, serverSelectionTimeoutMS=5000)
    try:
        hello = probe(client, {"hello": 1})
        params = probe(client, {"getParameter": "*"})
        build = probe(client, {"buildInfo": 1})
        failpoint = probe(client, {"configureFailPoint": "failCommand", "mode": "off"})
        kill = probe(client, {"killAllSessions": []})
    finally:
        client.close()
    hello_reply = hello.get("reply", {})
    param_reply = params.get("reply", {})
    return {
        "hello.msg": hello_reply.get("msg"),
        "hello.setName": hello_reply.get("setName"),
        "hello.logicalSessionTimeoutMinutes": hello_reply.get("logicalSessionTimeoutMinutes"),
        "hello.maxWireVersion": hello_reply.get("maxWireVersion"),
        "buildInfo.version": build.get("reply", {}).get("version"),
        "getParameter('*').enableTestCommands": param_reply.get("enableTestCommands", "absent")
        if params["ok"]
        else f"error {params.get('code')}: {params.get('errmsg')}",
        "configureFailPoint(failCommand, off)": "ok"
        if failpoint["ok"]
        else f"error {failpoint.get('code')}: {failpoint.get('errmsg')}",
        "killAllSessions": "ok" if kill["ok"] else f"error {kill.get('code')}: {kill.get('errmsg')}",
    }


def main():
    sys.path.insert(0, os.getcwd())
    host = os.environ.get("DB_IP", "localhost")
    port = int(os.environ.get("DB_PORT", "27017"))
    out = {"address": f"{host}:{port}", "started": False}
    try:
        from test import client_context

        client_context.init()
        if not client_context.connected:
            out["error"] = "could not connect: " + client_context.connection_attempt_info()
        else:
            out["started"] = True
    except Exception as exc:  # the suite's set-up failed: say how, as every test will
        out.update(describe_exception(exc))
        from test import client_context
    cc = client_context
    if cc.is_mongos:
        topology = "sharded"
    elif cc.is_rs:
        topology = "replicaset"
    elif cc.connected:
        topology = "single"
    else:
        topology = None
    out["detected"] = {
        "topology": topology if out["started"] else None,
        "version": ".".join(str(p) for p in cc.version[:3]) if cc.version[0] >= 0 else None,
        "test_commands_enabled": cc.test_commands_enabled,
        "sessions_enabled": cc.sessions_enabled,
        "replica_set_name": cc.replica_set_name,
    }
    try:
        out["server"] = capabilities(host, port)
    except Exception as exc:
        out["server"] = describe_exception(exc)
    if cc.client is not None:
        cc.client.close()
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
