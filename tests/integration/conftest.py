"""The integration tests' own conftest: pytest rewrites the asserts in ``fuzzing.py``.

The API fuzz tests' shared helpers (``send``, ``assert_refusal``, ``listing``) check with
``assert``; pytest only rewrites the asserts of test modules and conftests unless told,
so without this their failures would lose pytest's explanation of the values compared.
The fixtures these tests use (``api``, ``settings``) are in ``tests/conftest.py``.
"""

import pytest

pytest.register_assert_rewrite("tests.integration.fuzzing")
