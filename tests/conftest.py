"""The fixtures every test directory shares live in tests/support/fixtures.py (a plugin, so a
test module never imports a conftest); plain helpers are in tests/support/helpers.py."""

pytest_plugins = ["tests.support.fixtures"]
