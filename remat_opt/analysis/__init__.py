"""What-if analysis before renting GPUs: memory against recompute time across budgets, models and
devices (`whatif`, behind ``notebooks/what_if.ipynb``), the whole training iteration of Thunder's
``benchmark_litgpt.py`` predicted (`training_step`), and Pareto curves as CSV, PNG and SVG (`curves`).
"""
