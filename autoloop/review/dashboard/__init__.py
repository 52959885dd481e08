"""`autoloop dashboard`: a live, read-only web page of the night (server.py, views.py, static/)."""
