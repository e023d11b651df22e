# SPDX-License-Identifier: MIT
"""The raw ABI under its former name: kvtier.abi (generated from the headers) re-exported.

Kept because modules outside this change still import it (kvtier.transformers); new code
imports kvtier.abi."""
from __future__ import annotations

from .abi import *  # noqa: F401,F403
from .abi import CONSTANTS, PREP_ARGTYPES, STRUCTS  # noqa: F401
