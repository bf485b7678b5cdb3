"""Fault injection on the real local cluster (issue 6): randomized scenarios, checked from what listeners saw.

`python -m tests.chaos` (`make chaos`) runs many scenarios; `tests/integration/test_chaos.py` a short set
inside `make test`. `plan` and `checker` are pure (unit-tested); `scenario` moves the data.
"""
