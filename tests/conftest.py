"""Make the helper modules beside these tests importable (``from ort_reference import ...``),
and start the longest tests first.

Under pytest-xdist (``make test``: ``-n auto --dist worksteal``) a worker that runs out of tests
takes queued ones from the others; a long test (a board's bitstream build takes most of the
run on a 2-core machine) still ends the run if it starts late, so the tests marked ``slow``
go to the front of the collection, the bitstream builds (``fpga`` and ``slow``) first. The
order among the rest is unchanged.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _rank(item) -> int:
    if item.get_closest_marker("slow") is None:
        return 2
    return 0 if item.get_closest_marker("fpga") is not None else 1


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: the collection order within each rank
