"""The exit status of `tputool diagnose`: every way a run ends maps to one documented status.

  0      ran (to its end or --max-steps); nothing at or above --fail-on
  1      runtime findings at or above --fail-on (default: warning);
         also a script that raised an uncaught exception (as Python does)
  N      the script's own non-zero status (sys.exit(N)), passed through
  2      usage error (bad option, no such script)
  124    stopped at --timeout
  128+N  killed by signal N (139 SIGSEGV, 134 SIGABRT, 137 SIGKILL)
  130    interrupted (Ctrl-C, KeyboardInterrupt)

The script's own ending wins over findings: a script that exited 3 makes diagnose exit 3.
"""

from __future__ import annotations

from tputool.diagnose.model import Report
from tputool.rules.model import Severity

TABLE = __doc__.split("\n\n")[1]  # shown in `tputool diagnose --help`

TIMEOUT, INTERRUPTED = 124, 130


FAILED = ("error", "exited", "crashed")


def run_ending(status: str, exit_code: int | None) -> int | None:
    """The exit status a run's own ending imposes (failed, timed out, interrupted), or None when it ran."""
    if status in FAILED:
        return exit_code or 1
    if status == "timeout":
        return TIMEOUT
    if status == "interrupted":
        return INTERRUPTED
    return None


def exit_status(report: Report, fail_on: Severity = Severity.WARNING) -> int:
    """diagnose's exit status for `report` (see the module's table)."""
    ending = run_ending(report.status, report.exit_code)
    if ending is not None:
        return ending
    return 1 if report.problems(fail_on) else 0
