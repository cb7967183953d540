"""Every output of ``kubectl coroner``: the rich tables, and the JSON / YAML documents.

The pure modules (`coroner.cli.plan`, `coroner.cli.doctor`) decide; this module only shows what
they decided. Tables go to a `rich.console.Console` (`console()`); documents are plain dicts that
`dump` prints as JSON or YAML. Object text is never read as rich markup.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

import click
import rich.progress
import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coroner.cli.doctor import Check, CheckStatus, doctor_exit_code
from coroner.cli.plan import (
    ApplyAssessment,
    PolicyChoice,
    RowOutcome,
    RowResult,
    apply_command,
    candidates,
    display,
    names_text,
)
from coroner.core import api, model
from coroner.core.fingerprint import Plan, PlanEntry
from coroner.core.reasons import Reason


def console() -> Console:
    """stdout; a pipe gets 160 columns instead of rich's 80, so that logs keep one row per line."""
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if wide else 160)


#: ``-o name`` prints objects as ``kubectl get -o name`` does: ``<kind>.<group>/<name>``.
REGISTRATION_NAME_PREFIX: Final = f"{api.KIND.lower()}.{api.GROUP}/"


def emit(
    output: str, *, document: Mapping[str, Any], table: Callable[[Console, bool], None], names: Iterable[str]
) -> None:
    """Print one command's result in the ``-o`` asked for: ``table``/``wide`` (`table` draws it on
    stdout's console, wide or not), ``json``/``yaml`` (`document`), ``name`` (`names`, one a line)."""
    if output in ("json", "yaml"):
        click.echo(dump(document, output=output), nl=False)
    elif output == "name":
        for name in names:
            click.echo(name)
    else:
        table(console(), output == "wide")


def registration_name(key: tuple[str, str]) -> str:
    """``workerregistration.coroner.dev/NAME``, as ``kubectl get -o name`` prints it (no namespace)."""
    return f"{REGISTRATION_NAME_PREFIX}{key[1]}"


def plan_names(plan: Plan) -> list[str]:
    """``-o name`` of a plan: every registration."""
    return [registration_name(model.key_of(entry.registration)) for entry in plan.entries]


def apply_names(results: Sequence[RowResult]) -> list[str]:
    """``-o name`` of an apply run: the rows retired, already retired, or (preview) that would be."""
    return [registration_name(result.key) for result in results if result.outcome.done]


def doctor_names(checks: Sequence[Check]) -> list[str]:
    """``-o name`` of a doctor run: the objects the failing checks name, each once."""
    return list(dict.fromkeys(o for check in checks if check.status == CheckStatus.FAIL for o in check.objects))


class Progress(Protocol):
    """Counts finished rows; `progress` gives one."""

    def advance(self) -> None: ...


class _Silent:
    def advance(self) -> None:
        pass


@contextlib.contextmanager
def progress(total: int, *, what: str) -> Iterator[Progress]:
    """A progress bar on stderr while `total` rows are worked on, when stderr is a terminal (never
    in a pipe or a log: stdout stays the document, stderr the sentences)."""
    if total < 2 or not sys.stderr.isatty():
        yield _Silent()
        return
    bar = rich.progress.Progress(
        rich.progress.TextColumn("{task.description}"),
        rich.progress.BarColumn(),
        rich.progress.MofNCompleteColumn(),
        rich.progress.TimeElapsedColumn(),
        console=Console(stderr=True, highlight=False),
        transient=True,
    )
    with bar:
        task = bar.add_task(what, total=total)

        class _Bar:
            def advance(self) -> None:
                bar.advance(task)

        yield _Bar()


# --- plan and apply -----------------------------------------------------------------------------


def plan_document(
    plan: Plan,
    *,
    namespace: str | None,
    now: datetime.datetime,
    retire_permission: Mapping[str, bool | None],
    policy: PolicyChoice | None = None,
) -> dict[str, Any]:
    """The plan as ``-o json`` / ``-o yaml`` print it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "Plan",
        "scope": {"namespace": namespace, "allNamespaces": namespace is None},
        "generatedTime": model.format_time(now, fraction=True),
        "policy": None if policy is None else policy.document(),
        "registryFingerprint": plan.registry_fingerprint,
        "candidateFingerprint": plan.candidate_fingerprint,
        "counts": {reason.value: count for reason, count in plan.counts.items()},
        "total": len(plan.entries),
        "retirePermission": {ns: allowed for ns, allowed in sorted(retire_permission.items())},
        "candidates": [display(model.key_of(entry.registration)) for entry in candidates(plan)],
        "registrations": [_entry_document(entry) for entry in plan.entries],
    }


def _entry_document(entry: PlanEntry) -> dict[str, Any]:
    registration, decision = entry.registration, entry.decision
    attestation = registration.attestation
    return {
        "namespace": registration.namespace,
        "name": registration.name,
        "uid": registration.uid,
        "nodeName": registration.node_name,
        "pid": registration.incarnation.pid,
        "verdict": entry.row.verdict,
        "attestationEvidence": None
        if attestation is None or attestation.evidence is None
        else str(attestation.evidence),
        "reason": decision.reason.value,
        "retirable": decision.retirable,
        "deathEvidence": entry.row.death_evidence,
        "detail": decision.detail,
        "facts": dict(decision.evidence),
    }


def apply_document(
    *,
    assessment: ApplyAssessment,
    results: Sequence[RowResult],
    preview: bool,
    retired_by: str | None,
    policy: PolicyChoice | None = None,
) -> dict[str, Any]:
    """An apply run as ``-o json`` prints it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "ApplyResult",
        "preview": preview,
        "retiredBy": retired_by,
        "policy": None if policy is None else policy.document(),
        "abort": None if assessment.abort is None else assessment.abort.value,
        "abortDetail": assessment.abort_detail or None,
        "registryFingerprint": assessment.registry_fingerprint,
        "candidateFingerprint": assessment.candidate_fingerprint,
        "refusals": assessment.refusals,
        "rows": [
            {
                "namespace": result.key[0],
                "name": result.key[1],
                "outcome": result.outcome.value,
                "nodeName": result.node_name,
                "pid": result.pid,
                "evidence": result.evidence,
                "detail": result.detail,
            }
            for result in results
        ],
    }


def dump(document: Mapping[str, Any], *, output: str) -> str:
    """JSON (indented, stable key order) or YAML."""
    if output == "yaml":
        return yaml.safe_dump(_plain(document), sort_keys=False, default_flow_style=False)
    return json.dumps(document, indent=2, default=str) + "\n"


_REASON_STYLE: Final = {Reason.ELIGIBLE_STALE_ORPHAN: "bold green", Reason.ALREADY_TERMINAL: "dim"}
_OUTCOME_STYLE: Final = {
    RowOutcome.RETIRED: "bold green",
    RowOutcome.WOULD_RETIRE: "green",
    RowOutcome.ALREADY_RETIRED: "dim",
}


def render_plan(
    plan: Plan,
    *,
    console: Console,
    namespace: str | None,
    retire_permission: Mapping[str, bool | None],
    policy: PolicyChoice | None = None,
    wide: bool = False,
) -> None:
    """The human table: every registration, counts by reason, fingerprints, and the apply line.
    `wide` adds each row's UID, attestation evidence and death evidence."""
    scope = "all namespaces" if namespace is None else f"namespace {namespace}"
    if policy is not None:
        console.print(Text(policy.describe()), soft_wrap=True)
    table = Table(title=Text(f"Coroner plan: {scope}"), box=box.SIMPLE_HEAD, title_justify="left")
    if namespace is None:
        table.add_column("NAMESPACE", no_wrap=True)
    table.add_column("NAME", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("VERDICT", no_wrap=True)
    table.add_column("REASON", no_wrap=True)
    if wide:
        table.add_column("UID", no_wrap=True)
        table.add_column("EVIDENCE", no_wrap=True)
        table.add_column("DEATH EVIDENCE", no_wrap=True)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for entry in plan.entries:
        registration = entry.registration
        reason = entry.decision.reason
        attestation = registration.attestation
        cells = [
            Text(registration.name or "?"),
            Text(registration.node_name or "?"),
            Text("?" if registration.incarnation.pid is None else str(registration.incarnation.pid)),
            Text(entry.row.verdict or "-"),
            Text(reason.value, style=_REASON_STYLE.get(reason, "yellow")),
        ]
        if wide:
            cells += [
                Text(registration.uid or "?"),
                Text("-" if attestation is None or attestation.evidence is None else str(attestation.evidence)),
                Text(entry.row.death_evidence or "-"),
            ]
        cells.append(Text(entry.decision.detail))
        if namespace is None:
            cells.insert(0, Text(registration.namespace or "?"))
        table.add_row(*cells)
    if plan.entries:
        console.print(table)
    else:
        console.print(Text(f"No WorkerRegistrations in {scope}."))
    counted = [f"{reason.value} {count}" for reason, count in plan.counts.items() if count]
    console.print(Text(f"Counts ({len(plan.entries)} total): {', '.join(counted) or 'none'}"))
    console.print(Text(f"registryFingerprint:  {plan.registry_fingerprint}"))
    console.print(Text(f"candidateFingerprint: {plan.candidate_fingerprint}"))
    lacking = sorted(ns for ns, allowed in retire_permission.items() if allowed is not True)
    if lacking:
        console.print(
            Text(
                f"You do not hold the {api.RETIRE_VERB} verb in {names_text(lacking)}: dead orphans there show "
                f"{Reason.RETIRE_PERMISSION_MISSING} and apply cannot retire them.",
                style="yellow",
            )
        )
    eligible = candidates(plan)
    if eligible:
        console.print(Text("To retire the candidates (add --yes after reviewing the preview):"))
        console.print(
            Text(apply_command(plan=plan, entries=eligible, namespace=namespace), style="bold"), soft_wrap=True
        )
    else:
        console.print(Text("No retirement candidates."))


def render_apply(
    *,
    results: Sequence[RowResult],
    console: Console,
    preview: bool,
    retired_by: str | None,
    policy: PolicyChoice | None = None,
    wide: bool = False,
) -> None:
    """The human table of one apply run; `wide` adds each row's death evidence."""
    if policy is not None:
        console.print(Text(policy.describe()), soft_wrap=True)
    if preview:
        title = "Coroner apply: preview (nothing written)"
    elif retired_by is None:
        title = "Coroner apply: nothing left to retire"
    else:
        title = f"Coroner apply as {retired_by}"
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("NAMESPACE", no_wrap=True)
    table.add_column("NAME", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("OUTCOME", no_wrap=True)
    if wide:
        table.add_column("DEATH EVIDENCE", no_wrap=True)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for result in results:
        cells = [
            Text(result.key[0]),
            Text(result.key[1]),
            Text(result.node_name or "?"),
            Text("?" if result.pid is None else str(result.pid)),
            Text(result.outcome.value, style=_OUTCOME_STYLE.get(result.outcome, "bold red")),
        ]
        if wide:
            cells.append(Text(result.evidence or "-"))
        table.add_row(*cells, Text(result.detail))
    console.print(table)
    if preview and any(result.outcome == RowOutcome.WOULD_RETIRE for result in results):
        console.print(Text("Nothing was changed. Run the same command with --yes to retire these rows."))


def doctor_document(
    checks: Sequence[Check], *, now: datetime.datetime, policy: PolicyChoice | None = None
) -> dict[str, Any]:
    """A doctor run as ``-o json`` prints it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "DoctorReport",
        "generatedTime": model.format_time(now, fraction=True),
        "policy": None if policy is None else policy.document(),
        "healthy": doctor_exit_code(checks) == 0,
        "checks": [
            {
                "name": check.name,
                "status": check.status.value,
                "summary": check.summary,
                "objects": list(check.objects),
                "facts": dict(check.facts),
            }
            for check in checks
        ],
    }


_STATUS_STYLE: Final = {CheckStatus.PASS: "green", CheckStatus.FAIL: "bold red", CheckStatus.UNKNOWN: "yellow"}


def render_doctor(
    checks: Sequence[Check], *, console: Console, policy: PolicyChoice | None = None, wide: bool = False
) -> None:
    """The human table of one doctor run; `wide` adds the objects each check names."""
    if policy is not None:
        console.print(Text(policy.describe()), soft_wrap=True)
    table = Table(title=Text("Coroner doctor"), box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("CHECK", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    if wide:
        table.add_column("OBJECTS", overflow="fold", max_width=60)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for check in checks:
        cells = [Text(check.name), Text(check.status.value, style=_STATUS_STYLE[check.status])]
        if wide:
            cells.append(Text(" ".join(check.objects) or "-"))
        table.add_row(*cells, Text(check.summary))
    console.print(table)


def _plain(value: object) -> object:
    """JSON-shaped builtins only, so YAML never writes Python tags (enums, tuples, proxies)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
