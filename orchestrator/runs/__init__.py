"""Everything about a run, on every OS: its id (ids.py), where it lives on the nodes and here
(layout.py), how its lines name their ranks (ranks.py), the node-side scripts that start, stop,
inspect and list it (posix.py, windows.py, declared in base.py; a foreground run's follower and
watchdog on native Windows: windows_follow.py), the tail protocol with its three producers and its
parser (tail.py), and the operations the commands call: starting a run (start.py), and following,
inspecting, stopping and fetching one (control.py).

Below ``steps`` (launch prepares a run directory and uploads the launcher; this package starts,
follows, stops and fetches), above ``platforms`` (it asks them only for quoting and paths).
"""
