"""``python -m pytest_npugraph run SCRIPT [args]``: see cli.py."""
import sys

from .cli import main

sys.exit(main())
