"""``kubectl coroner apply``: retire the approved rows of a plan, under your own ``retire`` verb.

Re-reads and recomputes the plan, compares it with the fingerprints a person approved
(`coroner.cli.plan.assess_apply`), and retires each approved row with the operator's steps:
capability review, Lease fence, compare-and-swap patch, Event.
"""

from __future__ import annotations

from collections.abc import Sequence

import click
import urllib3
from kubernetes.client.exceptions import ApiException

from coroner.cli import options, render
from coroner.cli import plan as planning
from coroner.cli.session import (
    EXIT_DRIFT,
    EXIT_OK,
    EXIT_USAGE,
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
from coroner.core import api, model
from coroner.core.decision import Policy, decide
from coroner.core.fingerprint import PlanEntry
from coroner.core.reasons import EventReason
from coroner.core.world import Key, World, lease_facts


@click.command("apply")
@options.scoped
@click.option("--registry-fingerprint", required=True, help="registryFingerprint from the plan you approved.")
@click.option("--candidate-fingerprint", required=True, help="candidateFingerprint from the plan you approved.")
@click.option("--yes", is_flag=True, help="Retire. Without it apply only previews and writes nothing.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@options.common
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def apply_command(
    ctx: click.Context,
    namespace: str | None,
    all_namespaces: bool,
    registry_fingerprint: str,
    candidate_fingerprint: str,
    yes: bool,
    output: str,
    kubeconfig: str | None,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
    names: tuple[str, ...],
) -> None:
    """Retire NAMES (or NAMESPACE/NAME with -A) of an approved plan, under your own retire verb.

    Re-reads and recomputes the plan; aborts with exit code 3 (RegistryMoved, CandidateSetMoved)
    if it is not the approved one. Replaying a successful apply reports its rows AlreadyRetired
    and exits 0.
    """
    for flag, value in (
        ("--registry-fingerprint", registry_fingerprint),
        ("--candidate-fingerprint", candidate_fingerprint),
    ):
        if not planning.valid_fingerprint(value):
            raise PluginError(
                f"{flag} {value!r} is not a Coroner fingerprint (v1:sha256:<64 hex digits>); copy it from the "
                f"output of `kubectl coroner plan`."
            )
    scope = scope_of(namespace=namespace, all_namespaces=all_namespaces, kubeconfig=kubeconfig)
    keys = _keys(names, scope=scope)
    session = Session(kubeconfig=kubeconfig)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
    )
    choice = listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    policy = choice.policy
    now = utcnow()
    listing = confirm_gone_nodes(session, listing, policy=policy, now=now)
    world = planning.build_world(listing)
    plan = planning.decide_all(world=world, policy=policy, now=now)
    assessment = planning.assess_apply(
        plan=plan,
        names=keys,
        registry_fingerprint=registry_fingerprint,
        candidate_fingerprint=candidate_fingerprint,
    )
    if assessment.abort is not None or assessment.refusals:
        if output == "json":
            document = render.apply_document(
                assessment=assessment, results=(), preview=not yes, retired_by=None, policy=choice
            )
            click.echo(render.dump(document, output="json"), nl=False)
        if assessment.abort is not None:
            fail(ctx, f"apply aborted: {assessment.abort_detail}", code=EXIT_DRIFT)
        *others, last = assessment.refusals
        for sentence in others:
            click.echo(f"error: {sentence}", err=True)
        fail(ctx, f"{last} Nothing was changed.", code=EXIT_USAGE)

    results = [
        planning.RowResult(
            key=planning.key_of(entry.registration),
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
                key=planning.key_of(entry.registration),
                outcome=planning.RowOutcome.WOULD_RETIRE,
                detail=entry.decision.detail,
                node_name=entry.registration.node_name,
                pid=entry.registration.incarnation.pid,
                evidence=entry.row.death_evidence,
            )
            for entry in assessment.to_retire
        ]
    else:
        retired_by = session.whoami() if assessment.to_retire else None
        for entry in assessment.to_retire:
            assert retired_by is not None
            results.append(_retire(session, world=world, entry=entry, policy=policy, retired_by=retired_by))
    results.sort(key=lambda result: result.key)
    if output == "json":
        document = render.apply_document(
            assessment=assessment, results=results, preview=not yes, retired_by=retired_by, policy=choice
        )
        click.echo(render.dump(document, output="json"), nl=False)
    else:
        render.render_apply(
            results=results, console=render.console(), preview=not yes, retired_by=retired_by, policy=choice
        )
    code = planning.apply_exit_code(results)
    if code != EXIT_OK:
        failed = [f"{planning.display(r.key)} {r.outcome}" for r in results if not r.outcome.done]
        fail(ctx, f"apply did not complete: {', '.join(failed)}; run `kubectl coroner plan` to see why.", code=code)


def _already_retired_detail(entry: PlanEntry) -> str:
    record = entry.registration.retirement
    assert record is not None
    when = model.format_time(record.retired_time) if record.retired_time else "an unrecorded time"
    return f"already retired by {record.retired_by or '?'} at {when} ({record.reason}); nothing written."


def _keys(names: Sequence[str], *, scope: str | None) -> list[Key]:
    keys: list[Key] = []
    for name in names:
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


def _retire(session: Session, *, world: World, entry: PlanEntry, policy: Policy, retired_by: str) -> planning.RowResult:
    """One compare-and-swap retirement under the caller's identity, as the operator's steps 2-4."""
    registration = entry.registration
    key = planning.key_of(registration)
    namespace, name = key
    subject = f"WorkerRegistration {namespace}/{name}"

    def result(outcome: planning.RowOutcome, detail: str, evidence: str | None = None) -> planning.RowResult:
        return planning.RowResult(
            key=key,
            outcome=outcome,
            detail=detail,
            node_name=registration.node_name,
            pid=registration.incarnation.pid,
            evidence=evidence,
        )

    try:
        # Step 2a: the capability, again, right before the write: a revocation since the plan wins.
        if session.can_retire(namespace=namespace, name=name) is not True:
            return result(
                planning.RowOutcome.RETIRE_PERMISSION_MISSING,
                f"{retired_by} does not hold the {api.RETIRE_VERB} verb on {subject} now; nothing written.",
            )
        # Step 2b: the Lease fence: decide once more with the Leases as they are right now.
        live = {facts.name: facts for facts in map(lease_facts, session.list_leases(namespace=namespace))}
        now = utcnow()
        fenced = decide(
            registration=registration,
            facts=world.facts_for(
                key, now=now, leases_override=live, permission_override=True, use_permission_override=True
            ),
            policy=policy,
            now=now,
        )
        if not fenced.retirable:
            return result(
                planning.RowOutcome.RETIRE_ABANDONED,
                f"decided again right before the write: {fenced.reason}: {fenced.detail} Nothing written.",
            )
        ops = planning.retirement_patch(
            body=world.bodies[key], registration=registration, decision=fenced, retired_by=retired_by, now=utcnow()
        )
    except PluginError as exc:
        return result(planning.RowOutcome.RETIRE_FAILED, f"{exc.message} Nothing written.")
    evidence = fenced.death_evidence.value if fenced.death_evidence else None
    # Step 3: compare-and-swap.
    try:
        patched = patch_registration_status(session.client, namespace=namespace, name=name, body=ops)
    except ApiException as exc:
        message = server_message(exc)
        if exc.status in (404, 409, 422):
            return result(
                planning.RowOutcome.RETIRE_CONFLICT,
                f"{subject} changed after it was read at resourceVersion {registration.resource_version} "
                f"({exc.status}: {message}): it moved, nothing written; plan again.",
            )
        if exc.status == 403:
            return result(
                planning.RowOutcome.RETIRE_PERMISSION_MISSING, f"the API server refused the retirement: {message}."
            )
        if exc.status in (0, None):
            return result(
                planning.RowOutcome.RETIRE_FAILED,
                f"{session.unreachable(exc).message} Plan again to see whether it landed.",
            )
        return result(planning.RowOutcome.RETIRE_FAILED, f"{exc.status} {exc.reason}: {message}; nothing written.")
    except urllib3.exceptions.HTTPError as exc:
        return result(
            planning.RowOutcome.RETIRE_FAILED,
            f"{session.unreachable(exc).message} Plan again to see whether it landed.",
        )
    # Step 4: the Event. The retirement stands whether or not its Event can be posted.
    try:
        session.post_event(
            body=patched,
            reason=EventReason.RETIRED.value,
            message=f"{evidence}: retired by {retired_by} with kubectl coroner apply: {fenced.detail}",
            reporter=retired_by,
        )
    except PluginError as exc:
        click.echo(f"warning: {subject} was retired but its Event was not posted: {exc.message}", err=True)
    return result(planning.RowOutcome.RETIRED, f"{evidence}: {fenced.detail}", evidence)
