"""``kubectl coroner plan``: every registration decided as the operator decides it. Read-only."""

from __future__ import annotations

import sys

import click

from coroner.cli import options, render
from coroner.cli import plan as planning
from coroner.cli.session import Connection, Session, confirm_gone_nodes, gather, listed_policy, scope_of, utcnow
from coroner.core import fingerprint


@click.command("plan")
@options.scoped
@options.output
@options.common
def plan_command(
    namespace: str | None,
    all_namespaces: bool,
    output: str,
    connection: Connection,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
) -> None:
    """Every registration with its reason, counts by reason, and the fingerprints apply needs. Read-only.

    Save it for apply with -o json (or yaml): `kubectl coroner apply --from-plan FILE`.
    """
    scope = scope_of(namespace=namespace, all_namespaces=all_namespaces, connection=connection)
    session = Session(connection)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
        intern=sys.intern,
        keep_bodies=False,
    )
    now = utcnow()
    choice = listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    listing = confirm_gone_nodes(session, listing, policy=choice.policy, now=now)
    plan = fingerprint.decide_all(
        world=planning.build_world(listing),
        policy=choice.policy,
        now=now,
        keep_evidence=output in ("json", "yaml"),  # only the documents print each row's facts
    )
    render.emit(
        output,
        document=lambda: render.plan_document(
            plan, namespace=scope, now=now, retire_permission=listing.retire_permission, policy=choice
        ),
        table=lambda console, wide: render.render_plan(
            plan,
            console=console,
            namespace=scope,
            retire_permission=listing.retire_permission,
            policy=choice,
            wide=wide,
        ),
        names=render.plan_names(plan),
    )
