"""``kubectl coroner plan``: every registration decided as the operator decides it. Read-only."""

from __future__ import annotations

import click

from coroner.cli import options, render
from coroner.cli import plan as planning
from coroner.cli.session import Session, confirm_gone_nodes, gather, listed_policy, scope_of, utcnow


@click.command("plan")
@options.scoped
@click.option("--output", "-o", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
@options.common
def plan_command(
    namespace: str | None,
    all_namespaces: bool,
    output: str,
    kubeconfig: str | None,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
) -> None:
    """Every registration with its reason, counts by reason, and the fingerprints apply needs. Read-only."""
    scope = scope_of(namespace=namespace, all_namespaces=all_namespaces, kubeconfig=kubeconfig)
    session = Session(kubeconfig=kubeconfig)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
    )
    now = utcnow()
    choice = listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    listing = confirm_gone_nodes(session, listing, policy=choice.policy, now=now)
    plan = planning.decide_all(world=planning.build_world(listing), policy=choice.policy, now=now)
    if output == "table":
        render.render_plan(
            plan, console=render.console(), namespace=scope, retire_permission=listing.retire_permission, policy=choice
        )
    else:
        document = render.plan_document(
            plan, namespace=scope, now=now, retire_permission=listing.retire_permission, policy=choice
        )
        click.echo(render.dump(document, output=output), nl=False)
