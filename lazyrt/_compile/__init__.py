"""``torch.compile`` on tpu: the Dynamo backend ``"tpu"``.

Dynamo captures the graph, AOTAutograd splits it into forward and backward ATen graphs
(with the decompositions lazyrt applies in eager for ops it has no lowering for), and
each graph becomes ONE lazyrt program (``graph.GraphProgram``). ``import lazyrt`` imports
only ``api`` (the ``torch.compile`` rule, which imports nothing of Dynamo). Dynamo finds
the backend through the ``torch_dynamo_backends`` entry point
(``lazyrt._compile.backend:tpu_backend``); importing ``backend`` sets Dynamo up
(``dynamo.setup``), before Dynamo traces anything.
"""
