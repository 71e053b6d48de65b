#!/usr/bin/env python3
"""Times two builds of attention-bench side by side: each round runs every group on build A and
then on build B (the order alternating between rounds, so that neither always runs second on a
shared host), under each route asked; prints each row's median milliseconds and B/A.

  scripts/bench_ab.py A_DIR B_DIR [--rounds N] [--routes default,avx2] GROUP...

A_DIR and B_DIR each hold an attention-bench (and the libraries it loads, found there first).
A route is a value of ATTENTION_CPU_VECTOR ("default" leaves it unset).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(build, route, group):
    env = dict(os.environ)
    env.pop("ATTENTION_CPU_VECTOR", None)
    if route != "default":
        env["ATTENTION_CPU_VECTOR"] = route
    env["LD_LIBRARY_PATH"] = build + (":" + env["LD_LIBRARY_PATH"] if "LD_LIBRARY_PATH" in env else "")
    out = subprocess.run([os.path.join(build, "attention-bench"), group], env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            yield (route, r["impl"], r["pass"], r["T"]), r["ms"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("groups", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--routes", default="default")
    args = parser.parse_args()
    times = {}
    for round_ in range(args.rounds):
        order = [args.a, args.b] if round_ % 2 == 0 else [args.b, args.a]
        for route in args.routes.split(","):
            for group in args.groups:
                for build in order:
                    for key, ms in run(build, route, group):
                        times.setdefault(key, {args.a: [], args.b: []})[build].append(ms)
        print(f"bench_ab: round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{'route':8} {'row':52} {'A ms':>9} {'B ms':>9} {'B/A':>6}")
    for (route, impl, pass_, t), by in times.items():
        a, b = statistics.median(by[args.a]), statistics.median(by[args.b])
        print(f"{route:8} {impl + ' ' + pass_ + ' T=' + str(t):52} {a:9.2f} {b:9.2f} {b / a:6.3f}")


if __name__ == "__main__":
    main()
