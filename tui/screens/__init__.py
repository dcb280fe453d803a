"""Modal screens over the chat: model picker, download, saved chats, confirmations, code view."""
