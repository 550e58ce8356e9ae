"""IR -> IR passes (canonicalize, reorder, compact, fuse, autodiff), each a module with a
``run`` function; :mod:`hector.compiler.pipeline` runs them in order.  ``common`` holds what
they share: the ``Decision`` record and the ``GraphStats`` cost-model input."""
