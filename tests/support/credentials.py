"""The secrets every process of the suite and the benchmarks runs with. A module of its own:
importing tests.conftest would point the importer's settings at the tests' Redis."""

TEST_SECRET = "test-secret-of-the-suite-0123456789abcdef"  # 32+ bytes, as every process demands
# The HTTP API's credentials in every test deployment (32+ bytes of no one repeated character,
# as the settings demand).
ADMIN_TOKEN = "test-admin-token-" + "0a1b2c3d4e5f6789" * 2
VIEWER_TOKEN = "test-viewer-token-" + "9f8e7d6c5b4a3210" * 2
WEBHOOK_SECRET = "test-github-webhook-secret"
