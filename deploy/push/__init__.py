"""What travels to the hosts: the payload and data directories, sent incrementally by
content, and the host package as a zip."""
