"""The tuning domain in pure Python: manifest, shapes, schedule, knobs and the per-shape FSM.

Nothing here imports Celery or Redis; the cluster drives these functions.
"""
