"""docs/reference/fault-kinds.md: the fault catalog, kind by kind."""

from __future__ import annotations

from chaos.docgen.markdown import code, header, table
from chaos.faults import catalog
from chaos.faults.registry import fault_class

INTRO = """
Every fault kind a suite, a seeded campaign or a profile can name, from the catalog
(`chaos/faults/catalog.py`). *Charged to*: the retry budget Ray Train should charge one fault
of the kind to (a profile's `faults.<kind>.expected_budget` overrides it; *none*: no charge is
expected). *SLOs*: seconds from the injection until the fault is detected and until the first
report of the next attempt, which a profile's `faults:` entries override (on the embedded
cluster, without a profile, a suite's SLOs are `--chaos-slo-detect`/`--chaos-slo-recover`). *Needs*:
the backend capability the kind needs; a session whose backend lacks it skips the kind's tests,
saying why. *In campaigns*: how a seeded campaign (`-m soak`) draws the kind, or why it never
does. *Root on the host*: what the kind does on its target host over SSH that needs root
([below](#privileges)); a session refuses the kind on a host that cannot give it, before
injecting anything. How to call each kind and its arguments: [python-api.md](python-api.md#fault-kinds).
"""

PRIVILEGES_INTRO = """## Privileges

What a kind runs as root on a host reached over SSH: as the login user when that is root, else
through `sudo -n` when the host's `ssh.become` is `sudo` ([profiles.md](../profiles.md#privileges-sudo)). `ray-chaos doctor`
checks each host for the kinds a profile enables, and a session asks each host once before its
first injection there: a kind whose privileges a host cannot get is refused, naming the kind,
the host, the privilege and the fix.

"""


def _charged(k: catalog.FaultKind) -> str:
    if k.budget_class is None:
        return "none"
    return f"{code(k.budget_class)} ({code(catalog.limit_name(k.budget_class))})"


def _drawn(k: catalog.FaultKind) -> str:
    if k.draw is None:
        return f"never: {k.not_drawn}"
    params = "; ".join(f"{code(p)} from {', '.join(map(str, values))}" for p, values in k.draw.params.items())
    return "drawn" + (f" ({params})" if params else "")


def _kinds() -> str:
    rows = [(code(k.name), _charged(k), f"{k.slo_detect_s:g} / {k.slo_recover_s:g}",
             code(k.needs) if k.needs else "hosts only", ", ".join(map(code, k.privileges)) or "none", _drawn(k),
             code(f"{fault_class(k.name).__module__}.{fault_class(k.name).__name__}"))
            for k in catalog.KINDS.values()]
    return table(["kind", "charged to", "SLOs detect / recover (s)", "needs", "root on the host", "in campaigns",
                  "injected by"], rows)


def _races() -> str:
    rows = [(code(k.name), code(k.race_charge), k.race_why) for k in catalog.KINDS.values() if k.race_charge]
    return ("## Charges Ray may make instead, by a race in Ray\n\n"
            "*within-budget* accepts these only for a fault of that kind, and says so in the verdict.\n\n"
            + table(["kind", "may be charged to", "why"], rows))


def render() -> str:
    return (header("Fault kinds", "`chaos/faults/catalog.py` and the fault classes", INTRO)
            + _kinds() + _races()
            + "## Budget classes\n\nRay Train V2's three retry budgets, and the `FailureConfig` field that limits "
              "each.\n\n"
            + table(["class", "limit"], [(code(c), code(f)) for c, f in catalog.BUDGET_LIMIT_FIELDS.items()])
            + PRIVILEGES_INTRO
            + table(["privilege", "what it lets the kind do"], [(code(p), w) for p, w in catalog.PRIVILEGES.items()])
            + "## Capabilities\n\n"
            + table(["capability", "what the backend gives"], [(code(c), w) for c, w in catalog.CAPABILITIES.items()])
            + "## Why a kind is never drawn into a campaign\n\n"
            + table(["reason", "why"], [(code(r), w) for r, w in catalog.NOT_DRAWN.items()]))
