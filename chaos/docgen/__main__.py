"""``python -m chaos.docgen [--check]``: write docs/reference/ from the code, or only say
which pages are out of date (exit 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chaos import docgen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.docgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the pages that are out of date")
    p.add_argument("--out", type=Path, default=docgen.OUT, help=f"where the pages go (default {docgen.OUT})")
    args = p.parse_args(argv)
    if args.check:
        stale = docgen.stale(args.out)
        for name in stale:
            print(f"{args.out / name}: out of date; run {docgen.REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    changed = docgen.write(args.out)
    print(f"{len(changed)} of {len(docgen.PAGES)} pages under {args.out} rewritten"
          + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
