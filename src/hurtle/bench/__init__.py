"""``hurtle.bench``: the comparative benchmark suite (``hurtle bench ...``).

hurtle against the raw redis-py loops it is measured by and against its peers, each run the same
way: publish N calls of ``add(5, 6)``, then consume them in separate worker processes. Nothing here
is imported by ``import hurtle``, and nothing here is part of the test run's timings.
"""
