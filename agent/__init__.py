"""`kog agent`: a coding agent that edits a repository until its tests pass.

The loop (loop.py) reads top to bottom; everything it leans on has its own module:
workspace.py (path confinement, atomic writes), checkpoint.py (save before the first
write, byte-exact undo), actions.py (the answer format), edits.py (search/replace),
tools.py (what an action does), errors.py (the error an action ends with),
testcmd.py + process.py (finding and running the tests, killing what hangs),
repomap.py, prompts.py, history.py, budget.py (what the model sees, within its window),
client.py, client_local.py, client_openai.py (the engine's Session, or an OpenAI-compatible
endpoint), trajectory.py + display.py (the log, and how a run is shown or replayed).
The agent talks to the engine only through `engine.api` and `Session`.
"""
