"""The Prometheus endpoint: the adaptive-limit gauges move under load against a slowed,
capacity-limited embedded shard, and the documented metric families are exported."""

import threading
import time
import urllib.request

from conftest import Process, free_port


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def gauge(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_limit_gauges_move_under_load(tmp_path):
    shard_port = free_port()
    shard = Process(["shard", "--port", str(shard_port), "--set-name", "shard0", "--max-concurrency", "1", "--latency-per-command", "3ms"], shard_port)
    router_port, metrics_port = free_port(), free_port()
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'listen = "127.0.0.1:{router_port}"\n'
        f'metrics_listen = "127.0.0.1:{metrics_port}"\n'
        "[[shards]]\n"
        'id = "shard0"\n'
        f'address = "127.0.0.1:{shard_port}"\n'
        "[[collections]]\n"
        'ns = "load.items"\n'
        "key = '{\"_id\": \"hashed\"}'\n"
    )
    router = Process(["--config", str(config)], router_port)
    try:
        text = scrape(metrics_port)
        client = router.client(maxPoolSize=32)
        client.load.items.insert_one({"_id": -1})
        assert gauge(scrape(metrics_port), "sluice_shard_adaptive_limit", shard="shard0", op="mutate") == 2.0
        stop = time.time() + 3
        errors = []

        def work(t):
            i = 0
            while time.time() < stop:
                try:
                    client.load.items.insert_one({"_id": t * 1_000_000 + i})
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)
                    return
                i += 1

        # Other clients load the shard directly (as other routers would): executions through
        # this router now queue behind theirs.
        direct = shard.client(directConnection=True, maxPoolSize=32)

        def direct_work(t):
            i = 0
            while time.time() < stop:
                direct.other.items.insert_one({"_id": t * 1_000_000 + i})
                i += 1

        threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
        threads += [threading.Thread(target=direct_work, args=(t,)) for t in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        direct.close()
        text = scrape(metrics_port)
        limit = gauge(text, "sluice_shard_adaptive_limit", shard="shard0", op="mutate")
        ratio = gauge(text, "sluice_shard_execution_latency_ratio", shard="shard0", op="mutate")
        assert limit is not None and limit < 2.0, f"the limit came down under queueing: {limit}"
        assert ratio is not None and ratio > 0
        for family in (
            "sluice_shard_queue_depth",
            "sluice_shard_in_flight",
            "sluice_requests_total",
            "sluice_request_duration_seconds",
            "sluice_connections_open",
            "sluice_bytes_in_total",
            "sluice_bytes_out_total",
            "sluice_child_batches_total",
            "sluice_write_plans_total",
            "sluice_write_rounds_per_bulk",
            "sluice_pool_checkout_wait_seconds",
            "sluice_routing_refreshes_total",
        ):
            assert family in text, family
        client.close()
    finally:
        router.stop()
        shard.stop()
