"""Fixtures for the port/check engine tests."""

from __future__ import annotations

import pytest

from tputool.rules import catalogue as registry


@pytest.fixture
def fresh_registry():
    """Clear the rule-registry caches around a test that changes the rule modules."""
    for cache in (registry.all_rules, registry.python_codes, registry.listed_rules):
        cache.cache_clear()
    yield registry
    for cache in (registry.all_rules, registry.python_codes, registry.listed_rules):
        cache.cache_clear()
