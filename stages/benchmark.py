"""Stage benchmark@<name>: turn a prepared source into a benchmark on disk."""
import sys

from gcl.warm import run_warm


def main() -> None:
    from gcl.config import read_resolved
    from gcl.data.benchmarks import build_benchmark
    from gcl.data.sources import load_source
    from gcl.layout import benchmark_file, resolved_benchmark, source_file

    if len(sys.argv) != 2:
        sys.exit("usage: python stages/benchmark.py <benchmark>   (a key of benchmarks: in params.yaml)")
    name = sys.argv[1]
    data = read_resolved(resolved_benchmark(name))["data"]
    print(build_benchmark(data, load_source(source_file(data["source"])), benchmark_file(name).parent))


if __name__ == "__main__":
    run_warm(__file__, main)
