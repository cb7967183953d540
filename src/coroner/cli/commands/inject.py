"""``kubectl coroner inject``: the registrar added to the Pod templates of a manifest, as text.

A text transform, as `linkerd inject` is: it reads manifests (files, directories, standard input;
multi-document YAML or JSON), adds the registrar (`coroner.core.inject`, the one place that builds
it) to every Pod template, and prints every document, in the order read, as YAML on stdout:

    kubectl coroner inject -f deploy.yaml | kubectl apply -f -
    kubectl get deploy -n jobs -o yaml | kubectl coroner inject -f - | kubectl apply -f -

It makes no request. What it injected is said on stderr, one line per object. Where an object
cannot have the registrar, nothing is printed on stdout: each such object is one `error:` line
naming it, where it was read, why, and the fix (exit 2).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Final

import click
import yaml

from coroner.cli.session import EXIT_USAGE, PluginError
from coroner.core import inject

#: The files a directory is read for (and its subdirectories, in name order).
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")


class _Loader(yaml.SafeLoader):
    """YAML as Kubernetes reads it, for a transform that must print back what it read: a timestamp
    stays the string it was (PyYAML would make `2026-01-02T03:04:05Z` a datetime and print it back
    otherwise)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Dumper(yaml.SafeDumper):
    """Block style, the keys in the order read, multi-line strings as literal blocks (a ConfigMap's
    script stays readable), no line folding."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _string)


def documents_of(text: str, *, source: str) -> list[tuple[str, dict[str, Any]]]:
    """The objects of one input, each with where it was read (`SOURCE, document N`); empty documents
    are skipped. JSON (one object) or YAML (any number of documents)."""
    stripped = text.lstrip()
    loaded: list[Any]
    if stripped.startswith("{"):
        try:
            loaded = [json.loads(text)]
        except ValueError:
            loaded = _yaml_documents(text, source=source)
    else:
        loaded = _yaml_documents(text, source=source)
    found = []
    for number, document in enumerate(loaded, start=1):
        where = f"{source}, document {number}"
        if document is None:
            continue
        if not isinstance(document, dict):
            raise PluginError(
                f"{where} is a {type(document).__name__}, not a Kubernetes object; inject reads manifests "
                "(objects with apiVersion, kind and metadata)."
            )
        found.append((where, document))
    return found


def _yaml_documents(text: str, *, source: str) -> list[Any]:
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise PluginError(f"{source} is not valid YAML or JSON ({detail}); fix it and run inject again.") from None


def _files(path: pathlib.Path) -> Iterator[pathlib.Path]:
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    else:
        yield path


def read_inputs(filenames: Sequence[str], *, stdin: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every object of every input, in the order given (a directory's files in name order)."""
    found = []
    for name in filenames:
        if name == "-":
            found.extend(documents_of(stdin.read(), source="stdin"))
            continue
        path = pathlib.Path(name)
        if not path.exists():
            raise PluginError(f"{name} does not exist; give a file, a directory or - (standard input) to -f.")
        for file in _files(path):
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PluginError(f"cannot read {file}: {exc}; give a readable manifest to -f.") from None
            found.extend(documents_of(text, source=str(file)))
    return found


def dump(documents: Sequence[dict[str, Any]]) -> str:
    """The documents as one YAML stream, `---` between them."""
    return "---\n".join(
        yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=2**31)
        for document in documents
    )


def _image(_: click.Context, param: click.Parameter, value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise click.BadParameter(
            f"{value!r} is not an image reference (e.g. registry.example/coroner-registrar:v0.1.0)"
        )
    return value


@click.command("inject")
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    metavar="FILE|DIR|-",
    help="A manifest (multi-document YAML or JSON), a directory of them (.yaml, .yml, .json, and its "
    "subdirectories), or - for standard input. Repeatable; printed in the order given.",
)
@click.option(
    "--image",
    default=inject.REGISTRAR_IMAGE,
    show_default=True,
    callback=_image,
    help="The registrar's image (its entrypoint must be `coroner`).",
)
def inject_command(filenames: tuple[str, ...], image: str) -> None:
    """Add the registrar to every Pod template of the manifests and print them as YAML.

    \b
    The registrar (`coroner registrar`, a native sidecar with shareProcessNamespace) registers the
    main process of every other container of the Pod, so workers whose images hold nothing of
    Coroner are registered. Pods, Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and
    CronJobs are injected (a List's items each); everything else is printed unchanged. Injecting
    again changes nothing. Makes no request:

    \b
      kubectl coroner inject -f deploy.yaml | kubectl apply -f -
    """
    read = read_inputs(filenames, stdin=sys.stdin)
    out: list[dict[str, Any]] = []
    said: list[str] = []
    refused: list[str] = []
    for where, document in read:
        try:
            result = inject.inject_reporting(document, image=image)
        except inject.InjectionRefused as exc:
            refused.append(f"{where}: {exc}")
            continue
        out.append(result.document)
        said.extend(f"{what} injected ({where})" for what in result.injected)
    if refused:  # nothing on stdout: a partial manifest piped to `kubectl apply` would apply the rest
        for message in refused:
            click.echo(f"error: {message}.", err=True)
        raise click.exceptions.Exit(EXIT_USAGE)
    if not read:
        raise PluginError(f"no object in {', '.join(filenames)}; give inject the manifests to change.")
    click.echo(dump(out), nl=False)
    for line in said:
        click.echo(line, err=True)
    if not said:
        click.echo("warning: no Pod template in the input: nothing was injected.", err=True)
