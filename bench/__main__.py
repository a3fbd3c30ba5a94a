"""Run every benchmark: ``python -m bench``."""

import importlib
import sys

for name in ("bench.produce", "bench.spark_read"):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        print(f"skipping {name}: {exc}", file=sys.stderr)
        continue
    print(f"== {name}")
    sys.argv = [name]
    module.main()
