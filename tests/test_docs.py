"""The docs cannot drift from the code: the key table, the README's size, links, invariants.

Pure file reads and `shared.keys`: no Redis, no processes.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

from shared.keys import FUNCTIONS, Keys, TenantKeys

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_BYTES = 10240

# Members of Keys/TenantKeys that spell no key: connection names, prefixes scripts append to,
# SCAN patterns and their parser, the generic conversation key, and the step from the fleet's
# keys to a tenant's.
NOT_KEYS = frozenset(
    {
        "worker_client_prefix",
        "worker_client_name",
        "tenant",
        "conversation_prefix",
        "conversations_pattern",
        "person_in",
        "outbound_prefix",
        "outbound_pattern",
        "seen_book",
        "seen_book_pattern",
        "outbound_book",
        "outbound_book_pattern",
        "lastin_book",  # its generations' row says what its shards hold
        "conversation",  # any kind of a conversation's keys: each kind has its own row
        "review_ix_reason_prefix",  # the prefix of `review_ix_reason`, which has its row
    }
)
# Pages another branch generates: linking to them is fine once they exist (then drop them here).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INVARIANT_CITED = re.compile(r"invariants? (\d+(?:(?:, | and )\d+)*)", re.IGNORECASE)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
INVARIANT_HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)


def _keys_of(obj: Keys | TenantKeys) -> Iterator[str]:
    """Every key `obj` can spell, its arguments written as `<parameter name>`."""
    for name, member in inspect.getmembers(type(obj)):
        if name.startswith("_") or name in NOT_KEYS:
            continue
        if isinstance(member, property | cached_property):
            yield getattr(obj, name)
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            yield getattr(obj, name)(*(f"<{p}>" for p in params))


def code_keys() -> set[str]:
    keys = Keys("wa")
    # FUNCTIONS: server-wide, a constant of the module rather than under a prefix
    return set(_keys_of(keys)) | set(_keys_of(keys.tenant("T"))) | {FUNCTIONS}


def table_keys() -> set[str]:
    text = (DOCS / "architecture.md").read_text()
    section = text.split("## Redis key layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {row.split("`")[1] for row in rows}


def test_every_key_in_code_has_a_row_in_the_key_table_and_every_row_a_key() -> None:
    in_code, in_table = code_keys(), table_keys()
    assert len(in_code) >= 20, "the introspection found the keys"
    assert sorted(in_code - in_table) == [], "keys shared/keys.py spells with no row"
    assert sorted(in_table - in_code) == [], "rows of docs/architecture.md with no key in code"


def test_the_readme_is_a_front_door() -> None:
    assert len(README.read_bytes()) <= README_MAX_BYTES


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_points_to_a_file_that_exists() -> None:
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            path, _, anchor = target.partition("#")
            if re.match(r"[a-z]+:", path):
                continue  # a URL
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists() or (anchor and anchor not in _anchors(resolved)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in ast.walk(tree) if isinstance(node, funcs)}


def test_the_invariants_page_names_nine_and_every_test_it_names_exists() -> None:
    text = (DOCS / "invariants.md").read_text()
    assert [int(n) for n in INVARIANT_HEADING.findall(text)] == list(range(1, 10))
    for section in INVARIANT_HEADING.split(text)[2::2]:
        assert TEST_REF.search(section), "each invariant names a test"
    missing = [
        f"{file}::{name}"
        for file, name in TEST_REF.findall(text)
        if not (REPO / file).is_file() or name not in _test_functions(REPO / file)
    ]
    assert missing == []


def test_every_invariant_the_code_cites_is_one_of_the_nine() -> None:
    cited = INVARIANT_CITED.findall(
        "\n".join(
            p.read_text()
            for package in ("receiver", "worker", "shared")
            for p in sorted((REPO / package).rglob("*"))
            if p.suffix in (".py", ".lua")
        )
    )
    numbers = {int(n) for group in cited for n in re.findall(r"\d+", group)}
    assert numbers and numbers <= set(range(1, 10)), numbers
