"""One module per ``kubectl coroner`` command; `coroner.cli.kubectl` adds each to the group."""
