"""Make the helper module next to these tests importable (``from rtl_helpers import ...``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
