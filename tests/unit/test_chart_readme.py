"""The chart's README is what coroner_dev.chart_readme makes of values.yaml and values.schema.json,
and it says something of every value."""

from __future__ import annotations

import json

import pytest
import yaml

from coroner_dev import chart_readme

pytestmark = pytest.mark.unit


def test_the_committed_readme_is_the_generated_one() -> None:
    committed = (chart_readme.CHART / chart_readme.README).read_text()
    assert committed == chart_readme.render(), "run `python -m coroner_dev.chart_readme` (values.yaml changed)"


def test_every_value_has_a_row_that_says_what_it_does() -> None:
    values_text = (chart_readme.CHART / "values.yaml").read_text()
    schema = json.loads((chart_readme.CHART / "values.schema.json").read_text())
    table = chart_readme.table(values_text, schema)
    documented = {line.split("`")[1]: line.rsplit("|", 2)[1].strip() for line in table[2:]}
    top = yaml.safe_load(values_text)
    for key in ("namePrefix", "retireGrant.enabled", "operator.resources", "operator.affinity", "agent.extraArgs"):
        assert key in documented, key
    assert set(top) == {path.split(".")[0] for path in documented}
    assert [path for path, said in documented.items() if not said] == []


def test_comments_belong_to_the_key_right_below_them() -> None:
    text = "# top\na:\n  # inner\n  b: 1\n\n  # lost: a blank line follows\n\n  c: 2\n# d's\nd: {}\n"
    assert chart_readme.comments(text) == {"a": "top", "a.b": "inner", "d": "d's"}


def test_a_map_described_as_a_whole_is_one_row() -> None:
    schema = {"properties": {"x": {"properties": {"r": {"description": "whole", "properties": {"limits": {}}}}}}}
    rows = list(chart_readme.rows({"x": {"r": {"limits": {"memory": "1Mi"}}}}, schema))
    assert rows == [("x.r", {"limits": {"memory": "1Mi"}}, "whole")]
