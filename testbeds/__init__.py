"""What the tests and the benchmarks both run against: the least-squares problem with its
closed-form oracle (``lsq_problem``) and the app copy that misbehaves on purpose
(``fault_app``). Above every app package, below ``tests/`` and ``bench/``."""
