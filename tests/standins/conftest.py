"""Stand-ins started once per module (each runs in its own thread) and reset around every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scripts.standins import GraphApiStandIn, MessagesApiStandIn

TOKEN = "test-token"
API_KEY = "test"


@pytest.fixture(scope="module")
def graph_server() -> Iterator[GraphApiStandIn]:
    with GraphApiStandIn(access_tokens=TOKEN) as standin:
        yield standin


@pytest.fixture
def graph(graph_server: GraphApiStandIn) -> Iterator[GraphApiStandIn]:
    graph_server.reset()
    yield graph_server
    graph_server.reset()


@pytest.fixture(scope="module")
def ai_server() -> Iterator[MessagesApiStandIn]:
    with MessagesApiStandIn(api_keys=API_KEY) as standin:
        yield standin


@pytest.fixture
def ai(ai_server: MessagesApiStandIn) -> Iterator[MessagesApiStandIn]:
    ai_server.reset()
    yield ai_server
    ai_server.reset()
