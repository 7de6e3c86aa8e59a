"""The operator's dashboard: a few server-rendered pages (Jinja2, autoescaped) and one static
script, served by the control plane's HTTP app under /dashboard (`routes.py`); sign-in and its
session cookie are `session.py`. No build step: the templates and the script ship as they are."""
