"""Reports built from a run: the merged timeline (JSON and PNG) and the run files."""
