"""What is known of a run on the controller: its local record and directory, and each
task's progress read from its log."""
