"""Every output of ``kubectl coroner``: the tables, and the JSON / YAML documents.

The pure modules (`coroner.cli.plan`, `coroner.cli.doctor`) decide; this module only shows what
they decided. Tables go to a `rich.console.Console` (`console()`); documents are plain dicts that
`dump` prints as JSON or YAML. Object text is never read as rich markup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

import click
import rich.progress
import yaml
from rich.console import Console
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
    output: str,
    *,
    document: Callable[[], Mapping[str, Any]],
    table: Callable[[Console, bool], None],
    names: Iterable[str],
) -> None:
    """Print one command's result in the ``-o`` asked for: ``table``/``wide`` (`table` draws it on
    stdout's console, wide or not), ``json``/``yaml`` (what `document` builds: only then, as a
    plan's document copies every row's facts), ``name`` (`names`, one a line)."""
    if output in ("json", "yaml"):
        click.echo(dump(document(), output=output), nl=False)
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
    """``-o name`` of a doctor run: the objects the failing and warning checks name, each once, as
    ``kubectl get -o name`` prints them (no namespace, no user)."""
    named = (CheckStatus.FAIL, CheckStatus.WARN)
    return list(dict.fromkeys(o for check in checks if check.status in named for o in check.kubectl_names()))


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


#: A cell: its text and its rich style (None: plain).
Cell = tuple[str, str | None]


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    header: str
    right: bool = False
    """Right-justified (numbers)."""
    fold: bool = False
    """Wraps its cells: at `max_width` if given, else within what the console's width leaves (at
    least 20 columns; one such column, the last)."""
    max_width: int | None = None


#: Control characters in object text are shown as "?": printed raw they would move a terminal's
#: cursor or rewrite what it shows (rich drops them, which would hide that they were there).
_CONTROL: Final = dict.fromkeys([*range(32), 127], "?")

#: Lines handed to the console at once.
_LINES_PER_PRINT: Final = 1000


def print_table(console: Console, *, title: str, columns: Sequence[Column], rows: Iterable[Sequence[Cell]]) -> None:
    """One table in kubectl's layout: the title, the header, a rule, a line per row (more where a
    cell folds); each column as wide as its widest cell, two spaces apart. Laid out here and printed
    a thousand lines at a time: rich lays a `Table` out cell by cell (about 1 ms a row), and a plan
    of 150,000 registrations would take minutes and gigabytes to print."""
    rows = [[(value.translate(_CONTROL), style) for value, style in row] for row in rows]
    widths = [max([len(column.header)] + [len(row[i][0]) for row in rows]) for i, column in enumerate(columns)]
    for i, column in enumerate(columns):
        if column.max_width is not None:
            widths[i] = min(widths[i], column.max_width)
        elif column.fold:
            room = console.width - sum(w + 2 for j, w in enumerate(widths) if j != i) - 1
            widths[i] = min(widths[i], max(20, room))

    def line(cells: Sequence[Cell]) -> list[Cell]:
        pieces: list[Cell] = [(" ", None)]
        for i, (value, style) in enumerate(cells):
            pad = " " * (widths[i] - len(value))
            if columns[i].right:
                pieces.append((pad, None))
            pieces.append((value, style))
            if i < len(cells) - 1:
                pieces.append((("" if columns[i].right else pad) + "  ", None))
        return pieces

    def lines_of(row: Sequence[Cell]) -> Iterator[list[Cell]]:
        folded = [_fold(value, widths[i]) if columns[i].fold else [value] for i, (value, _) in enumerate(row)]
        for n in range(max(len(parts) for parts in folded)):
            yield line([(parts[n] if n < len(parts) else "", row[i][1]) for i, parts in enumerate(folded)])

    def flush(lines: list[list[Cell]]) -> None:
        if console.color_system is None:  # nothing to style (a pipe, a file): the text as it is
            console.file.write("".join(value for pieces in lines for value, _ in (*pieces, ("\n", None))))
        else:
            styled = (Text.assemble(*((value, style or "") for value, style in pieces)) for pieces in lines)
            console.print(Text("\n").join(styled), soft_wrap=True)

    head = line([(column.header, "bold") for column in columns])
    rule: list[Cell] = [(" " + "─" * (sum(w + 2 for w in widths) - 2), None)]
    batch: list[list[Cell]] = [[(title, "italic")], head, rule]
    for row in rows:
        batch.extend(lines_of(row))
        if len(batch) >= _LINES_PER_PRINT:
            flush(batch)
            batch = []
    if batch:
        flush(batch)


def _fold(value: str, width: int) -> list[str]:
    """`value` in lines of at most `width`: wrapped between words, a word longer than that cut."""
    if len(value) <= width:
        return [value]
    return textwrap.wrap(value, width, break_on_hyphens=False) or [""]


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
    columns = [Column("NAMESPACE")] if namespace is None else []
    columns += [Column("NAME"), Column("NODE"), Column("PID", right=True), Column("VERDICT"), Column("REASON")]
    if wide:
        columns += [Column("UID"), Column("EVIDENCE"), Column("DEATH EVIDENCE")]
    columns.append(Column("DETAIL", fold=True))

    def row(entry: PlanEntry) -> list[Cell]:
        registration = entry.registration
        reason = entry.decision.reason
        attestation = registration.attestation
        cells: list[Cell] = [(registration.namespace or "?", None)] if namespace is None else []
        cells += [
            (registration.name or "?", None),
            (registration.node_name or "?", None),
            ("?" if registration.incarnation.pid is None else str(registration.incarnation.pid), None),
            (entry.row.verdict or "-", None),
            (reason.value, _REASON_STYLE.get(reason, "yellow")),
        ]
        if wide:
            cells += [
                (registration.uid or "?", None),
                ("-" if attestation is None or attestation.evidence is None else str(attestation.evidence), None),
                (entry.row.death_evidence or "-", None),
            ]
        cells.append((entry.decision.detail, None))
        return cells

    if plan.entries:
        print_table(console, title=f"Coroner plan: {scope}", columns=columns, rows=map(row, plan.entries))
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
    columns = [Column("NAMESPACE"), Column("NAME"), Column("NODE"), Column("PID", right=True), Column("OUTCOME")]
    if wide:
        columns.append(Column("DEATH EVIDENCE"))
    columns.append(Column("DETAIL", fold=True))

    def row(result: RowResult) -> list[Cell]:
        cells: list[Cell] = [
            (result.key[0], None),
            (result.key[1], None),
            (result.node_name or "?", None),
            ("?" if result.pid is None else str(result.pid), None),
            (result.outcome.value, _OUTCOME_STYLE.get(result.outcome, "bold red")),
        ]
        if wide:
            cells.append((result.evidence or "-", None))
        cells.append((result.detail, None))
        return cells

    print_table(console, title=title, columns=columns, rows=map(row, results))
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


_STATUS_STYLE: Final = {
    CheckStatus.PASS: "green",
    CheckStatus.WARN: "bold yellow",
    CheckStatus.FAIL: "bold red",
    CheckStatus.UNKNOWN: "yellow",
}


def render_doctor(
    checks: Sequence[Check], *, console: Console, policy: PolicyChoice | None = None, wide: bool = False
) -> None:
    """The human table of one doctor run; `wide` adds the objects each check names."""
    if policy is not None:
        console.print(Text(policy.describe()), soft_wrap=True)
    columns = [Column("CHECK"), Column("STATUS")]
    if wide:
        columns.append(Column("OBJECTS", fold=True, max_width=60))
    columns.append(Column("DETAIL", fold=True))

    def row(check: Check) -> list[Cell]:
        cells: list[Cell] = [(check.name, None), (check.status.value, _STATUS_STYLE[check.status])]
        if wide:
            cells.append((" ".join(check.objects) or "-", None))
        cells.append((check.summary, None))
        return cells

    print_table(console, title="Coroner doctor", columns=columns, rows=map(row, checks))


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
