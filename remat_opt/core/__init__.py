"""The pure core: the joint forward-backward graph and everything decided on it alone.

`graph` is the data model (`JointGraph`: ops, tensors, storages, sizes); `plan` holds remat plans,
the independent plan checker and the step-peak simulation; `problem` is the save-or-recompute
decision as the solvers see it; `layers` finds the repeated transformer layers, which `deepen` copies
to extend a few traced layers to a model's full depth; `report` formats graphs and bytes; `errors`
holds the errors users catch. Nothing here imports torch or Thunder (import contracts in
`pyproject.toml`).
"""
