"""A local tf.distribute cluster for multi-worker runs: ports and TF_CONFIG."""

from __future__ import annotations

import json
import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that are free right now.

    All are held open until all are chosen, so none repeats; another
    program could still take one before a worker binds it (the run then
    fails, it is never compared).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_config(ports: list[int], worker: int) -> str:
    """The `TF_CONFIG` of worker `worker` of a loopback cluster on `ports`."""
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": worker},
        }
    )
