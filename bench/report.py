#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""hetmem benchmarks: the summary table and the charts of one bench/run.sh run.

    python3 bench/report.py RESULTS.csv [--charts DIR]
    python3 bench/report.py --merge OUT.csv FACTS MANIFEST

--merge writes OUT.csv: FACTS' lines as '#' lines, then the rows of every CSV
that MANIFEST lists, one per line as "path<TAB>from<TAB>to<TAB>only": the
implementations named in `from` (comma-separated) are renamed `to` (a
benchmark whose malloc baseline was run under another allocator's
LD_PRELOAD), and only=1 keeps just those rows of that file (the subject's
own figures, and the other baselines', come from the run without a
preload). Rows of harness CSVs get an empty max_rss_kib; bench_mpi's
microsecond columns become nanoseconds.

RESULTS.csv is bench/run.sh's merged file: '#' lines of machine facts, then
the columns of bench/harness.c's CSV plus max_rss_kib. Prints:
  - whole programs and trace replays: hetmem's speed over the best of the
    peers (jemalloc, mimalloc, tcmalloc) and over glibc (> 1: hetmem is
    faster), its effective CPUs, its peak RSS over the best peer's, and
    whether the case meets issue 23's target (faster than glibc; on one
    thread within 1.03x of the best peer or faster; on more threads faster
    than every peer);
  - every other benchmark: the subject's speed over each baseline's.
With --charts DIR, writes PNGs there with gnuplot (ratio to the best peer
per workload; time per operation or per run per allocator, with the range
of the measurements). Uses only Python's standard library."""

import csv
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

PEERS = ("jemalloc", "mimalloc", "tcmalloc")
SUBJECT = "hetmem"
WHOLE = ("programs", "traces")
ALLOCS = (SUBJECT, "glibc") + PEERS
NL = "\\n"  # a line break inside a gnuplot string


def load(path):
    facts, rows = [], []
    with open(path, newline="") as f:
        lines = []
        for line in f:
            if line.startswith("#"):
                facts.append(line[1:].strip())
            else:
                lines.append(line)
    for r in csv.DictReader(lines):
        for k in ("median_ns_per_op", "min_ns_per_op", "max_ns_per_op", "effective_cpus",
                  "subject_over_impl", "max_rss_kib"):
            v = r.get(k, "")
            try:
                r[k] = float(v) if v not in ("", None) else math.nan
            except ValueError:
                r[k] = math.nan
        rows.append(r)
    return facts, rows


def threads_of(case):
    m = re.search(r"\[(\d+) threads?\]", case)
    return int(m.group(1)) if m else 1


def ok(r):
    return r["status"] == "ok" and not math.isnan(r["median_ns_per_op"])


def whole_cases(rows):
    """(suite, case) -> {impl: row} for the program and trace suites."""
    out = {}
    for r in rows:
        if r["suite"] in WHOLE and ok(r):
            out.setdefault((r["suite"], r["case"]), {})[r["impl"]] = r
    return out


def target_met(ratio_best, ratio_glibc, threads):
    if math.isnan(ratio_glibc) or ratio_glibc <= 1.0:
        return False
    if math.isnan(ratio_best):
        return True
    return ratio_best >= 1 / 1.03 if threads == 1 else ratio_best > 1.0


def summarize(rows):
    lines = []
    cases = whole_cases(rows)
    table = []
    for (suite, case), impls in cases.items():
        s = impls.get(SUBJECT)
        if not s:
            continue
        peers = [impls[p] for p in PEERS if p in impls]
        best = min(peers, key=lambda r: r["median_ns_per_op"]) if peers else None
        g = impls.get("glibc")
        rb = best["median_ns_per_op"] / s["median_ns_per_op"] if best else math.nan
        rg = g["median_ns_per_op"] / s["median_ns_per_op"] if g else math.nan
        rss = (s["max_rss_kib"] / best["max_rss_kib"]
               if best and best["max_rss_kib"] > 0 else math.nan)
        t = threads_of(case)
        table.append((suite, case, best["impl"] if best else "-", rb, rg, s["effective_cpus"], rss,
                      t, target_met(rb, rg, t)))
    if table:
        w = max(len(c) for _, c, *_ in table)
        lines.append("Whole programs and trace replays: hetmem's speed over the best peer's and "
                     "glibc's (> 1: hetmem is faster), medians of interleaved runs")
        lines.append(f"{'suite':9} {'case':{w}}  {'best peer':9} {'÷best':>7} {'÷glibc':>7} "
                     f"{'cpus':>5} {'rss÷best':>8}  target")
        met = 0
        for suite, case, bp, rb, rg, cpus, rss, t, m in table:
            met += m
            lines.append(f"{suite:9} {case:{w}}  {bp:9} {rb:7.3f} {rg:7.3f} {cpus:5.2f} "
                         f"{rss:8.2f}  {'met' if m else 'NOT MET'}")
        lines.append(f"target met on {met} of {len(table)} (faster than glibc; one thread: within "
                     "1.03x of the best peer or faster; more threads: faster than every peer)")
        lines.append("")
    other = {}
    for r in rows:
        if r["suite"] in WHOLE or r["status"] != "ok":
            continue
        other.setdefault((r["suite"], r["case"]), []).append(r)
    if other:
        lines.append("Other benchmarks: the subject's speed over each baseline's (> 1: the subject "
                     "is faster)")
        for (suite, case), rs in other.items():
            subj = [r for r in rs if r["role"] == "subject"]
            base = [r for r in rs if r["role"] == "baseline" and not math.isnan(r["subject_over_impl"])
                    and r["subject_over_impl"] > 0]
            if not subj:
                continue
            parts = ", ".join(f"{r['impl']} {1 / r['subject_over_impl']:.2f}" for r in base)
            lines.append(f"  {suite} / {case}: {subj[0]['impl']} {subj[0]['median_ns_per_op']:.1f} "
                         f"ns/op" + (f"; vs {parts}" if parts else ""))
    return "\n".join(lines)


def gnuplot(script, workdir):
    subprocess.run(["gnuplot"], input=script, text=True, cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)


def q(s):
    return '"' + s.replace('"', "'") + '"'


def charts(rows, facts, outdir):
    if not shutil.which("gnuplot"):
        print("report: gnuplot not found: no charts (Debian: gnuplot-nox)", file=sys.stderr)
        return []
    os.makedirs(outdir, exist_ok=True)
    made = []
    host = next((f for f in facts if f.startswith("host")), "")
    cases = whole_cases(rows)
    with tempfile.TemporaryDirectory() as tmp:
        # 1. hetmem over the best peer and over glibc, per workload.
        data = []
        for (suite, case), impls in sorted(cases.items()):
            s = impls.get(SUBJECT)
            peers = [impls[p] for p in PEERS if p in impls]
            if not s or not peers:
                continue
            best = min(r["median_ns_per_op"] for r in peers)
            g = impls.get("glibc")
            data.append((f"{suite}: {case}", best / s["median_ns_per_op"],
                         g["median_ns_per_op"] / s["median_ns_per_op"] if g else math.nan))
        if data:
            with open(os.path.join(tmp, "ratio.dat"), "w") as f:
                for name, rb, rg in data:
                    f.write(f"{q(name)} {rb:.4f} {rg:.4f}\n")
            out = os.path.join(os.path.abspath(outdir), "ratio-to-best-peer.png")
            title = q("hetmem speed over the best of jemalloc, mimalloc, tcmalloc, and over glibc "
                      "(> 1: hetmem faster)" + NL + host)
            gnuplot(f"""set terminal pngcairo size 1100,{300 + 22 * len(data)} font ",10"
set output {q(out)}
set title {title}
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -40 left
set ylabel "speed ratio"
set grid ytics
set key top left
set yrange [0:*]
set bmargin 12
set rmargin 10
plot "ratio.dat" using 2:xtic(1) title "÷ best peer", "" using 3 title "÷ glibc", 1 with lines lw 2 lc rgb "black" title "equal"
""", tmp)
            made.append(out)
        # 2. time per run (programs, relative to glibc) and per operation
        # (traces), per allocator, with min..max of the measurements.
        for suite, rel, ylabel in (("programs", True, "time per run ÷ glibc's median (lower is faster)"),
                                   ("traces", False, "ns per replayed call (lower is faster)")):
            sel = [(c, impls) for (s, c), impls in sorted(cases.items()) if s == suite]
            if not sel:
                continue
            allocs = [a for a in ALLOCS if any(a in impls for _, impls in sel)]
            with open(os.path.join(tmp, f"{suite}.dat"), "w") as f:
                for case, impls in sel:
                    norm = impls["glibc"]["median_ns_per_op"] if rel and "glibc" in impls else 1.0
                    cols = [q(case)]
                    for a in allocs:
                        r = impls.get(a)
                        if r:
                            cols += [f"{r['median_ns_per_op'] / norm:.4f}",
                                     f"{r['min_ns_per_op'] / norm:.4f}",
                                     f"{r['max_ns_per_op'] / norm:.4f}"]
                        else:
                            cols += ["NaN", "NaN", "NaN"]
                    f.write(" ".join(cols) + "\n")
            plots = []
            for i, a in enumerate(allocs):
                c = 2 + 3 * i
                plots.append((f'"{suite}.dat" using {c}:{c + 1}:{c + 2}' +
                              (":xtic(1)" if i == 0 else "") + f" title {q(a)}"))
            out = os.path.join(os.path.abspath(outdir), f"time-{suite}.png")
            title = q(f"{suite}: median per allocator, bars from the fastest to the slowest run" +
                      NL + host)
            gnuplot(f"""set terminal pngcairo size 1100,600 font ",10"
set output {q(out)}
set title {title}
set style data histograms
set style histogram errorbars gap 2 lw 1
set style fill solid 0.7 border -1
set xtics rotate by -30 left
set ylabel {q(ylabel)}
set key outside right top
set grid ytics
set yrange [0:*]
set bmargin 8
plot {", ".join(plots)}
""", tmp)
            made.append(out)
    return made


def merge(out, facts_path, manifest):
    header = None
    rows = []
    with open(manifest) as m:
        for line in m:
            line = line.rstrip("\n")
            if not line:
                continue
            path, frm, to, only = (line.split("\t") + ["", "", "0"])[:4]
            names = [n for n in frm.split(",") if n]
            if not os.path.exists(path):
                continue
            with open(path, newline="") as f:
                rd = csv.DictReader(f)
                for r in rd:
                    if r.get("impl") in names:
                        r["impl"] = to
                    elif only == "1":
                        continue
                    if "median_us_per_op" in r:  # bench_mpi
                        for us, ns in (("median_us_per_op", "median_ns_per_op"),
                                       ("min_us", "min_ns_per_op"), ("max_us", "max_ns_per_op")):
                            try:
                                r[ns] = f"{float(r.pop(us)) * 1000:.4f}"
                            except (TypeError, ValueError):
                                r[ns] = ""
                        r["effective_cpus"] = r.pop("cpus", "")
                        r["run_effective_cpus"] = r.pop("run_cpus", "")
                        r["ops_per_iter"] = "1"
                        r["iters"] = ""
                    r.setdefault("max_rss_kib", "")
                    rows.append(r)
                if header is None and rd.fieldnames and "median_ns_per_op" in rd.fieldnames:
                    header = list(rd.fieldnames)
    header = header or []
    if "max_rss_kib" not in header:
        header.append("max_rss_kib")
    with open(out, "w", newline="") as f:
        with open(facts_path) as ff:
            for line in ff:
                f.write("# " + line.rstrip("\n") + "\n")
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore", quoting=csv.QUOTE_MINIMAL)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return 0


def main(argv):
    if len(argv) == 5 and argv[1] == "--merge":
        return merge(argv[2], argv[3], argv[4])
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    facts, rows = load(argv[1])
    outdir = None
    if "--charts" in argv:
        i = argv.index("--charts")
        if i + 1 >= len(argv):
            print("report: --charts needs a folder", file=sys.stderr)
            return 2
        outdir = argv[i + 1]
    for f in facts:
        print(f)
    print()
    print(summarize(rows))
    if outdir:
        for p in charts(rows, facts, outdir):
            print(f"chart: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
