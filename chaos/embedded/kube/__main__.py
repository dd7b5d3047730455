"""Run the emulated API server as its own process: ``python -m chaos.embedded.kube [--kubeconfig PATH]``.

Prints one JSON line ``{"url": ..., "pid": ...}`` once listening, then serves (with no
container runtime) until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from chaos.embedded.kube.kubeconfig import write_kubeconfig
from chaos.embedded.kube.server import ApiServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.embedded.kube", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--kubeconfig", help="also write a kubeconfig for this server here")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with ApiServer(port=args.port) as server:
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, server.url)
        print(json.dumps({"url": server.url, "pid": os.getpid()}), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
