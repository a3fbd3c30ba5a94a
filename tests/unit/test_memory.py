"""A settled server process reuses the memory it frees (``app/memory.py``): a service thread that
makes and drops fetch-page-sized data again and again takes no new pages from the kernel. Each case
runs in a process of its own, since the thresholds are process-wide."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"
)

# 200 pages, each a thousand 1 KiB rows, joined into a page and copied into an answer, in a thread
# (its own malloc arena, as the gateway's and the HTTP workers' service threads have); then the
# page faults of the later rounds, once the first has sized the heaps: the fewest of three, since
# now and then one round faults in about 800 pages afresh (seen with PYTHONMALLOC=malloc too) where
# the next takes none; glibc's defaults fault in about 150,000 every round.
_PAGES = """
import os, resource, sys, threading
from app import memory
print(memory.keep_freed_memory() if sys.argv[1] == "settled" else "-")
def pages():
    for _ in range(200):
        rows = [os.urandom(16) + bytes(1024) for _ in range(1000)]
        page = b"".join(rows)
        answer = page + b"."
        del rows, page, answer
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = threading.Thread(target=pages)
    t.start()
    t.join()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(min(faults() for _ in range(3)))
"""


def _run(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PAGES, mode], cwd=ROOT, env={**environ, **env}, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def test_a_settled_process_reuses_freed_pages():  # type: ignore[no-untyped-def]
    done, settled = _run("settled")
    assert done == "True"
    _, default = _run("default")
    # glibc's defaults hand the pages back and fault them in again at every page (about 150,000
    # faults here); settled, the heaps keep them.
    assert default > 20_000, f"the workload no longer shows glibc's default ({default} faults): revisit app/memory.py"
    assert settled < 500, f"{settled} page faults for pages the heaps should have kept"


def test_settling_freezes_the_start_up_objects_and_collects_young_objects_less_often():  # type: ignore[no-untyped-def]
    code = "import gc; from app import memory; memory.settle(); print(gc.get_freeze_count() > 0, *gc.get_threshold())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", str(20_000), "10", "10"]


def test_an_operators_malloc_tunables_are_left_alone():  # type: ignore[no-untyped-def]
    done, _ = _run("settled", MALLOC_TRIM_THRESHOLD_="131072")
    assert done == "False"
