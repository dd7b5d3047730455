"""`ray-chaos`: the harness's command line (run, report, doctor, ledger, sweep, project)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import chaos
from chaos.errors import ChaosError, ClusterError
from chaos.ledger import CLOSED, Ledger


def _cluster(profile):
    """A profile's cluster-side half of the ledger and its lock (chaos.sweep.Cluster)."""
    from chaos.backends.jobs_store import ClusterLedger, JobsStore
    from chaos.backends.lock import ClusterLock
    from chaos.sweep import Cluster

    store = JobsStore(profile.ray.dashboard_url)
    return Cluster(ClusterLock(profile.ray.dashboard_url, store=store), ClusterLedger(store))


def _ledger(args) -> int:
    ledger = Ledger(Path(args.path))
    local = ledger.entries()
    entries = {k: e for k, e in local.items() if args.all or e["state"] not in CLOSED}
    remote: dict = {}
    if args.profile:
        from chaos.profile import load_profile

        try:
            remote = _cluster(load_profile(args.profile)).ledger.entries()
        except ClusterError as e:
            print(f"could not read the ledger entries kept on the cluster: {e}", file=sys.stderr)
            return 1
        for entry_id, entry in remote.items():  # this runner's file knows better, when it has the entry
            if local.get(entry_id, {}).get("state") not in CLOSED:
                entries.setdefault(entry_id, {**entry, "where": "cluster"})
    for e in entries.values():
        print(json.dumps(e, sort_keys=True))
    if not args.all:
        where = f"{args.path}" + (" and on the cluster" if args.profile else "")
        print(f"{len(entries)} fault(s) not reverted in {where}", file=sys.stderr)
    return 1 if entries and not args.all else 0


def _sweep(args) -> int:
    from chaos import backends
    from chaos.profile import load_profile
    from chaos.sweep import sweep

    # No profile: the embedded backend, whose hosts are this machine (its lock went with its cluster).
    profile = load_profile(args.profile) if args.profile else None
    backend = backends.for_profile(profile)
    try:
        done = sweep(backend, Ledger(Path(args.ledger)), _cluster(profile) if profile else None, say=print)
    finally:
        backend.close_hosts()
    kept = f", {len(done.kept)} left to a live session" if done.kept else ""
    if done.left:
        print(f"sweep: {len(done.left)} fault(s) could not be reverted{kept}")
    elif done.unchecked:
        print(f"sweep: could not check: {'; '.join(done.unchecked)}")
    else:
        print(f"sweep: nothing left armed ({len(done.reverted)} reverted{kept})")
    return 0 if done.ok else 1


DOCTOR_HELP = """\
Check, read-only, what a session on the profile's cluster needs before its first fault: the
Ray dashboard and Jobs API reachable and running the harness's Ray, the cluster's lock free, no
open faults of a lost session on the cluster, nodes the safety rules let a fault target; on
each host (over SSH, with the profile's timeouts): the login, the privileges each enabled fault
kind needs (root, or sudo -n with ssh.become: sudo), the tools it runs, the boot id, where the
CUDA shim goes; on Kubernetes and HyperPod: RBAC and credentials.  Nothing is submitted, locked,
written or changed.  One line per check (✔/✗), under each ✗ the kinds it stops and its fix.

Exit status: 0 every check passed; 1 a check failed (an enabled fault kind cannot run, or none
can: the cluster unreachable, the lock held); 2 the profile is invalid.
"""


def _doctor(args) -> int:
    import time

    from chaos import doctor
    from chaos.profile import load_profile

    t0 = time.monotonic()
    checks = doctor.run(load_profile(args.profile), say=lambda line: print(line, file=sys.stderr, flush=True))
    print(doctor.table(checks), flush=True)  # before the timing line on stderr, where both go to one pipe
    print(f"doctor: {time.monotonic() - t0:.1f} s, nothing changed", file=sys.stderr)
    return doctor.exit_code(checks)


def _positive(kind):
    """argparse type: a finite number > 0 (``kind`` int or float), named in the error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not (value > 0 and value < float("inf")):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
        return value
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _gpu_list(text: str) -> list[int]:
    return [_positive(int)(part.strip()) for part in text.split(",") if part.strip()] or [_positive(int)(text)]


def _project(args) -> int:
    from chaos import projection

    gpus = list(dict.fromkeys(n for group in (args.gpus or [[16384]]) for n in group))
    if args.failure_rate is not None:
        rate = projection.FailureRate(args.failure_rate, "--failure-rate")
    elif args.mtbf_hours is not None:
        rate = projection.FailureRate(1 / args.mtbf_hours, f"--mtbf-hours {args.mtbf_hours:g} (one GPU)")
    else:
        rate = projection.LLAMA3
    inputs = projection.load_inputs(args.summary, interval=args.checkpoint_interval, cost=args.checkpoint_cost,
                                    restart=args.restart_cost)
    work = args.work_days * projection.DAY
    rows = projection.project(inputs, gpus, rate, work=work, reps=args.reps, seed=args.seed)
    print(projection.format_report(inputs, rows, rate, work, args.seed))
    if inputs.elastic is not None:
        compared = projection.compare(inputs, gpus, rate, work=work, gpus_per_node=args.gpus_per_node,
                                      reps=args.reps, seed=args.seed)
        print("\n" + projection.format_comparison(inputs, compared, args.gpus_per_node))
    if args.plot:
        sizes = sorted(set(projection.PLOT_GPUS) | set(gpus))
        out = projection.render_plot(inputs, args.plot, sizes, rate, work=work, reps=args.reps, seed=args.seed)
        print(f"\nplot: {out}")
    return 0


RUN_HELP = """\
Run the standard chaos suites installed with the harness (the package chaos.suites) under
pytest: without --profile on an embedded cluster on this machine (real Ray head and workers;
as root each worker in a test host of its own; the reference workload needs torch: pip install
'ray-chaos-harness[workload]'), with --profile on the cluster it describes.

Arguments that name a suite file or test (test_raylet_kill.py, test_raylet_kill.py::NAME)
select from the installed suites; every other argument goes to pytest as it is: -k, -x,
--chaos-* options (pytest --help lists them), your own test files.  Unless given: -m chaos,
--alluredir reports/allure-results (what `ray-chaos report` reads).

Examples:
  ray-chaos run --profile staging.yaml
  ray-chaos run --profile staging.yaml test_raylet_kill.py -k spare_capacity
  ray-chaos run --collect-only -q                       (list the suites)
The same with pytest: pytest -m chaos --pyargs chaos.suites --chaos-profile staging.yaml.
Your own suite files use the same plugin: pytest -m chaos --chaos-profile staging.yaml my_suite.py
"""


def suites_dir() -> Path:
    """The standard suites: chaos/suites in an installed wheel, suites/ beside chaos/ in a checkout."""
    here = Path(chaos.__file__).resolve().parent
    for candidate in (here / "suites", here.parent / "suites"):
        if (candidate / "__init__.py").is_file():
            return candidate
    raise ChaosError(f"no chaos suites beside {here}: the harness is neither installed from its wheel nor a checkout")


def pytest_args(extra: list[str], profile: str | None, suites: Path, cwd: Path) -> list[str]:
    """``ray-chaos run``'s pytest command line: suite names resolved in ``suites`` (a file of that
    name in ``cwd`` wins), all suites when none is named, and the defaults the user did not set."""
    def suite(arg: str) -> bool:
        path = arg.split("::", 1)[0]
        return (not arg.startswith("-") and path.endswith(".py") and (suites / path).is_file()
                and not (cwd / path).exists())

    def given(option: str) -> bool:
        return any(a == option or a.startswith(f"{option}=") for a in rest)

    named = [str(suites / a) for a in extra if suite(a)]
    rest = [a for a in extra if not suite(a)]
    marked = any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in rest)
    return [*([] if marked else ["-m", "chaos"]), *(named or [str(suites)]), *rest,
            *([] if given("--alluredir") else ["--alluredir", "reports/allure-results"]),
            # test ids (and Allure's history) as `test_raylet_kill.py::...` wherever the venv lives
            *([] if given("--rootdir") else [f"--rootdir={suites}"]),
            *(["--chaos-profile", profile] if profile else []),
            # pytest keeps its cache in the rootdir, which for the installed suites is inside the venv
            "-o", f"cache_dir={cwd / '.pytest_cache'}"]


def _run(args, extra: list[str]) -> int:
    """pytest in this process's place (its signals and exit code are the command's)."""
    argv = [sys.executable, "-m", "pytest", *pytest_args(extra, args.profile, suites_dir(), Path.cwd())]
    print(f"ray-chaos run: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    os.execv(sys.executable, argv)


def _add_run_and_report(sub) -> None:
    from chaos import allure_site

    r = sub.add_parser("run", help="run the standard chaos suites (pytest -m chaos on the installed suites)",
                       description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    r.add_argument("--profile", default=None, help="profile of the cluster under test (default: an embedded cluster)")
    rep = sub.add_parser("report", help="generate the Allure HTML report (with history) from reports/allure-results",
                         description=allure_site.DESCRIPTION)
    allure_site.add_arguments(rep)


def parser() -> argparse.ArgumentParser:
    """``ray-chaos``'s parser, every subcommand on it (the docs' CLI page is generated from it)."""
    p = argparse.ArgumentParser(prog="ray-chaos", description="Chaos testing for Ray Train on real Ray clusters.")
    p.add_argument("--version", action="version", version=f"ray-chaos {chaos.__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run_and_report(sub)
    l = sub.add_parser("ledger", help="list faults that were injected and not reverted")
    l.add_argument("--path", default="reports/ledger.jsonl")
    l.add_argument("--profile", default=None, help="also the open entries kept on this profile's cluster")
    l.add_argument("--all", action="store_true", help="every entry of the file, reverted ones too")
    d = sub.add_parser("doctor", help="check, read-only, that a profile's cluster and hosts can run every enabled "
                                      "fault kind", description=DOCTOR_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--profile", required=True, help="profile of the cluster to check")
    w = sub.add_parser("sweep", help="revert what lost sessions left armed and release a lost session's lock",
                       description="Revert every open fault of a session that is gone (this runner's ledger file "
                                   "and, with --profile, the entries kept on the cluster), never a live session's, "
                                   "then release the lock of a holder that is gone. Exits 1 when a fault could not "
                                   "be reverted or something could not be checked (the cluster unreachable).")
    w.add_argument("--profile", default=None, help="profile of the cluster (how to reach it and its hosts)")
    w.add_argument("--ledger", default="reports/ledger.jsonl", help="this runner's ledger file, if it has one")
    j = sub.add_parser("project", help="project ETTR of a large job from a session's measured recovery figures",
                       description="Project the effective training time ratio (productive / wall time) of a large "
                                   "job from summary.json: Young/Daly analytic and Monte-Carlo (docs/projection.md).")
    j.add_argument("--summary", default="reports/summary.json", help="summary.json of a chaos session")
    j.add_argument("--gpus", type=_gpu_list, action="append", metavar="N[,N...]",
                   help="job size(s) in GPUs; repeatable or comma-separated (default 16384)")
    rate = j.add_mutually_exclusive_group()
    rate.add_argument("--failure-rate", type=_non_negative, metavar="PER_GPU_HOUR",
                      help="interruptions per GPU-hour (default: Llama 3's 419 in 54 days on 16,384 GPUs)")
    rate.add_argument("--mtbf-hours", type=_positive(float), metavar="HOURS",
                      help="mean time between failures of one GPU, in hours (the job's is this / GPUs)")
    j.add_argument("--checkpoint-interval", type=_positive(float), metavar="SECONDS",
                   help="compute seconds between checkpoints (default: measured)")
    j.add_argument("--checkpoint-cost", type=_non_negative, metavar="SECONDS",
                   help="seconds one checkpoint adds (default: measured)")
    j.add_argument("--restart-cost", type=_non_negative, metavar="SECONDS",
                   help="seconds from a failure to training again (default: measured median time to recover)")
    j.add_argument("--gpus-per-node", type=_positive(int), default=8, metavar="G",
                   help="GPUs a lost node takes from an elastic job (fixed vs elastic comparison; default 8)")
    j.add_argument("--work-days", type=_positive(float), default=30.0,
                   help="productive work of the simulated job, in days (default 30)")
    j.add_argument("--reps", type=_positive(int), default=400, help="simulated jobs per point (default 400)")
    j.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")
    j.add_argument("--plot", metavar="PATH", help="also draw ETTR against checkpoint interval to PATH (PNG)")
    return p


def main(argv=None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd == "run":
        return _run(args, extra)
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "report":
        from chaos.allure_site import report

        return report(args)
    try:
        return {"project": _project, "sweep": _sweep, "ledger": _ledger, "doctor": _doctor}[args.cmd](args)
    except ChaosError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
