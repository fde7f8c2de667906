"""``unlearn audit``: read-only web pages that show, per subject and per head, what happened to a
person's data (docs/audit.md): ``app`` (routes, credential), ``views`` (facts from the topics),
``pages`` (HTML), ``cli``, ``settings``."""
