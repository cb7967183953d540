"""``kubectl coroner apply``: retire the approved rows of a plan, under your own ``retire`` verb.

Re-reads and recomputes the plan, compares it with the fingerprints a person approved
(`coroner.cli.plan.assess_apply`), and retires each approved row with the operator's retire
protocol (`coroner.retire`, `retire` below): capability review, Lease fence, decide again,
compare-and-swap patch, Event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TextIO

import click
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from coroner.cli import options, render
from coroner.cli import plan as planning
from coroner.cli.session import (
    EXIT_DRIFT,
    EXIT_OK,
    EXIT_USAGE,
    Connection,
    PluginError,
    Session,
    confirm_gone_nodes,
    fail,
    gather,
    listed_policy,
    scope_of,
    server_message,
    utcnow,
)
from coroner.client.kube import patch_registration_status
from coroner.core import api, fingerprint, model
from coroner.core.decision import Policy
from coroner.core.fingerprint import PlanEntry
from coroner.core.model import Key
from coroner.core.world import World
from coroner.retire import (
    AdmissionRefusal,
    PortError,
    RetireIntent,
    RetireOutcome,
    RetirePort,
    Retirer,
    RetireResult,
    retired_event,
    retirement,
    write,
)

#: Rows retired at the same time by default, and at most (each is four requests in a row).
DEFAULT_PARALLELISM: Final = 4
MAX_PARALLELISM: Final = 32
_RESOURCE_PREFIXES: Final = (f"{api.KIND.lower()}.{api.GROUP}/", f"{api.PLURAL}.{api.GROUP}/")


def _one_selection(names: tuple[str, ...], *, all_candidates: bool) -> None:
    if all_candidates and names:
        raise click.UsageError("name the rows to retire, or pass --all-candidates; not both.")
    if not all_candidates and not names:
        raise click.UsageError("name the rows to retire (NAMES...), or pass --all-candidates.")


def _fingerprint(flag: str, value: str | None) -> str:
    """An approved plan's fingerprint, as given: present and well-formed, or a usage error naming the flag."""
    if value is None:
        raise click.UsageError(f"apply needs {flag} (from the plan you approved), or --from-plan FILE.")
    if not planning.valid_fingerprint(value):
        raise PluginError(
            f"{flag} {value!r} is not a Coroner fingerprint (v1:sha256:<64 hex digits>); copy it from the "
            f"output of `kubectl coroner plan`."
        )
    return value


@click.command("apply")
@options.scoped
@click.option(
    "--from-plan",
    "from_plan",
    type=click.File("r"),
    default=None,
    metavar="FILE",
    help="A plan saved with `kubectl coroner plan -o json` (or yaml; - for stdin): its fingerprints, scope, "
    "policy flags and candidates. Nothing outside its candidates is retired.",
)
@click.option("--registry-fingerprint", default=None, help="registryFingerprint from the plan you approved.")
@click.option("--candidate-fingerprint", default=None, help="candidateFingerprint from the plan you approved.")
@click.option(
    "--all-candidates",
    is_flag=True,
    help="Every candidate of the approved plan (its candidate fingerprint pins the set) instead of NAMES.",
)
@click.option("--yes", is_flag=True, help="Retire. Without it apply only previews and writes nothing.")
@click.option(
    "--parallelism",
    type=click.IntRange(1, MAX_PARALLELISM),
    default=DEFAULT_PARALLELISM,
    show_default=True,
    help="How many rows are retired at the same time.",
)
@options.output
@options.common
@click.argument("names", nargs=-1)
@click.pass_context
def apply_command(
    ctx: click.Context,
    namespace: str | None,
    all_namespaces: bool,
    from_plan: TextIO | None,
    registry_fingerprint: str | None,
    candidate_fingerprint: str | None,
    all_candidates: bool,
    yes: bool,
    parallelism: int,
    output: str,
    connection: Connection,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
    names: tuple[str, ...],
) -> None:
    """Retire NAMES (or NAMESPACE/NAME with -A), or --all-candidates, of an approved plan, under your own
    retire verb. The plan is approved by its fingerprints, or by the file it was saved to (--from-plan).

    Re-reads and recomputes the plan; aborts with exit code 3 (RegistryMoved, CandidateSetMoved)
    if it is not the approved one. Replaying a successful apply reports its rows AlreadyRetired
    and exits 0.
    """
    saved = _saved_plan(from_plan) if from_plan is not None else None
    if saved is not None:
        registry_fingerprint = _agreeing("--registry-fingerprint", registry_fingerprint, saved.registry_fingerprint)
        candidate_fingerprint = _agreeing("--candidate-fingerprint", candidate_fingerprint, saved.candidate_fingerprint)
        namespace, all_namespaces = _saved_scope(saved, namespace=namespace, all_namespaces=all_namespaces)
        if node_deletion_evidence is None and "node_deletion_evidence" in saved.policy_flags:
            node_deletion_evidence = bool(saved.policy_flags["node_deletion_evidence"])
        if node_quarantine_seconds is None and "node_deletion_quarantine_seconds" in saved.policy_flags:
            node_quarantine_seconds = _seconds(saved.policy_flags["node_deletion_quarantine_seconds"])
    registry_fingerprint = _fingerprint("--registry-fingerprint", registry_fingerprint)
    candidate_fingerprint = _fingerprint("--candidate-fingerprint", candidate_fingerprint)
    _one_selection(names, all_candidates=all_candidates)
    scope = scope_of(namespace=namespace, all_namespaces=all_namespaces, connection=connection)
    keys = _keys(names, scope=scope)
    if saved is not None:
        outside = [key for key in keys if key not in saved.candidates]
        if outside:
            raise PluginError(
                f"{planning.names_text([planning.display(key) for key in outside])} "
                f"{'is' if len(outside) == 1 else 'are'} not among the candidates of the approved plan "
                f"{from_plan.name if from_plan is not None else ''}; apply retires nothing outside them. Nothing was "
                f"changed."
            )
    session = Session(connection)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
        intern=sys.intern,
    )
    choice = listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    policy = choice.policy
    now = utcnow()
    listing = confirm_gone_nodes(session, listing, policy=policy, now=now)
    world = planning.build_world(listing)
    plan = fingerprint.decide_all(world=world, policy=policy, now=now, keep_evidence=False)
    if all_candidates:
        keys = (
            list(saved.candidates)
            if saved is not None
            else planning.all_candidates(
                plan, registry_fingerprint=registry_fingerprint, candidate_fingerprint=candidate_fingerprint
            )
        )
    assessment = planning.assess_apply(
        plan=plan,
        names=keys,
        registry_fingerprint=registry_fingerprint,
        candidate_fingerprint=candidate_fingerprint,
    )
    if assessment.abort is not None or assessment.refusals:
        if output in ("json", "yaml"):
            document = render.apply_document(
                assessment=assessment, results=(), preview=not yes, retired_by=None, policy=choice
            )
            click.echo(render.dump(document, output=output), nl=False)
        if assessment.abort is not None:
            fail(ctx, f"apply aborted: {assessment.abort_detail}", code=EXIT_DRIFT)
        *others, last = assessment.refusals
        for sentence in others:
            click.echo(f"error: {sentence}", err=True)
        fail(ctx, f"{last} Nothing was changed.", code=EXIT_USAGE)

    results = [
        planning.RowResult(
            key=model.key_of(entry.registration),
            outcome=planning.RowOutcome.ALREADY_RETIRED,
            detail=_already_retired_detail(entry),
            node_name=entry.registration.node_name,
            pid=entry.registration.incarnation.pid,
            evidence=entry.registration.retirement.reason if entry.registration.retirement else None,
        )
        for entry in assessment.already_retired
    ]
    retired_by: str | None = None
    if not yes:
        results += [
            planning.RowResult(
                key=model.key_of(entry.registration),
                outcome=planning.RowOutcome.WOULD_RETIRE,
                detail=entry.decision.detail,
                node_name=entry.registration.node_name,
                pid=entry.registration.incarnation.pid,
                evidence=entry.row.death_evidence,
            )
            for entry in assessment.to_retire
        ]
    elif assessment.to_retire:
        retired_by = session.whoami()
        results += _retire_all(
            session,
            world=world,
            entries=assessment.to_retire,
            policy=policy,
            retired_by=retired_by,
            parallelism=parallelism,
        )
    results.sort(key=lambda result: result.key)
    render.emit(
        output,
        document=lambda: render.apply_document(
            assessment=assessment, results=results, preview=not yes, retired_by=retired_by, policy=choice
        ),
        table=lambda console, wide: render.render_apply(
            results=results, console=console, preview=not yes, retired_by=retired_by, policy=choice, wide=wide
        ),
        names=render.apply_names(results),
    )
    code = planning.apply_exit_code(results)
    if code != EXIT_OK:
        failed = [f"{planning.display(r.key)} {r.outcome}" for r in results if not r.outcome.done]
        fail(ctx, f"apply did not complete: {', '.join(failed)}; run `kubectl coroner plan` to see why.", code=code)


def _retire_all(
    session: Session,
    *,
    world: World,
    entries: Sequence[PlanEntry],
    policy: Policy,
    retired_by: str,
    parallelism: int,
) -> list[planning.RowResult]:
    """`_retire` for every entry, at most `parallelism` at a time, with a progress bar on a terminal."""
    results: list[planning.RowResult] = []
    with (
        render.progress(len(entries), what=f"Retiring as {retired_by}") as shown,
        concurrent.futures.ThreadPoolExecutor(max_workers=min(parallelism, len(entries))) as pool,
    ):
        futures = [
            pool.submit(_retire, session, world=world, entry=entry, policy=policy, retired_by=retired_by)
            for entry in entries
        ]
        try:
            for future in concurrent.futures.as_completed(futures):
                results.append(future.result())
                shown.advance()
        except KeyboardInterrupt:
            # Rows not started are not retired; those in flight finish (a write is never cut in half).
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def _saved_plan(file: TextIO) -> planning.SavedPlan:
    source = "standard input" if file.name == "<stdin>" else file.name
    try:
        document = yaml.safe_load(file.read())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PluginError(
            f"{source} is not a plan saved with `kubectl coroner plan -o json` (it is neither JSON nor YAML: "
            f"{str(exc).splitlines()[0]}); save one with `kubectl coroner plan -o json > plan.json`."
        ) from None
    try:
        return planning.read_saved_plan(document, source=source)
    except ValueError as exc:
        raise PluginError(str(exc)) from None


def _agreeing(flag: str, given: str | None, saved: str) -> str:
    if given is not None and given != saved:
        raise PluginError(f"{flag} {given} is not the one in the plan given with --from-plan ({saved}); pass one.")
    return saved


def _saved_scope(saved: planning.SavedPlan, *, namespace: str | None, all_namespaces: bool) -> tuple[str | None, bool]:
    """The saved plan's scope; -n/-A may repeat it but not change it (a plan is approved for its scope)."""
    planned = "-A" if saved.namespace is None else f"-n {saved.namespace}"
    if (all_namespaces and saved.namespace is not None) or (namespace is not None and namespace != saved.namespace):
        given = "-A" if all_namespaces else f"-n {namespace}"
        raise PluginError(
            f"the plan given with --from-plan was made with {planned}, not {given}; apply it with {planned} (or "
            f"neither), or plan again with {given}."
        )
    return saved.namespace, saved.namespace is None


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PluginError(f"the plan given with --from-plan sets nodeDeletionQuarantineSeconds to {value!r}.")
    return float(value)


def _already_retired_detail(entry: PlanEntry) -> str:
    record = entry.registration.retirement
    assert record is not None
    when = model.format_time(record.retired_time) if record.retired_time else "an unrecorded time"
    return f"already retired by {record.retired_by or '?'} at {when} ({record.reason}); nothing written."


def _keys(names: Sequence[str], *, scope: str | None) -> list[Key]:
    keys: list[Key] = []
    for given in names:
        name = _without_resource(given)
        namespace, sep, rest = name.partition("/")
        if sep:
            if not namespace or not rest or "/" in rest:
                raise PluginError(f"{name!r} is neither NAME nor NAMESPACE/NAME.")
            if scope is not None and namespace != scope:
                raise PluginError(
                    f"{name!r} is outside the planned namespace {scope}; plan and apply with -n {namespace}, or -A."
                )
            keys.append((namespace, rest))
        elif scope is None:
            raise PluginError(f"with -A, name registrations as NAMESPACE/NAME ({name!r} has no namespace).")
        else:
            keys.append((scope, name))
    return keys


def _without_resource(name: str) -> str:
    """NAME from ``workerregistration.coroner.dev/NAME`` (what ``plan -o name`` prints); a namespace
    never holds a dot, so the dotted prefix cannot be one."""
    for prefix in _RESOURCE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class SessionPort(RetirePort):
    """The retire protocol's port (`coroner.retire`) over the person's `Session`: each request is
    the Session's own (its errors mapped to `PortError`: what the API server said, or None for no
    answer). Blocking calls: `_retire` runs one retirement per thread."""

    def __init__(self, session: Session, *, reporter: str) -> None:
        self.session = session
        self.reporter = reporter

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        with _port_errors(self.session):
            return self.session.can_retire(namespace=namespace, name=name)

    async def list_leases(self, *, namespace: str) -> Sequence[Mapping[str, Any]]:
        with _port_errors(self.session):
            return self.session.list_leases(namespace=namespace)

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        with _port_errors(self.session):
            return patch_registration_status(self.session.client, namespace=namespace, name=name, body=ops)

    async def post_event(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        with _port_errors(self.session):
            self.session.post_event(body=dict(involved), reason=reason, message=message, reporter=self.reporter)


@contextlib.contextmanager
def _port_errors(session: Session) -> Iterator[None]:
    try:
        yield
    except PluginError as exc:
        raise PortError(None if exc.unreachable else exc.status, exc.message) from exc
    except ApiException as exc:
        if exc.status in (0, None):
            raise PortError(None, session.unreachable(exc).message) from exc
        raise PortError(int(exc.status), server_message(exc), reason=str(exc.reason or "")) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise PortError(None, session.unreachable(exc).message) from exc


async def retire(
    port: RetirePort, intent: RetireIntent, *, retirer: Retirer, clock: Callable[[], datetime.datetime]
) -> RetireResult:
    """One person's retirement of a registration decided retirable (`coroner.retire`'s steps 1-5):
    the review and the Lease read sent at the same time, both after the decision; the pure steps
    on their answers; the compare-and-swap; the Event."""
    granted, listed = await asyncio.gather(
        port.can_retire(namespace=intent.namespace, name=intent.name),
        port.list_leases(namespace=intent.namespace),
        return_exceptions=True,
    )
    if isinstance(granted, BaseException) and not isinstance(granted, PortError):
        raise granted
    if isinstance(listed, BaseException) and not isinstance(listed, PortError):
        raise listed
    decided = retirement(intent, granted=granted, listed=listed, retirer=retirer, now=clock())
    if isinstance(decided, RetireResult):
        return decided
    result = await write(port, decided)
    event = retired_event(result, retirer=retirer)
    if event is None:
        return result
    try:
        await port.post_event(
            involved=event.involved, reason=event.reason, evidence=event.evidence, message=event.message
        )
    except PortError as error:
        return dataclasses.replace(result, event_error=error)
    return result


#: What apply's rows say for each outcome of the retire protocol.
_ROWS: Final = {
    RetireOutcome.RETIRED: planning.RowOutcome.RETIRED,
    RetireOutcome.PERMISSION_MISSING: planning.RowOutcome.RETIRE_PERMISSION_MISSING,
    RetireOutcome.REFUSED_BY_ADMISSION: planning.RowOutcome.RETIRE_REFUSED_BY_ADMISSION,
    RetireOutcome.LEASE_FENCE_MOVED: planning.RowOutcome.RETIRE_ABANDONED,
    RetireOutcome.ABANDONED: planning.RowOutcome.RETIRE_ABANDONED,
    RetireOutcome.CONFLICT: planning.RowOutcome.RETIRE_CONFLICT,
    RetireOutcome.UNREACHABLE: planning.RowOutcome.RETIRE_FAILED,
    RetireOutcome.FAILED: planning.RowOutcome.RETIRE_FAILED,
}


def _retire(session: Session, *, world: World, entry: PlanEntry, policy: Policy, retired_by: str) -> planning.RowResult:
    """One retirement under the caller's identity: the operator's retire protocol (`coroner.retire`)."""
    registration = entry.registration
    key = model.key_of(registration)
    subject = f"WorkerRegistration {key[0]}/{key[1]}"
    intent, retirer = planning.person_retirement(
        world=world, entry=entry, policy=policy, retired_by=retired_by, now=utcnow()
    )
    result = asyncio.run(retire(SessionPort(session, reporter=retired_by), intent, retirer=retirer, clock=utcnow))
    if result.event_error is not None:
        click.echo(
            f"warning: {subject} was retired but its Event was not posted: {result.event_error.message}", err=True
        )
    return planning.RowResult(
        key=key,
        outcome=_ROWS[result.outcome],
        detail=_row_detail(result),
        node_name=registration.node_name,
        pid=registration.incarnation.pid,
        evidence=result.evidence,
    )


def _row_detail(result: RetireResult) -> str:
    error = result.error
    if result.outcome is RetireOutcome.CONFLICT:
        return result.detail.removesuffix(".") + "; plan again."
    if result.outcome is RetireOutcome.UNREACHABLE and error is not None:
        return f"{error.message} Plan again to see whether it landed."
    if result.outcome is RetireOutcome.FAILED and error is not None and result.leases is None:
        return f"{error.message} Nothing written."  # a read before the write failed
    if result.outcome is RetireOutcome.REFUSED_BY_ADMISSION and result.refusal is not None:
        return f"{result.detail} {_refusal_fix(result.refusal)}"
    return result.detail


def _refusal_fix(refusal: AdmissionRefusal) -> str:
    """What to do about an admission refusal (the grant is there: the write is what was refused)."""
    if refusal.kind != "ValidatingAdmissionPolicy":
        return (
            f"Your retire grant is not the problem: the {refusal.kind} {refusal.name} refuses it "
            "(`kubectl get validatingwebhookconfigurations` names its owner)."
        )
    see = f"`kubectl get validatingadmissionpolicy {refusal.name} -o yaml` shows the rule"
    if refusal.name.startswith("coroner-"):
        return (
            f"Your retire grant is not the problem: plan again (the evidence may have changed since the plan); {see}."
        )
    return f"Your retire grant is not the problem: a policy that is not Coroner's refuses it; {see} and its binding."
