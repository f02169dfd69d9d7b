"""Running the router: as a process (daemon.py) and as an OS service (service.py)."""
