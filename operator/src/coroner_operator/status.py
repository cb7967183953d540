"""What the operator writes: now built in `coroner.core.wire` (the one module of every wire shape).

These names are re-exported so that callers can switch their imports to `coroner.core.wire`.
"""

from __future__ import annotations

from coroner.core.wire import ACTIVE as ACTIVE
from coroner.core.wire import RELEASED as RELEASED
from coroner.core.wire import attested_condition as attested_condition
from coroner.core.wire import conditions_changed as conditions_changed
from coroner.core.wire import conditions_ops as conditions_ops
from coroner.core.wire import desired_conditions as desired_conditions
from coroner.core.wire import reads_terminal as reads_terminal
from coroner.core.wire import retired_conditions as retired_conditions
from coroner.core.wire import retirement_ops as retirement_ops
