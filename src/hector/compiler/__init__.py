"""The Hector compiler: a layer written in the DSL (``dsl``, ``models``) is traced into the IR
(``ir``), rewritten by passes (``passes/``, run in order by ``pipeline``), lowered to a plan of
kernel steps (``lower``, ``plan``) and executed step by step (``execute``, with the torch steps
in ``steps_torch`` and the Triton ones in ``steps_triton``).  ``program`` ties this together
behind :func:`hector.compile`; ``explain`` prints every decision.

Imports only downward: graph, device, checks and ``hector.kernels``; never ``hector.nn``."""
