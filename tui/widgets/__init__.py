"""The chat's widgets: the conversation, the message box and the status bar."""
