"""What every op of a joint graph costs: `graph_costs` prices ops and chains of ops from the
`costmodels` formulas or a measured table (pure); `profiling` times every distinct op and fusion
region on this device (``remat-opt profile``); `cost_cache` is ``cost_table="auto"``, those times
measured at the first compilation and cached on disk.
"""
