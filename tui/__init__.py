"""`kog chat`: a Textual chat on top of the engine's `Session`, with its chats kept in SQLite."""
