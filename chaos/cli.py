"""`ray-chaos`: the harness's command line (report, ledger, sweep)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chaos.ledger import Ledger


def _ledger(args) -> int:
    ledger = Ledger(Path(args.path))
    entries = ledger.open_entries() if not args.all else list(ledger.entries().values())
    for e in entries:
        print(json.dumps(e, sort_keys=True))
    if not args.all:
        print(f"{len(entries)} fault(s) not reverted in {args.path}", file=sys.stderr)
    return 1 if entries and not args.all else 0


def _sweep(args) -> int:
    from chaos import backends
    from chaos.ledger import sweep

    if args.profile:
        from chaos.profile import load_profile

        backend = backends.for_profile(load_profile(args.profile))
    else:
        backend = backends.EmbeddedBackend()  # an embedded cluster's hosts are this machine
    try:
        left = sweep(Ledger(Path(args.ledger)), backend)
    finally:
        backend.close_hosts()
    print(f"sweep: {len(left)} fault(s) could not be reverted" if left else "sweep: nothing left armed")
    return 1 if left else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ray-chaos", description="Chaos testing for Ray Train on real Ray clusters.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="generate the Allure HTML report (with history) from reports/allure-results",
                       add_help=False)
    r.add_argument("rest", nargs=argparse.REMAINDER)
    l = sub.add_parser("ledger", help="list faults that were injected and not reverted")
    l.add_argument("--path", default="reports/ledger.jsonl")
    l.add_argument("--all", action="store_true", help="every entry, reverted ones too")
    w = sub.add_parser("sweep", help="revert whatever a killed session left armed (from the ledger)")
    w.add_argument("--profile", default=None, help="profile of the cluster (how to reach its hosts)")
    w.add_argument("--ledger", default="reports/ledger.jsonl")
    args = p.parse_args(argv)
    if args.cmd == "sweep":
        from chaos.errors import ChaosError

        try:
            return _sweep(args)
        except ChaosError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.cmd == "report":
        from chaos.allure_site import main as report_main

        return report_main(args.rest)
    return _ledger(args)


if __name__ == "__main__":
    sys.exit(main())
