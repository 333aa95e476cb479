"""`python -m deploy.host VERB ...` runs the verbs of main.py (as the zip does on a host)."""
import sys

from deploy.host.main import main

main(sys.argv[1:])
