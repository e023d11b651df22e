# SPDX-License-Identifier: MIT
"""``python -m kvtier status|clients|seqs|blocks [--json]``: kvtierctl's views, from Python."""
import sys

from .ctl import main

sys.exit(main())
