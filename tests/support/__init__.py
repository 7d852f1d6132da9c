"""What the tests share: fixtures (a pytest plugin, `tests.support.fixtures`, loaded by the root
conftest) and plain helpers (`tests.support.helpers`), imported like any module."""
