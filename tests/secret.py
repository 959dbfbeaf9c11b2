"""The task-token secret every process of the suite and the benchmarks runs with. A module of
its own: importing tests.conftest would point the importer's settings at the tests' Redis."""

TEST_SECRET = "test-secret-of-the-suite-0123456789abcdef"  # 32+ bytes, as every process demands
