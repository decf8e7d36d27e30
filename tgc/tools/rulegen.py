"""tgc-rulegen: generate rewrite rules TASO's way and write them as a `.tg` rule table.

Enumerates every graph of up to `--max-ops` ops over `--inputs` square inputs, groups them by
their float64 values on one random draw, verifies each candidate equality on many more draws
and several rectangular shape instantiations, prunes renamings and instances of kept rules,
and writes the survivors (passes/rulegen/, docs/rulegen.md). The report on stderr gives the
counts, the time and which hand-written rules were rediscovered.
"""

from __future__ import annotations

import argparse
import sys
import time

import tgc
from tgc.diagnostics import TgcError
from tgc.pass_manager import PipelineError
from tgc.tools._common import EXIT_OK, add_common_flags, guarded, non_negative_int, parse_args


def build_arg_parser() -> argparse.ArgumentParser:
    from tgc.passes.rulegen.enumerate import DEFAULT_OPS

    ap = argparse.ArgumentParser(
        prog="tgc-rulegen",
        description="Generate rewrite rules by enumeration and random testing (TASO-style).",
    )
    ap.add_argument("-o", dest="output", default=None, help="write the rule table here")
    ap.add_argument("--max-ops", type=non_negative_int("--max-ops"), default=3)
    ap.add_argument("--inputs", type=non_negative_int("--inputs"), default=3)
    ap.add_argument(
        "--ops", default=",".join(DEFAULT_OPS), help="comma-separated op labels to enumerate"
    )
    ap.add_argument("--seed", type=non_negative_int("--seed"), default=0)
    ap.add_argument(
        "--draws", type=non_negative_int("--draws"), default=16, help="input draws per shape"
    )
    ap.add_argument(
        "--shapes", type=non_negative_int("--shapes"), default=3, help="shape instantiations"
    )
    ap.add_argument(
        "--digits",
        type=non_negative_int("--digits"),
        default=7,
        help="significant decimals of a fingerprint (fewer: more, and false, candidates)",
    )
    ap.add_argument("--list-ops", action="store_true", help="print the op labels and exit")
    add_common_flags(ap)
    return ap


def run(args) -> int:
    from tgc.passes.rulegen.enumerate import Config
    from tgc.passes.rulegen.generate import generate
    from tgc.passes.rulegen.known import known_rules, rediscovered
    from tgc.passes.rulegen.table import write_table
    from tgc.passes.rulegen.terms import specs

    if args.list_ops:
        for label, spec in specs().items():
            attrs = " ".join(f"{k}={v}" for k, v in spec.attrs)
            print(f"{label:14} {spec.op} {attrs}".rstrip())
        return EXIT_OK
    ops = tuple(o for o in args.ops.split(",") if o)
    unknown = [o for o in ops if o not in specs()]
    if unknown:
        raise PipelineError(f"unknown op '{unknown[0]}' (tgc-rulegen --list-ops lists them)")
    if args.shapes < 1 or args.draws < 1:
        raise PipelineError("--shapes and --draws must be at least 1")
    config = Config(ops, args.max_ops, args.inputs, seed=args.seed, digits=args.digits)
    gen = generate(config, args.shapes, args.draws)
    kept = [(r.src, r.tgt) for r in gen.rules]
    found = rediscovered(known_rules(), kept, ops, args.max_ops)
    counts = gen.counts
    report = [
        f"tgc-rulegen: ops {','.join(ops)}; up to {args.max_ops} ops over {args.inputs} inputs; "
        f"seed {args.seed}",
        "graphs {graphs}, classes {classes}, candidates {candidates} (renamings {renamings}, "
        "instances of kept rules {instances}, tested {tested}: rejected {rejected}, "
        "no table form {no_table_form}), verified and kept {kept} ({exact} of them also in "
        "exact arithmetic)".format(**counts),
        f"time: enumeration {gen.enumeration.seconds:.1f} s, all {gen.seconds:.1f} s",
    ]
    for name, state in found.items():
        report.append(f"  {state:12} {name}")
    in_reach = [s for s in found.values() if s != "out of reach"]
    report.append(
        f"rediscovered {in_reach.count('found')} of the {len(in_reach)} hand-written rule forms "
        "within reach"
    )
    print("\n".join(report), file=sys.stderr)
    if args.output:
        header = [
            "A rule table written by tgc-rulegen (docs/rulegen.md): each rule is two functions,",
            "@<name>_src and @<name>_tgt, equal for every input. Argument dims are shape symbols",
            "(distinct sizes 2, 3, 5, 7, ...; a 1 is a 1), f64 stands for any float type.",
            report[0].removeprefix("tgc-rulegen: "),
            report[1],
            f"written {time.strftime('%Y-%m-%d')}",
        ]
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(write_table(gen, header))
        except OSError as e:
            raise TgcError(f"could not write '{args.output}': {e.strerror}") from None
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    tgc.load_all()
    args = parse_args(build_arg_parser(), argv)
    return guarded("tgc-rulegen", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
