"""The final safety check of a simulated run: the chaos suite's checkers
(tests/chaos/checker.py, S1-S12 and S14, S13 when power was lost) over the run's evidence.

The simulator checks S12 and committed-prefix agreement itself at every step (observer.py);
this adds everything that needs the whole history and the final dumps: lost or changed
acknowledged appends, two payloads at one LSN, duplicates, phantoms, gaps, real-time order,
reads of uncommitted or truncated data, replicas that differ.
"""

from __future__ import annotations

from tests.chaos.checker import CheckOptions, check_safety
from tests.chaos.history import Evidence

EXAMPLES_SHOWN = 3


def safety_violations(evidence: Evidence, *, power_loss: bool) -> list[str]:
    """One line per violation: check id, message, the first examples."""
    lines = []
    for violation in check_safety(evidence, CheckOptions(power_loss=power_loss)):
        examples = "; ".join(violation.examples[:EXAMPLES_SHOWN])
        lines.append(f"{violation.check} {violation.message}: {examples}")
    return lines
