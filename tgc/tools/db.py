"""tgc-db: look into the measurement database, move it between machines, tidy it, plot it.

    tgc-db [--db PATH] list
    tgc-db [--db PATH] show KERNEL
    tgc-db [--db PATH] export [-o FILE.json]
    tgc-db [--db PATH] import FILE.json
    tgc-db [--db PATH] prune [--failures] [--noisy] [--older-than DAYS] [--plans] [--dry-run]
    tgc-db [--db PATH] plot KERNEL -o FILE.png

`list`: the devices (`*` this machine) and, per kernel version and device, how many instances
were measured, how many of those are noisy (their spread stayed large) and how many failed;
then the whole-plan times the GPU route recorded, per function and device. `show`: a kernel's records and, per device, its fitted curve
(a fixed cost, a bandwidth and a compute rate over every point, and the estimator's
leave-one-out error). `export` writes JSON (devices with their fingerprints and descriptions,
kernels with their source hashes, every record, every whole-plan time); `import` merges such a
file: a record of the same instance (a plan time of the same function and candidate) and device
is replaced only by a newer one, so nothing is duplicated. `prune`
deletes records of kernel versions that no longer exist here (their code changed; only kernels
of backends that load here are judged), with `--failures` failed records too, with `--noisy`
noisy ones (so that the next profile measures them again), with `--older-than` old ones; whole-
plan times that name a kernel version gone, and by the same options; with `--plans` every
whole-plan time (the GPU route then times its plans again). `plot` draws measured points against the fitted curve, per device
(matplotlib: `pip install 'tgc[plot]'`, in a clone `pip install -e '.[plot]'`). Exit codes: 0, 1 (an unusable database or file, a
kernel with no records), 2 (usage).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

import tgc
from tgc.diagnostics import TgcError, printable
from tgc.tools._common import DB_HELP, EXIT_OK, add_version, guarded, parse_args
from tgc.tools._outputs import check_not_database, database_files, same_file

EXPORT_FORMAT = "tgc-measurements"
# 3: records have the device's time alone (`device_median`, where timed on a device); 2: they
# say whether they are noisy; 1 did not, and its records are not. All three are read.
EXPORT_VERSION = 3
READS_EXPORT_VERSIONS = (1, 2, 3)


def build_arg_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, metavar="PATH", help=DB_HELP)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
    )
    ap = argparse.ArgumentParser(
        prog="tgc-db", description="The kernel measurement database.", parents=[common]
    )
    add_version(ap)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", parents=[common], help="devices and kernels measured")
    show = sub.add_parser("show", parents=[common], help="a kernel's records and fitted curve")
    show.add_argument("kernel")
    export = sub.add_parser("export", parents=[common], help="write every record as JSON")
    export.add_argument("-o", dest="output", default="-", metavar="FILE", help="default: stdout")
    imp = sub.add_parser("import", parents=[common], help="merge an exported JSON file")
    imp.add_argument("file")
    prune = sub.add_parser("prune", parents=[common], help="delete records no longer useful")
    prune.add_argument("--failures", action="store_true", help="failed records too")
    prune.add_argument(
        "--noisy", action="store_true", help="noisy records too (the next profile measures them)"
    )
    prune.add_argument(
        "--plans", action="store_true", help="every whole-plan time (the route times plans again)"
    )
    prune.add_argument(
        "--older-than", type=float, default=None, metavar="DAYS", help="records older than this"
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    plot = sub.add_parser("plot", parents=[common], help="measured points and the fitted curve")
    plot.add_argument("kernel")
    plot.add_argument("-o", dest="output", required=True, metavar="FILE.png")
    return ap


def _open(args, readonly: bool = True):
    """The database of `args`; checked (`PRAGMA quick_check`) even for reading, so a corrupt
    file is one line here rather than a wrong listing."""
    from tgc.planner.db import Database, resolve_path

    return Database.open(resolve_path(getattr(args, "db", None)), readonly=readonly, check=True)


def _say(line: str) -> None:
    """Print a line of a listing. Names, signatures, descriptions and messages come from the
    database, which anyone may have written (an import): a newline or an ESC in them is shown
    escaped, so that it can neither forge a line nor reach the terminal as a control."""
    print(printable(line))


def _describe_device(backend: str, d: dict) -> str:
    keys = ("gpu", "compute_capability", "cuda", "cpu", "numpy", "blas", "torch", "tgc")
    shown = ", ".join(f"{k} {d[k]}" for k in keys if k in d)
    return f"{backend}: {shown}"


def _this_machine() -> set[str]:
    """Fingerprints of the backends that load here."""
    from tgc.planner import load_backends
    from tgc.planner.backends import BACKENDS
    from tgc.planner.db import device_info

    load_backends()
    found = set()
    for name in BACKENDS:
        try:
            found.add(device_info(name).fingerprint)
        except Exception:  # noqa: BLE001, S110  (a backend whose device cannot be described)
            pass
    return found


# -- list, show ----------------------------------------------------------------------------------


def cmd_list(args) -> int:
    from tgc.planner.db_plans import plan_times
    from tgc.tools._db_plans import plan_lines

    with _open(args) as db:
        devices, rows, plans = db.devices(), db.rows(), plan_times(db)
    here = _this_machine()
    number = {f: i + 1 for i, (_, f, _, _) in enumerate(sorted(devices, key=lambda d: d[0]))}
    whole = f", {len(plans)} whole-plan time(s)" if plans else ""
    _say(f"{len(devices)} device(s), {len(rows)} record(s){whole}")
    for _, fingerprint, backend, description in sorted(devices, key=lambda d: d[0]):
        mark = "*" if fingerprint in here else " "
        desc = _describe_device(backend, description)
        _say(f"{mark} device {number[fingerprint]} [{fingerprint}] {desc}")
    counts: dict[tuple, list[int]] = {}
    for m in rows:
        key = (m.kernel.name, m.kernel.source_hash, m.device.fingerprint)
        ok_failed_noisy = counts.setdefault(key, [0, 0, 0])
        ok_failed_noisy[0 if m.ok else 1] += 1
        ok_failed_noisy[2] += m.ok and m.noisy
    for (name, source, fingerprint), (ok, failed, noisy) in sorted(counts.items()):
        shown = f"{ok} measured ({noisy} noisy)" if noisy else f"{ok} measured"
        _say(
            f"  {name:<32} source {source[:8]}  device {number[fingerprint]}: "
            f"{shown}, {failed} failed"
        )
    for line in plan_lines(plans, number):
        _say(line)
    return EXIT_OK


def _kernel_rows(db, name: str) -> list:
    rows = db.rows("k.name = ?", (name,))
    if not rows:
        raise TgcError(f"no records of kernel '{name}' in '{db.path}'")
    return rows


def fitted_line(points: list[tuple[float, float, float]]) -> str:
    """`t = a + bytes / B + flops / F` over every point (non-negative least squares on relative
    error), and the local estimator's leave-one-out error."""
    import numpy as np

    from tgc.planner.estimate import Curve, nonnegative_lstsq

    p = np.asarray(points, dtype=np.float64)
    columns = np.stack([np.ones(len(p)), p[:, 0], p[:, 1]], axis=1) / p[:, 2:3]
    fixed, per_byte, per_flop = nonnegative_lstsq(columns, np.ones(len(p)))
    terms = [f"{fixed:.3g} s"]
    if per_byte > 0:
        terms.append(f"bytes / {1 / per_byte / 1e9:.3g} GB/s")
    if per_flop > 0:
        terms.append(f"flops / {1 / per_flop / 1e9:.3g} GFLOP/s")
    curve = Curve(points)
    error = (
        f"leave-one-out error {curve.error:.1%}" if len(curve) >= 3 else "too few points for error"
    )
    return f"t = {' + '.join(terms)}; {error} ({len(p)} point(s))"


def cmd_show(args) -> int:
    with _open(args) as db:
        rows = _kernel_rows(db, args.kernel)
    here = _this_machine()
    groups: dict[tuple, list] = {}
    for m in rows:
        groups.setdefault((m.device.fingerprint, m.kernel.source_hash), []).append(m)
    for (fingerprint, source), ms in groups.items():
        m0 = ms[0]
        mark = " (this machine)" if fingerprint in here else ""
        _say(f"{args.kernel} source {source[:8]} on [{fingerprint}]{mark}")
        _say(f"  {_describe_device(m0.device.backend, m0.device.description)}")
        for m in ms:
            _say("  " + _row_text(m))
        curves: dict[tuple, list] = {}
        for m in ms:
            if m.ok:
                key = (json.dumps(m.params, sort_keys=True), m.dtypes)
                curves.setdefault(key, []).append((m.bytes, m.flops, m.median))
        for (params, dtypes), points in sorted(curves.items()):
            label = dtypes + ("" if params == "{}" else f" params {params}")
            _say(f"  fit {label}: {fitted_line(points)}")
    return EXIT_OK


def _row_text(m) -> str:
    where = m.signature + (f" {m.attrs}" if m.attrs else "")
    if m.params:
        where += f" params {json.dumps(m.params, sort_keys=True)}"
    if not m.ok:
        return f"{where}: FAILED: {m.message}"
    noisy = " (noisy)" if m.noisy else ""
    return (
        f"{where}: median {m.median:.3e} s, min {_optional(m.min, '.3e')} s, "
        f"spread {_optional(m.spread, '.0%')}{noisy}, {_optional(m.runs, 'd')} runs, "
        f"error {_optional(m.max_error, '.2g')}"
    )


def _optional(value, spec: str) -> str:
    """A field a record may lack (only a success's median is required): '?' where it does."""
    return "?" if value is None else format(value, spec)


# -- export, import --------------------------------------------------------------------------------


def export_records(rows, plans=()) -> dict:
    from tgc.tools._db_plans import export_plans

    devices, kernels, out = {}, {}, []
    for m in rows:
        devices[m.device.fingerprint] = {
            "fingerprint": m.device.fingerprint,
            "backend": m.device.backend,
            "description": m.device.description,
        }
        kernels[(m.kernel.name, m.kernel.source_hash)] = {
            "name": m.kernel.name,
            "backend": m.kernel.backend,
            "source_hash": m.kernel.source_hash,
            "params": m.kernel.params,
        }
        record = {k: _finite(v) for k, v in vars(m).items() if k not in ("kernel", "device")}
        record["kernel"] = [m.kernel.name, m.kernel.source_hash]
        record["device"] = m.device.fingerprint
        out.append(record)
    plan_records = export_plans(list(plans), devices)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "devices": list(devices.values()),
        "kernels": list(kernels.values()),
        "measurements": out,
        "plans": plan_records,
    }


def _finite(value):
    """JSON has no infinity: a failure's infinite error is written as the string "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


FLOAT_FIELDS = ("bytes", "flops", "median", "min", "spread", "max_error", "created")


def _database_path(args) -> str:
    from tgc.planner.db import resolve_path

    return resolve_path(getattr(args, "db", None))


def cmd_export(args) -> int:
    check_not_database(args.output, _database_path(args), "export")
    from tgc.planner.db_plans import plan_times

    with _open(args) as db:
        data = export_records(db.rows(), plan_times(db))
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise TgcError(f"could not write '{args.output}': {e.strerror}") from None
    plans = f" and {len(data['plans'])} whole-plan time(s)" if data["plans"] else ""
    print(
        f"exported {len(data['measurements'])} record(s){plans} to {args.output}", file=sys.stderr
    )
    return EXIT_OK


MAX_INT_DIGITS = 18  # an integer in an export: runs, bytes, a parameter value


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def load_export(text: str):
    """An export's JSON, its nesting and integers bounded (ValueError saying what is wrong)."""
    from tgc.planner.db import MAX_JSON_DEPTH

    depth = 0
    for token in _JSON_TOKENS.finditer(text):  # bracket depth outside strings, before the
        ch = token.group()  # recursive parser sees it
        if ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH + 2:  # the file's own object and lists hold the records
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH + 2}")
        elif ch in "]}":
            depth -= 1
    return json.loads(text, parse_int=_parse_int, parse_constant=_no_constant)


def import_records(data, source: str) -> tuple[list, list]:
    """The Measurements and PlanTimes of an exported file; TgcError naming the first bad
    record (and then nothing is imported)."""
    from tgc.tools._db_plans import import_plans

    from tgc.planner.db import ORIGINS, DeviceInfo, KernelInfo, Measurement, measurement_problem

    def bad(what: str) -> TgcError:
        return TgcError(f"'{source}' is not a valid tgc-db export: {what}; nothing was imported")

    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise TgcError(f'\'{source}\' is not a tgc-db export (no "format": "{EXPORT_FORMAT}")')
    version = data.get("version")
    if type(version) is not int or version not in READS_EXPORT_VERSIONS:  # not true, not 1.0
        raise TgcError(
            f"'{source}' is export version {_shown(version)}; this tgc reads "
            f"{', '.join(map(str, READS_EXPORT_VERSIONS[:-1]))} and {READS_EXPORT_VERSIONS[-1]}"
        )
    for part in ("devices", "kernels", "measurements"):
        if not isinstance(data.get(part), list):
            raise bad(f'"{part}" is not a list')
    devices, kernels = {}, {}
    for i, d in enumerate(data["devices"]):
        try:
            devices[d["fingerprint"]] = DeviceInfo(d["fingerprint"], d["backend"], d["description"])
        except (KeyError, TypeError) as e:
            raise bad(f"device {i}: {_error(e)}") from None
    for i, k in enumerate(data["kernels"]):
        try:
            info = KernelInfo(k["name"], k["backend"], k["source_hash"], k["params"])
            kernels[(info.name, info.source_hash)] = info
        except (KeyError, TypeError) as e:
            raise bad(f"kernel {i}: {_error(e)}") from None
    out = []
    for i, r in enumerate(data["measurements"]):
        try:
            if not isinstance(r, dict):
                raise TypeError("not a JSON object")
            fields = {k: v for k, v in r.items() if k not in ("kernel", "device")}
            for k in FLOAT_FIELDS:
                if isinstance(fields.get(k), str):
                    if fields[k] not in ("inf", "Infinity"):
                        raise ValueError(f"{k} is {_shown(fields[k])}, not a number")
                    fields[k] = math.inf
            key = r["kernel"]
            if not (
                isinstance(key, list) and len(key) == 2 and all(isinstance(x, str) for x in key)
            ):
                raise ValueError(f"kernel is {_shown(key)}, not [name, source hash]")
            if tuple(key) not in kernels:
                raise ValueError(f"kernel {_shown(key)} is not among the file's kernels")
            if not isinstance(r["device"], str) or r["device"] not in devices:
                raise ValueError(f"device {_shown(r['device'])} is not among the file's devices")
            m = Measurement(kernels[tuple(key)], devices[r["device"]], **fields)
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"record {i}: {_error(e)}") from None
        if m.origin not in ORIGINS:
            raise bad(f"record {i}: origin is {_shown(m.origin)}, not one of {', '.join(ORIGINS)}")
        problem = measurement_problem(m)
        if problem is not None:
            raise bad(f"record {i} ({_shown(m.kernel.name)[1:-1]}): {problem}")
        m.origin = "import"
        out.append(m)
    return out, import_plans(data, devices, bad)


def _shown(value) -> str:
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _error(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"no {_shown(e.args[0])}"
    text = " ".join(str(e).split())
    if isinstance(e, TypeError) and "unexpected keyword argument" in text:
        return "unknown field " + text.rsplit("argument", 1)[-1].strip()
    return text if text.isprintable() else ascii(text)


def _refuse_the_database_itself(file: str, database: str) -> None:
    """Importing the database into itself: it would be read as JSON and refused; say plainly
    what was asked instead."""
    for path, which in database_files(database):
        if same_file(file, path):
            raise TgcError(
                f"refusing to import '{file}': it is {which}, the one being imported into "
                "(import a file that tgc-db export wrote)"
            )


def cmd_import(args) -> int:
    import os
    import stat

    try:
        if not stat.S_ISREG(os.stat(args.file).st_mode):
            raise TgcError(f"could not read '{args.file}': not a regular file")
        _refuse_the_database_itself(args.file, _database_path(args))
        with open(args.file, encoding="utf-8") as f:
            data = load_export(f.read())
    except FileNotFoundError:
        raise TgcError(f"could not open '{args.file}': no such file or directory") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TgcError(f"could not read '{args.file}' as JSON: {_error(e)}") from None
    from tgc.planner.db_plans import merge

    records, plans = import_records(data, args.file)
    with _open(args, readonly=False) as db:
        stored, stored_plans = merge(db, records, plans)  # one transaction: all or nothing
    whole = ""
    if plans:
        whole = (
            f"; {stored_plans} whole-plan time(s), kept {len(plans) - stored_plans} existing as "
            "newer or equal"
        )
    print(
        f"imported {stored} record(s), kept {len(records) - stored} existing as newer or equal"
        f"{whole} (database {db.path})"
    )
    return EXIT_OK


# -- prune -------------------------------------------------------------------------------------------


def current_kernels() -> tuple[set[str], set[tuple[str, str]]]:
    """The backends loaded here and (name, source hash) of every kernel they register."""
    from tgc.planner import load_backends
    from tgc.planner.backends import BACKENDS
    from tgc.planner.db import kernel_info
    from tgc.planner.kernel import KERNELS

    load_backends()
    return set(BACKENDS), {(k.name, kernel_info(k).source_hash) for k in KERNELS.values()}


def stale_kernel_ids(db, here: tuple | None = None) -> list[int]:
    """Kernel versions of backends loaded here that no registered kernel has any more (row
    ids: read them inside the transaction that uses them)."""
    backends, current = here or current_kernels()
    return [
        i
        for i, name, backend, source, _ in db.kernels()
        if backend in backends and (name, source) not in current
    ]


def cmd_prune(args) -> int:
    if args.older_than is not None and not args.older_than >= 0:
        print(
            f"tgc-db: error: --older-than needs DAYS >= 0, got {args.older_than}", file=sys.stderr
        )
        return 2
    from tgc.planner.db_plans import count_plans, delete_plans
    from tgc.planner.db_schema import column_or_default
    from tgc.tools._db_plans import prune_condition

    here = current_kernels()  # before the transaction: loading backends takes a while

    def condition(db) -> tuple[str, list]:
        stale = stale_kernel_ids(db, here)
        conditions, values = [], []
        if stale:
            conditions.append(f"kernel_id IN ({','.join('?' * len(stale))})")
            values += stale
        if args.failures:
            conditions.append("status = 'failed'")
        if args.noisy:
            conditions.append(f"{column_or_default('noisy', db.version)} = 1")
        if args.older_than is not None:
            conditions.append("created < ?")
            values.append(time.time() - args.older_than * 86400)
        return " OR ".join(conditions), values

    def plans(db) -> tuple[str, list]:
        return prune_condition(db, args, here)

    with _open(args, readonly=args.dry_run) as db:
        if not condition(db)[0] and not plans(db)[0]:
            print("nothing to prune")
            return EXIT_OK
        if args.dry_run:
            where, values = condition(db)
            count = db.count(where, values) if where else 0
            where, values = plans(db)
            whole = count_plans(db, where, values) if where else 0
            print(f"would prune {count} record(s){_and_plans(whole)}")
            return EXIT_OK
        # the ids of stale kernels and plans are read again inside the deleting transactions
        gone = db.delete(condition)
        gone_plans = delete_plans(db, plans)
    print(f"pruned {gone} record(s){_and_plans(gone_plans)}")
    return EXIT_OK


def _and_plans(n: int) -> str:
    return f" and {n} whole-plan time(s)" if n else ""


# -- plot ------------------------------------------------------------------------------------------


def cmd_plot(args) -> int:
    check_not_database(args.output, _database_path(args), "plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TgcError(
            "plot needs matplotlib, which is not installed (pip install matplotlib, or in a clone pip install -e '.[plot]')"
        ) from None
    import numpy as np

    from tgc.planner.estimate import Curve

    with _open(args) as db:
        rows = _kernel_rows(db, args.kernel)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[tuple, list] = {}
    for m in rows:
        if m.ok:
            key = (m.device.fingerprint, m.device.backend, m.dtypes, json.dumps(m.params))
            groups.setdefault(key, []).append((m.bytes, m.flops, m.median))
    for (fingerprint, backend, dtypes, params), points in sorted(groups.items()):
        points.sort()
        p = np.asarray(points)
        label = f"{backend} [{fingerprint[:8]}] {dtypes}" + ("" if params == "{}" else params)
        dots = ax.loglog(p[:, 0], p[:, 2], "o", label=label)
        if len(points) >= 2:
            curve = Curve(points)
            xs, fs = _between(p[:, 0], p[:, 1])
            ax.loglog(
                xs, [curve.predict(b, f)[0] for b, f in zip(xs, fs)], "-", color=dots[0].get_color()
            )
    ax.set_xlabel("bytes moved")
    ax.set_ylabel("seconds")
    ax.set_title(f"{args.kernel}: measured (dots) and fitted (lines)")
    ax.legend(fontsize="small")
    try:
        fig.savefig(args.output, dpi=100)
    except OSError as e:
        raise TgcError(f"could not write '{args.output}': {e.strerror}") from None
    print(f"wrote {args.output}")
    return EXIT_OK


def _between(nbytes, flops, steps: int = 8):
    """Points between consecutive measured ones, geometrically (the curve between them)."""
    import numpy as np

    xs, fs = [], []
    for i in range(len(nbytes) - 1):
        for t in np.linspace(0, 1, steps, endpoint=False):
            xs.append(nbytes[i] ** (1 - t) * nbytes[i + 1] ** t)
            fs.append(math.exp((1 - t) * math.log1p(flops[i]) + t * math.log1p(flops[i + 1])) - 1)
    xs.append(nbytes[-1])
    fs.append(flops[-1])
    return xs, fs


COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "export": cmd_export,
    "import": cmd_import,
    "prune": cmd_prune,
    "plot": cmd_plot,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_arg_parser(), argv)
    tgc.load_all()
    return guarded("tgc-db", lambda: COMMANDS[args.command](args), getattr(args, "debug", False))


if __name__ == "__main__":
    sys.exit(main())
