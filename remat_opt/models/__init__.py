"""Models by name: litgpt configs and ``module:factory`` (`by_name`), the small models of the docs
and tests (`examples`), and their joint graphs at full depth, traced with a few layers on meta and
extended (`graphs`, `remat_opt.analyze_model`), kept in an opt-in on-disk cache (`graph_cache`).
"""
