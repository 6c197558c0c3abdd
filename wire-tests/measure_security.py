"""What security costs a client, measured side by side with pymongo against `sluice demo`.

    python wire-tests/measure_security.py [--sluice target/release/sluice] [--n 200]
        [--layout static|cluster]

Four routers, one at a time, each over 2 embedded shards: plain; SCRAM-SHA-256 with
authorization enabled; TLS (`tls.mode = "require"`); TLS and SCRAM together. `--layout static`
(the default) runs all four as `sluice demo --static` (one router holding the metadata, users
in its users file); `--layout cluster` runs the first two on the cluster layout (`sluice demo`:
a config server holding the users, shard servers and a `--configdb` router reading the users
from the config server), which does not run with TLS yet. For each it reports
the median time to open a new client and run its first command (connect, handshake and, where
configured, the TLS handshake and the SCRAM conversation) and the median single-document insert
on an open connection. Certificates are made with the openssl command line in a temporary
directory. Not a test: it prints numbers.
"""

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import time

import pymongo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def certificates(tmp):
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=measure CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(tmp, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext")
    with open(os.path.join(tmp, "server.pem"), "w") as out:
        for name in ("server.crt", "server.key"):
            with open(os.path.join(tmp, name)) as f:
                out.write(f.read())


def start(sluice, tmp, name, toml, layout):
    path = os.path.join(tmp, f"{name}.toml")
    with open(path, "w") as f:
        f.write('metrics_listen = ""\n' + toml)
    port = free_port()
    argv = [sluice, "demo", "--port", str(port), "--shards", "2", "--config", path]
    if layout == "static":
        argv.append("--static")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name}: sluice did not start")


def measure(uri, kwargs, n):
    connects = []
    for _ in range(max(n // 4, 20)):
        t = time.perf_counter()
        c = pymongo.MongoClient(uri, **kwargs)
        c.admin.command("ping")
        connects.append(time.perf_counter() - t)
        c.close()
    c = pymongo.MongoClient(uri, maxPoolSize=1, **kwargs)
    coll = c.measure.docs
    coll.insert_one({"warm": True})
    inserts = []
    for i in range(n):
        t = time.perf_counter()
        coll.insert_one({"i": i, "pad": "x" * 100})
        inserts.append(time.perf_counter() - t)
    c.close()
    return statistics.median(connects) * 1000, statistics.median(inserts) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--layout", choices=["static", "cluster"], default="static")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-measure-")
    certificates(tmp)
    users = os.path.join(tmp, "users.json")
    tls = (f'[tls]\nmode = "require"\ncertificate_key_file = "{tmp}/server.pem"\n'
           f'ca_file = "{tmp}/ca.pem"\nallow_connections_without_certificates = true\n')
    auth = f'[security]\nauthorization = "enabled"\nusers_file = "{users}"\n'
    tls_kwargs = {"tls": True, "tlsCAFile": os.path.join(tmp, "ca.pem")}
    cred = {"username": "app", "password": "apppw", "authSource": "admin",
            "authMechanism": "SCRAM-SHA-256"}
    variants = [
        ("plain", "", {}),
        ("SCRAM-SHA-256, authorization on", auth, cred),
        ("TLS", tls, tls_kwargs),
        ("TLS + SCRAM-SHA-256", tls + auth, {**tls_kwargs, **cred}),
    ]
    if args.layout == "cluster":
        variants = variants[:2]
    print(f"| variant | new client + first command (median ms) | single-document insert (median ms) |")
    print("|---|---|---|")
    base = None
    for name, toml, kwargs in variants:
        if os.path.exists(users):
            os.remove(users)
        proc, port = start(args.sluice, tmp, name.split()[0].lower(), toml, args.layout)
        try:
            host = "localhost" if "tls" in kwargs else "127.0.0.1"
            uri = f"mongodb://{host}:{port}/?serverSelectionTimeoutMS=5000"
            if "username" in kwargs:
                setup = pymongo.MongoClient(uri, **{k: v for k, v in kwargs.items() if k.startswith("tls")})
                setup.admin.command("createUser", "app", pwd="apppw", roles=["root"])
                setup.close()
            connect, insert = measure(uri, kwargs, args.n)
        finally:
            proc.terminate()
            proc.wait()
        if base is None:
            base = (connect, insert)
        print(f"| {name} | {connect:.2f} ({connect / base[0]:.2f}×) | {insert:.3f} ({insert / base[1]:.2f}×) |")


if __name__ == "__main__":
    main()
