"""From a joint graph, its costs and a request (budgets, solver, time limit) to a checked plan.

`planner` builds the decision problem, runs a solver from `remat_opt.solvers` and checks the plan;
`fusion_search` plans through a fusion executor's own pass (Thunder's dry runs handed in as
functions); `explanation` turns a plan into the per-tensor table of `remat_opt.explain`. Pure: no
Thunder, no torch.
"""
