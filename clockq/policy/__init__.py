"""clockq's pure scheduling policy.

Nothing here imports Django or Celery: functions take plain values (and the clock, where time
matters) and return decisions. Workers, beat tasks and the trace simulator all call this code.
"""
