"""Write the "## Conformance" section of docs/onnx.md: the ONNX node tests per op, passing,
expected to fail (with reasons) and out of scope, with the totals.

    python test/onnx_conformance_table.py            # print the section
    python test/onnx_conformance_table.py --write    # replace it in docs/onnx.md
    python test/onnx_conformance_table.py --check    # exit 1 when docs/onnx.md is stale

The table is computed from the scope rule and the expected-failure lists of
test/onnx_conformance_cases.py, without running anything: the suite
(test/test_onnx_conformance.py) makes it true, since an in-scope case not listed must pass and a
listed one must fail (xfail strict). test_doc_table_is_current fails when the doc is stale.
Only this section of docs/onnx.md is touched; the rest of the file is kept as it is.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnx_conformance_cases as cases  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "onnx.md"
HEADING = "## Conformance"

INTRO = f"""\
<!-- Written by test/onnx_conformance_table.py from test/onnx_conformance_cases.py; do not edit
by hand: run `python test/onnx_conformance_table.py --write`. -->

`test/test_onnx_conformance.py` runs the ONNX backend node tests shipped with onnx 1.22.0
(`onnx/backend/test/data/node`, {{total}} cases): each model is imported with `import_onnx`,
run on the numpy interpreter on every test data set, and its outputs compared with the expected
ones at the ONNX runner's tolerances (same count, shape and dtype; `assert_allclose` with
rtol=1e-3, atol=1e-7).

A case is in scope when (1) its model uses only the default ONNX domain at opset
{cases.MIN_OPSET} or later, (2) every graph input and output is a tensor of a numpy-native type
that tgc has (float16, float, double, bool, int8, int32, int64), and (3) every node's op is one
that issue 9 lists or one the importer converts. An in-scope case passes or is an
`xfail(strict=True)` with its reason (listed below); out-of-scope cases are reported as skipped
with "out of scope: ...". Multi-node cases (mostly functions expanded into their body,
`*_expanded`) follow the same rule and are counted apart. Graph inputs that carry a shape, axes
or bounds (a Reshape's shape, a Slice's starts...) are bound to the data set's values as
constants before import: tgc's shapes are static. Each in-scope case also runs after
`-p {cases.PIPELINE}` (hl decompositions, canonicalize, algebraic rewrites), against the same
expected outputs. The suite takes about 6 s (wall clock, 2-core development machine).
"""


def _outcome(case: cases.Case) -> str:
    if cases.out_of_scope(case):
        return "out"
    return "xfail" if cases.expected_failure(case) else "pass"


def _outcome_optimized(case: cases.Case) -> str:
    if cases.out_of_scope(case):
        return "out-opt"
    return "xfail-opt" if cases.expected_failure(case, optimized=True) else "pass-opt"


def _totals(all_cases) -> list[str]:
    counts = Counter((c.single_node, _outcome(c)) for c in all_cases)
    counts.update((c.single_node, _outcome_optimized(c)) for c in all_cases)

    def row(label: str, outcomes: tuple[str, ...]) -> str:
        single = sum(counts[True, o] for o in outcomes)
        multi = sum(counts[False, o] for o in outcomes)
        return f"| {label} | {single} | {multi} | {single + multi} |"

    return [
        "| cases | single-node | multi-node | all |",
        "|---|---:|---:|---:|",
        row("**pass**", ("pass",)),
        row("xfail (expected failure, strict)", ("xfail",)),
        row("in scope", ("pass", "xfail")),
        row("out of scope (skipped)", ("out",)),
        row("total", ("pass", "xfail", "out")),
        row(f"**pass** after `-p {cases.PIPELINE}`", ("pass-opt",)),
        row(f"xfail after `-p {cases.PIPELINE}`", ("xfail-opt",)),
    ]


def _per_op(all_cases) -> list[str]:
    table: dict[str, Counter] = defaultdict(Counter)
    for c in all_cases:
        kind = "single" if c.single_node else "multi"
        table[c.op][kind, _outcome(c)] += 1
    in_scope = sorted(
        op for op, n in table.items() if any(k[1] != "out" for k in n) and op != "(multi-node)"
    )
    lines = [
        "| op | pass | xfail | expanded: pass | expanded: xfail | out of scope |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for op in in_scope + (["(multi-node)"] if "(multi-node)" in table else []):
        n = table[op]
        if all(k[1] == "out" for k in n):
            continue
        out = n["single", "out"] + n["multi", "out"]
        cells = [n["single", "pass"], n["single", "xfail"], n["multi", "pass"]]
        cells += [n["multi", "xfail"], out]
        lines.append(f"| {op} | " + " | ".join(str(v) for v in cells) + " |")
    return lines


def _failures(all_cases) -> list[str]:
    lines = []
    for c in all_cases:
        if _outcome(c) == "xfail":
            lines.append(f"- `{c.name}` ({c.op}): {cases.expected_failure(c)}")
    optimized = [
        c for c in all_cases if _outcome(c) == "pass" and _outcome_optimized(c) == "xfail-opt"
    ]
    lines += [
        f"- `{c.name}` ({c.op}), after `-p {cases.PIPELINE}` only: "
        f"{cases.expected_failure(c, optimized=True)}"
        for c in optimized
    ]
    return lines or ["None."]


# Out-of-scope reasons gathered into one line per kind; the detail goes in the listing.
_KINDS = (
    (r"domain (\S+)", "other operator domains"),
    (r"opset (\d+) <", f"opset below {cases.MIN_OPSET}"),
    (r"element type (\S+) \(not a numpy", "element types numpy does not have (ml_dtypes)"),
    (r"element type (\S+) \(tgc has no", "numpy element types tgc does not have"),
    (r"(\w+) inputs or outputs", "non-tensor inputs or outputs"),
    (r"op (.*) \(not in", "ops neither in the issue's list nor converted"),
)


def _out_of_scope(all_cases) -> list[str]:
    """Out-of-scope cases by kind of reason, each with its details counted."""
    details: dict[str, Counter] = {label: Counter() for _, label in _KINDS}
    for c in all_cases:
        reason = cases.out_of_scope(c)
        if reason is None:
            continue
        for pattern, label in _KINDS:
            found = re.search(pattern, reason)
            if found:
                details[label][found.group(1)] += 1
                break
        else:
            details.setdefault(reason, Counter())[reason] += 1

    def order(key: str):
        return (int(key), key) if key.isdigit() else (0, key)

    lines = []
    for label, counted in details.items():
        if counted:
            listed = ", ".join(
                f"{k} ({n})" for k, n in sorted(counted.items(), key=lambda kv: order(kv[0]))
            )
            lines.append(f"- {label}: {sum(counted.values())} cases: {listed}")
    return lines


def render() -> str:
    """The whole section, heading included, ending with one newline."""
    all_cases = cases.all_cases()
    parts = [
        HEADING,
        "",
        INTRO.format(total=len(all_cases)),
        *_totals(all_cases),
        "",
        "Per op (a multi-node case counts under the op it expands):",
        "",
        *_per_op(all_cases),
        "",
        "### Expected failures",
        "",
        *_failures(all_cases),
        "",
        "### Out of scope",
        "",
        *_out_of_scope(all_cases),
    ]
    return "\n".join(parts) + "\n"


def _split(text: str) -> tuple[str, str, str]:
    """(before, section, after) of `text` around the Conformance section; the section runs to
    the next level-2 heading or the end."""
    start = text.find(HEADING + "\n")
    if start < 0:
        return text, "", ""
    end = text.find("\n## ", start + len(HEADING))
    end = len(text) if end < 0 else end + 1
    return text[:start], text[start:end], text[end:]


def read_section() -> str:
    """The Conformance section now in docs/onnx.md ("" when the file or section is absent)."""
    if not DOC.exists():
        return ""
    section = _split(DOC.read_text())[1]
    return section.rstrip("\n") + "\n" if section else ""


def write() -> None:
    """Replace (or append) the Conformance section of docs/onnx.md."""
    text = DOC.read_text() if DOC.exists() else "# ONNX\n\n"
    before, section, after = _split(text)
    if not section and before and not before.endswith("\n\n"):
        before = before.rstrip("\n") + "\n\n"
    new = render()
    if after:
        new += "\n"
    DOC.write_text(before + new + after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="replace the section in docs/onnx.md")
    group.add_argument("--check", action="store_true", help="exit 1 when docs/onnx.md is stale")
    args = parser.parse_args(argv)
    if args.write:
        write()
        return 0
    if args.check:
        if read_section() != render():
            print(f"{DOC}: the Conformance section is stale (run with --write)", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
