"""A correlated SSH reboot fanned out to 1, 8 and 32 test hosts, side by side in one run.

Each round reboots k test hosts (no Ray on them) the way a correlated node-reboot fault
does: one `NodeReboot` member per host, injected through `chaos.faults.correlated.fan_out`
(a thread per member behind a barrier), each member reading the boot id and issuing
`systemctl reboot` over SSH exactly as `NodeReboot.inject` does.  Per k it prints, from
the barrier's release:

- returned: the last member's inject returned (boot id read, reboot command sent; the
  step the experiment waits for before it moves on) — the aim is 32 hosts within 1.3x of one;
- spread:   how far apart the members left the barrier (the "same instant", measured);
- down:     the last host's boot ended (the test host's own power event, not a poll);
- answering: the last host answered over SSH with a new boot id (polled every 0.3 s, as
  NodeReboot.after_detect does).

The hosts share this machine's CPUs with the harness, so their own work (an sshd session
per command, which also runs root's ~/.bashrc; a namespace torn down per reboot) grows
with k here, where real hosts would each bring their own.
Needs root (namespaces, a bridge).  Uses its own bridge ``rcbench`` on 198.18.250.0/24 and
removes it, its hosts and their processes (by PID) when it ends.
Run: .venv/bin/python bench/bench_fanout.py [--ks 1 8 32] [--repeat N] [--boot-delay S]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BRIDGE = "rcbench"
SUBNET = "198.18.250.0/24"
MAX_HOSTS = 32
UP_POLL_S = 0.3  # NodeReboot.after_detect's poll interval


@dataclasses.dataclass(frozen=True)
class Round:
    """One fan-out to k hosts, seconds from the barrier's release."""

    k: int
    returned_s: float
    spread_s: float
    down_s: float
    answering_s: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 8, 32], help="fan-out widths (default: 1 8 32)")
    p.add_argument("--repeat", type=int, default=1, help="rounds per width; the table shows medians (default 1)")
    p.add_argument("--boot-delay", type=float, default=1.0,
                   help="seconds a rebooted host stays off before it boots again (default 1.0)")
    args = p.parse_args(argv)
    bad = [k for k in args.ks if not 1 <= k <= MAX_HOSTS]
    if bad:
        p.error(f"--ks {bad}: each width must be 1-{MAX_HOSTS} (the bench's subnet holds {MAX_HOSTS} hosts)")
    if args.repeat < 1:
        p.error(f"--repeat {args.repeat}: must be >= 1")
    if args.boot_delay < 0:
        p.error(f"--boot-delay {args.boot_delay}: must be >= 0")
    args.ks = sorted(set(args.ks))
    return args


def table(rounds: Sequence[Round]) -> str:
    """Medians per k, each time also as a ratio to the smallest k's."""
    by_k: dict[int, list[Round]] = {}
    for r in rounds:
        by_k.setdefault(r.k, []).append(r)
    if not by_k:
        return "(no rounds)"
    fields = ("returned_s", "down_s", "answering_s")
    med = {k: {f: statistics.median(getattr(r, f) for r in rs) for f in fields + ("spread_s",)}
           for k, rs in sorted(by_k.items())}
    base = med[min(med)]
    lines = [f"{'k':>3} {'rounds':>6} {'returned s':>11} {'x':>6} {'spread ms':>10} {'down s':>8} {'x':>6} "
             f"{'answering s':>12} {'x':>6}"]
    for k, m in med.items():
        ratio = {f: m[f] / base[f] if base[f] > 0 else float("nan") for f in fields}
        lines.append(f"{k:>3} {len(by_k[k]):>6} {m['returned_s']:>11.3f} {ratio['returned_s']:>6.2f} "
                     f"{m['spread_s'] * 1000:>10.1f} {m['down_s']:>8.3f} {ratio['down_s']:>6.2f} "
                     f"{m['answering_s']:>12.3f} {ratio['answering_s']:>6.2f}")
    return "\n".join(lines)


class _TestHosts:
    """The backend calls `NodeReboot.inject` makes, for test hosts without Ray: `boot_id` is
    the Backend's own (a new SSH connection per read), `connect` the embedded backend's."""

    def __init__(self, network):
        self.network = network

    def connect(self, key: str):
        from chaos.transport.ssh import SSHTransport

        return SSHTransport(key, key_filename=str(self.network.ssh_key_path),
                            known_hosts=str(self.network.known_hosts_path), use_agent=False)

    def boot_id(self, host) -> str:
        from chaos.backends.base import Backend

        return Backend.boot_id(self, host)


def measure(network, hosts, backend: _TestHosts, timeout_s: float = 120.0) -> Round:
    """Reboot ``hosts`` at once through the harness's fan-out; wait until each answers again."""
    from chaos.backends.base import Host
    from chaos.embedded.testhost import HostState
    from chaos.errors import TransportError
    from chaos.cluster import Target
    from chaos.faults.base import FaultContext, Injection
    from chaos.faults.correlated import fan_out, spread_s
    from chaos.faults.reboot import NodeReboot
    from chaos.timeline import Timeline
    from chaos.waits import poll_until

    ctx = FaultContext(cluster=None, timeline=Timeline(), backend=backend)
    # As in a session: one handle per host with a shared transport not yet connected.
    injs = [Injection(NodeReboot(rank=i), Target(node_id=f"bench-{h.name}", node_ip=h.address, rank=i, host=h.name),
                      Host(key=h.address, name=h.name, transport=backend.connect(h.address), console=h))
            for i, h in enumerate(hosts)]
    boots = {h.name: h.boot_count for h in hosts}
    results = fan_out(injs, lambda inj: inj.fault.inject(ctx, inj), start_timeout_s=30.0)
    failed = [r.line() for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"fan-out to {len(hosts)} hosts: {len(failed)} failed: " + "; ".join(failed))
    released = min(r.issued_t for r in results)
    returned = max(r.issued_t + r.took_s for r in results)

    def back(inj: Injection) -> float:
        before = inj.evidence["boot_id_before"]

        def check():
            try:
                b = backend.boot_id(inj.host)
            except TransportError as e:
                return None, str(e).splitlines()[0]
            return (time.time() if b != before else None), f"boot id {b}"
        return poll_until(check, timeout_s, f"{inj.target.host} to answer with a new boot id", interval=UP_POLL_S)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(injs)) as pool:
        answering = max(pool.map(back, injs))
    for h in hosts:
        h.wait_down(boot=boots[h.name], timeout=timeout_s)
    down = max(next(e.time for e in h.events if e.boot_count == boots[h.name] and e.state is HostState.OFF)
               for h in hosts)
    return Round(len(hosts), returned - released, spread_s(results), down - released, answering - released)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from chaos.embedded.testhost import TestHostNetwork, testhosts_supported

    # Polling a rebooting host fails until it is back: expected, and not worth a log line.
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)

    ok, why = testhosts_supported()
    if not ok:
        print(f"bench_fanout: cannot run test hosts here: {why}", file=sys.stderr)
        return 2
    state = Path(tempfile.mkdtemp(prefix="rcbench-"))  # holds the hosts' SSH key: removed at the end
    network = TestHostNetwork(state, bridge=BRIDGE, subnet=SUBNET, boot_delay=args.boot_delay, boot_timeout=30)
    try:
        network.up()
        hosts = [network.add_host(f"rcb-{i + 1}") for i in range(max(args.ks))]
        t0 = time.monotonic()
        for h in hosts:
            h.boot(wait=False)
        for h in hosts:
            h.wait_up(timeout=60)
        print(f"{len(hosts)} test hosts up in {time.monotonic() - t0:.1f} s on {BRIDGE} ({SUBNET}); "
              f"boot delay {args.boot_delay} s")
        backend = _TestHosts(network)
        rounds = []
        for _ in range(args.repeat):
            for k in args.ks:
                rounds.append(measure(network, hosts[:k], backend))
                print(f"  k={k}: returned {rounds[-1].returned_s:.3f} s, answering {rounds[-1].answering_s:.3f} s",
                      flush=True)
        print(f"\nSSH reboot fanned out through chaos.faults.correlated.fan_out, seconds from the barrier "
              f"(median of {args.repeat}; x = ratio to k={args.ks[0]})")
        print(table(rounds))
        return 0
    finally:
        try:
            network.close()
        finally:
            TestHostNetwork.sweep(BRIDGE)
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
