"""One module per ``ppx`` command; `ppx.cli` parses the command line and calls them."""
