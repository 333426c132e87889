"""Apply: `CostRemat`, the Thunder transform that plans at compile time and writes Thunder's own
``RECOMPUTE_IN_BACKWARD`` tags (`cost_remat`), and what it needs of Thunder's FSDP and DDP, so that
every rank issues the same collectives (`ranks`).
"""
