from kogcli import entry_point

entry_point()
