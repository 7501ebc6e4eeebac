"""The reliability suite: hostile inputs, secret canaries, crashes and outages, as figures.

``pytest`` runs it in its CI profile (a sample of each part, well under two minutes);
``python -m tests.reliability --full --write`` runs the full counts (>= 100,000 generated
calls) and rewrites the figures in ``docs/reliability.md``, so they cannot drift.
"""
