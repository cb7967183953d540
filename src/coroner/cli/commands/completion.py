"""``kubectl coroner completion``: shell completion, for ``kubectl coroner <TAB>`` and ``kubectl-coroner <TAB>``.

kubectl (1.26 and later) completes a plugin's arguments by running ``kubectl_complete-<plugin>``
from PATH with the words typed after the plugin name, the last one the word being completed, and
reading cobra's answer: one completion a line (``value<TAB>description``), then ``:<directive>``.
The ``kubectl_complete-coroner`` executable installed with this package answers that way
(`kubectl_complete`), from click's own completion of this command group.
"""

from __future__ import annotations

import sys
from typing import Final

import click
from click.shell_completion import get_completion_class

#: The environment variable click's completion scripts set (the executable is kubectl-coroner).
COMPLETE_VAR: Final = "_KUBECTL_CORONER_COMPLETE"
EXECUTABLE: Final = "kubectl-coroner"
#: cobra's ShellCompDirectiveNoFileComp: offer no file names; ShellCompDirectiveDefault: do.
_NO_FILES: Final = 4
_FILES: Final = 0


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion_command(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL, for the kubectl-coroner executable.

    \b
    bash:  source <(kubectl coroner completion bash)
    zsh:   source <(kubectl coroner completion zsh)
    fish:  kubectl coroner completion fish | source
    `kubectl coroner <TAB>` needs no script: kubectl asks kubectl_complete-coroner, installed with
    this plugin, when its own completion is set up (kubectl completion bash|zsh|fish).
    """
    root = ctx.find_root().command
    complete = get_completion_class(shell)
    assert complete is not None  # every click.Choice above is a shell click knows
    click.echo(complete(root, {}, EXECUTABLE, COMPLETE_VAR).source())


def completions(root: click.Command, words: list[str]) -> tuple[list[tuple[str, str]], int]:
    """What to offer for the last of `words` (the words after ``kubectl coroner``), and cobra's
    directive: click's completion of `root`, files only where click says a path is expected."""
    *args, incomplete = words or [""]
    complete = get_completion_class("bash")
    assert complete is not None
    items = complete(root, {}, EXECUTABLE, COMPLETE_VAR).get_completions(args, incomplete)
    offered = [(item.value, item.help or "") for item in items if item.type == "plain"]
    wants_files = any(item.type in ("file", "dir") for item in items)
    return offered, _FILES if wants_files and not offered else _NO_FILES


def kubectl_complete(argv: list[str] | None = None) -> None:
    """The ``kubectl_complete-coroner`` executable: answer kubectl's plugin completion request."""
    from coroner.cli.kubectl import main

    words = list(sys.argv[1:] if argv is None else argv)
    offered, directive = completions(main, words)
    for value, help_text in offered:
        first = help_text.splitlines()[0] if help_text else ""
        click.echo(f"{value}\t{first}" if first else value)
    click.echo(f":{directive}")


if __name__ == "__main__":
    kubectl_complete()
