"""CPU time of `counterfactory --help` and of every subcommand's `--help`, against the CPU time of
importing torch + datasets + nltk (what `--help` used to pay: 7 s of CPU on a 2-core machine).

Each command runs in a fresh process; the CPU time (user + system) is read from the child's
resource usage, so other load on the machine does not count. Run: `python benchmarks/cli_startup.py
[--repeat N]`. The last line prints the ratio of the slowest --help to the heavy imports.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builders.app.cli import build_parser  # noqa: E402


def cpu_seconds(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from command_paths(sub, prefix + (name,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (the minimum counts)")
    args = parser.parse_args()
    cli = [sys.executable, "-c", "import sys; from builders.app.cli import main; sys.exit(main(sys.argv[1:]))"]
    paths = [()] + sorted(command_paths(build_parser()))
    times = {}
    for path in paths:
        times[path] = min(cpu_seconds([*cli, *path, "--help"]) for _ in range(args.repeat))
        print(f"counterfactory {' '.join(path + ('--help',)):50s} {times[path]:.2f} s CPU")
    heavy = min(cpu_seconds([sys.executable, "-c", "import torch, datasets, nltk"]) for _ in range(args.repeat))
    print(f"{'import torch, datasets, nltk':65s} {heavy:.2f} s CPU")
    slowest = max(times, key=times.get)
    print(
        f"{len(paths)} help commands; slowest: counterfactory {' '.join(slowest)} --help "
        f"{times[slowest]:.2f} s CPU = {times[slowest] / heavy:.2f}x the heavy imports "
        f"({heavy / times[slowest]:.1f}x faster)"
    )


if __name__ == "__main__":
    main()
