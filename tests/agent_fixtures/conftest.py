# The fixture repositories hold failing tests on purpose: the agent's tests copy them into
# temporary folders and run them there. The suite itself must not collect them.
collect_ignore_glob = ["*"]
