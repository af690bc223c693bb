"""``python -m dashboard``: same as ``iotfraud dashboard``."""

from __future__ import annotations

import sys

from dashboard.cli import main

sys.exit(main())
