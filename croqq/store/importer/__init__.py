"""`croqq import`: a CroqTile-style tuning tree into the results repo."""
