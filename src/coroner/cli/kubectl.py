"""``kubectl coroner plan | apply | doctor | inject``: the human's view of, and hand on, the registry.

Plan-only clusters (the recommended first install) retire nothing by themselves: a person reviews
``plan``, approves it by its two fingerprints, and ``apply`` retires exactly the approved rows under
that person's own ``retire`` verb — with the operator's facts, the operator's decision and the
operator's compare-and-swap patch, so the human path can be no less safe than the automatic one.
``doctor`` says whether the automatic path works at all. ``inject`` adds the registrar to
manifests (no request).

This module is the click group only. Each command is a module of `coroner.cli.commands`; they share
the options of `coroner.cli.options` and the API session of `coroner.cli.session`; what they
conclude is decided in the pure `coroner.cli.plan` and `coroner.cli.doctor`, and shown by
`coroner.cli.render`.

Exit codes: 0 ok; 1 a doctor check failed; 2 usage error, bad input, refusal or unreachable
cluster; 3 apply aborted on drift (nothing written) or a row moved under its write.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Final

import click

from coroner.cli.commands import apply, completion, doctor, inject, plan, version
from coroner.cli.session import DEBUG_ENV, EXIT_USAGE, PluginError

#: How a user types it; kubectl runs the plugin as ``kubectl-coroner``.
PROG_NAME: Final = "kubectl coroner"


class PluginGroup(click.Group):
    """Turns any failure into one ``error:`` sentence and its exit code; a traceback only on request.
    Its usage lines say ``kubectl coroner``, not the executable's name ``kubectl-coroner``."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("prog_name", PROG_NAME)
        kwargs.setdefault("complete_var", completion.COMPLETE_VAR)
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        # A command reads one snapshot and keeps nearly all it builds until it exits, so the cycle
        # collector would only re-walk a growing heap: it was a third of the time `plan -A` spent
        # caching 150,000 registrations. Reference counting still frees what is dropped; the
        # collector runs again after the command (the tests invoke commands in one process).
        collecting = gc.isenabled()
        gc.disable()
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except PluginError as exc:
            click.echo(f"error: {exc.message}", err=True)
            raise click.exceptions.Exit(exc.exit_code) from None
        except Exception as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            click.echo(
                f"error: unexpected {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}; run again with "
                f"{DEBUG_ENV}=1 for the traceback and report it.",
                err=True,
            )
            raise click.exceptions.Exit(EXIT_USAGE) from None
        finally:
            if collecting:
                gc.enable()


@click.group(PROG_NAME, cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """See what Coroner would retire, retire it under your own retire verb, diagnose the install.

    \b
    Exit codes: 0 ok; 1 a doctor check failed; 2 usage error, bad input, refusal or unreachable
    cluster; 3 apply aborted on drift, or a row moved under its write.
    """


main.add_command(plan.plan_command)
main.add_command(apply.apply_command)
main.add_command(doctor.doctor_command)
main.add_command(version.version_command)
main.add_command(inject.inject_command)
main.add_command(completion.completion_command)


if __name__ == "__main__":
    main()
