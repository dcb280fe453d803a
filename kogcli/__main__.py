from kogcli.main import run

run()
