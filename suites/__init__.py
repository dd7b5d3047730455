"""The standard chaos suites (``pytest -m chaos``; installed as ``chaos.suites``, run by ``ray-chaos run``).

A package so that its test modules are ``suites.test_*`` (``chaos.suites.test_*`` installed),
never bare ``test_*`` names that clash with a same-named test file collected beside them.
"""
