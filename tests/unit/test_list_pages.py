"""`coroner.client.rest.list_pages`: one LIST, page by page, until the server sends no continue token."""

from __future__ import annotations

from typing import Any

import pytest

from coroner.client.rest import list_pages

pytestmark = pytest.mark.unit


class Pages:
    """A server holding `n` objects that answers a LIST `limit` at a time, as the API server does."""

    def __init__(self, n: int) -> None:
        self.items = [{"metadata": {"name": f"r{i}"}} for i in range(n)]
        self.queries: list[dict[str, Any]] = []

    def request(self, method: str, path: str, *, query: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert method == "GET"
        self.queries.append(dict(query))
        start = int(query.get("continue", 0))
        end = start + query["limit"]
        meta: dict[str, Any] = {"resourceVersion": "42"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return {"items": self.items[start:end], "metadata": meta}


@pytest.mark.parametrize(("n", "limit", "pages"), [(0, 3, 1), (1, 3, 1), (3, 3, 1), (4, 3, 2), (10, 3, 4)])
def test_every_object_once_in_pages_of_the_limit(n: int, limit: int, pages: int) -> None:
    server = Pages(n)
    got = list(list_pages(server, "/x", query={"labelSelector": "a=b"}, limit=limit))  # type: ignore[arg-type]
    assert len(got) == pages
    assert [i for page in got for i in page["items"]] == server.items
    assert all(q["limit"] == limit and q["labelSelector"] == "a=b" for q in server.queries)
    assert "continue" not in server.queries[0]
    assert got[-1]["metadata"]["resourceVersion"] == "42"
