"""`python -m tfdet._child SPEC_JSON`: the entry point of every child process."""

import sys

from tfdet._child import _start

_start.exit_without_teardown(_start.main(sys.argv))
