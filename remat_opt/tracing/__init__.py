"""Thunder traces in, joint graphs out: the edge where remat-opt reads what Thunder compiles.

`extract` runs Thunder's autodiff, fusion and split on an isolated copy of a trace (the dry run) and
builds the `JointGraph` (`remat_opt.analyze`); `storage` finds which tensors share a storage by
running ops on the meta device; `op_semantics` decides what an op does (random, a torch fallback
and the work its vjp re-runs). Every module here applies `remat_opt._compat` before importing Thunder.
"""
