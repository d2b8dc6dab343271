"""Graph machinery: one Theano graph in, one spread over the contexts out.

- ``transfer``: the transfer op that keeps placement (and the host's name);
- ``replace``: a graph rewritten to read other variables, without copies;
- ``gradients``: stand-ins for ``K.gradients``, replaced by the gradients of
  the rewritten loss;
- ``rows``: how a batch's rows are shared among replicas and ranks, and
  where a graph makes them meet;
- ``batchwise``: the data-parallel rewrite; ``whole_batch``: what it
  computes over the whole batch, where the rows meet;
- ``placed``, ``planner``, ``plan``, ``layerwise``: the model-parallel
  weights, arithmetic, plan and rewrite;
- ``sharding``: which context owns each weight in sharded batch-wise mode;
- ``placement``: the check that a compiled function runs where it should;
- ``report``: the placement report.

Nothing here knows Keras: what Keras's graphs say (which tensor a layer
made) comes in as arguments from ``theano_multigpu.keras_adapter``.

May import: ``theano_multigpu.compat``, ``theano_multigpu.config`` and the
base modules (``errors``, ``importhook``, ``patch_targets``).  ``planner``
imports no Theano.
"""
