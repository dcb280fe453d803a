"""The error an action ends with: its message goes back to the model, never to the user."""


class ToolError(Exception):
    """An action the harness refused or could not carry out; one line the model can act on."""
