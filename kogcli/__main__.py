from kogcli import main

main()
