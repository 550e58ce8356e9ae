"""The Triton backend's kernel templates as the compiler calls them, one module per step
family; imports go down this list, and :mod:`hector.compiler.execute` picks a step's runner
from its module (nothing is re-exported here):

* :mod:`.edgewise`: the generated ``edgewise`` kernel: traversal bodies that are not
  movements or a plain edge softmax, and IR the runtime builds itself (the attention steps'
  per-edge keys times ``p_r`` and edge-folded scores);
* :mod:`.traversal`: ``traversal`` steps on the traversal kernels, through the movement
  chains' weighted CSRs (:func:`~.traversal.movement_csr`), composed once per graph;
* :mod:`.gemm`: ``gemm`` steps on the segment GEMM (gather/scatter, CSR prologue and scatter
  epilogue on those CSRs, per-head in place), weight and bias gradients;
* :mod:`.attention`: ``attention`` and ``attention_bwd`` steps on the fused attention op, on
  the graph or a derived graph lowering chose.
"""
