"""`autoloop watch`: the night in a terminal, live and read-only, for a person on SSH
without a browser. The data are the dashboard's views (review/dashboard/views.py); this
package only draws them with rich (an optional extra: ``pip install 'autoloop[watch]'``).
"""
