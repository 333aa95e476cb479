"""What people see: the live view, tables and messages, drawn with rich."""
