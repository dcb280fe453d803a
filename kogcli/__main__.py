from kogcli.main import app

app(prog_name="kog")
